"""What the simulator tracks per job and per run."""

from __future__ import annotations

from dataclasses import dataclass, field

from berth.domain.placement import Site
from berth_tools.sim.trace import TraceJob


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    nodes: int
    cpu: float
    memory_gib: float
    progress_s: float = 0.0
    first_start_s: float | None = None
    end_s: float | None = None
    epoch: int = 0
    site: Site | None = None
    placed_at: float = 0.0
    work_start: float = 0.0
    hosts: tuple[tuple[str, int], ...] = ()
    hourly_usd: float = 0.0
    cost_usd: float = 0.0
    onprem_gpu_s: float = 0.0
    cloud_gpu_s: float = 0.0
    preemptions: int = 0
    interruptions: int = 0
    repatriations: int = 0
    attempts: int = 0
    instance: str | None = None
    estimate_s: float | None = None
    """The user's estimate of the whole run time (None: the user gave none)."""
    predicted_s: float | None = None
    """The scheduler's median prediction at submission (for the predictor's error)."""

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.trace.duration_s - self.progress_s)


@dataclass(slots=True)
class SimState:
    jobs: dict[str, SimJob]
    onprem_gpus: int
    span_end_s: float = 0.0
    passes: int = 0
    preemptions: int = 0
    interruptions: int = 0
    repatriations: int = 0
    circuit_failures: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    instances_launched: int = 0
    free_rides: int = 0
    idle_instance_usd: float = 0.0
    max_instance_gpus_used: int = 0
    predictions: list[tuple[float, float]] = field(default_factory=list)
    """(predicted median at submission, actual run time) of every finished job."""
