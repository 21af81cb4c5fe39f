"""What a scheduling pass returns: placements, preemptions, repatriations and reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from berth.domain.placement import CloudPlacement, HostGpus, OnPremPlacement, Site

if TYPE_CHECKING:
    from berth.scheduler.forecast import QueueForecast
    from berth.scheduler.outcomes import JobOutcome


@dataclass(slots=True, frozen=True)
class OnPremAssignment:
    """Run ``job_id`` on these hosts of one pool: ((host_id, gpus), ...)."""

    job_id: str
    tenant: str
    pool: str
    gpu_type: str
    hosts: tuple[tuple[str, int], ...]
    cpu: float
    memory_gib: float
    borrowed: bool = False
    site: Site = Site.ONPREM
    data_cached_on: tuple[str, ...] = ()
    """Those of its hosts whose object cache holds the job's data (data locality)."""

    def record(self) -> OnPremPlacement:
        """The placement as the job stores it and the API returns it."""
        return OnPremPlacement(
            pool=self.pool,
            gpu_type=self.gpu_type,
            hosts=tuple(HostGpus(host_id=h, gpus=g) for h, g in self.hosts),
        )


@dataclass(slots=True, frozen=True)
class CloudAssignment:
    """Run ``job_id`` on ``instances`` instances of one offer."""

    job_id: str
    tenant: str
    region: str
    zone: str
    queue: str
    instance_type: str
    instances: int
    gpu_type: str
    spot: bool
    hourly_usd: float
    """What this job costs per hour: the whole price of its own instances, or its GPU share of a
    shared instance."""
    site: Site = Site.CLOUD
    instance_id: str | None = None
    """A shared instance: one of ``Snapshot.instances`` to join, or a new one (``launch``) that
    other assignments of the same pass may name too."""
    launch: bool = False
    instance_hourly_usd: float = 0.0
    """The shared instance's whole price per hour (set with ``instance_id``)."""

    def record(self) -> CloudPlacement:
        """The placement as the job stores it and the API returns it."""
        return CloudPlacement(
            region=self.region,
            zone=self.zone,
            queue=self.queue,
            instance_type=self.instance_type,
            instances=self.instances,
            gpu_type=self.gpu_type,
            spot=self.spot,
            hourly_usd=self.hourly_usd,
        )


Assignment = OnPremAssignment | CloudAssignment


@dataclass(slots=True, frozen=True)
class Preemption:
    """Stop ``job_id`` (it goes back to the queue) so that ``for_job`` can run; with rule
    ``repatriation.consolidate`` ``for_job`` is the job itself, freeing a larger instance it held
    alone so that it restarts somewhere cheaper."""

    job_id: str
    tenant: str
    for_job: str
    rule: str
    lost_progress_s: float


@dataclass(slots=True, frozen=True)
class Repatriation:
    """Move a checkpointing cloud job back on-prem: stop it in the cloud, restart it at ``to``."""

    job_id: str
    tenant: str
    from_region: str
    to: OnPremAssignment
    saving_usd: float
    lost_progress_s: float


@dataclass(slots=True)
class Decisions:
    placements: list[Assignment] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    repatriations: list[Repatriation] = field(default_factory=list)
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    """Every pending job of the snapshot: where it went, or what it tried and why it stopped."""
    shares: dict[str, float] = field(default_factory=dict)
    """Each tenant's weighted dominant share at the end of the pass."""
    wake_at: float | None = None
    """The earliest time a pending job's eligibility changes by the clock alone (run a pass then)."""
    queue: dict[str, QueueForecast] = field(default_factory=dict)
    """With ``schedule(..., forecast=True)``: every job left waiting, in the pass's order, with its
    position in its tenant's queue and an estimated start."""

    @property
    def reasons(self) -> dict[str, str]:
        """Every job left pending, with a human reason rendered from its outcome (jobs that share
        an outcome share the string)."""
        rendered: dict[int, str] = {}
        out: dict[str, str] = {}
        for job_id, o in self.outcomes.items():
            if o.placed is None:
                text = rendered.get(id(o))
                if text is None:
                    text = rendered[id(o)] = o.reason()
                out[job_id] = text
        return out

    @property
    def decided(self) -> int:
        return len(self.outcomes)
