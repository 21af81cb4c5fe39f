"""What a completed job teaches the scheduler's run-time predictor (``berth.logic.runtimes``): its
tenant, its family (the spec's name), its GPU model and count, how long its final attempt ran and
the user's estimate. The COMPLETED transition's event row carries it (written in the job's own
transaction), and the job-events stream's consumer learns it into the tenant's history."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from berth.domain.job import Job, JobEvent
from berth.domain.status import JobStatus


@dataclass(frozen=True, slots=True)
class RunObservation:
    tenant: str
    family: str
    gpu_type: str
    gpus: int
    actual_s: float
    estimate_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunObservation:
        """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed document."""
        estimate = data.get("estimate_s")
        return cls(
            tenant=str(data["tenant"]),
            family=str(data["family"]),
            gpu_type=str(data["gpu_type"]),
            gpus=int(data["gpus"]),
            actual_s=float(data["actual_s"]),
            estimate_s=None if estimate is None else float(estimate),
        )


def completed_run(job: Job, now: datetime) -> RunObservation | None:
    """What a job completing ``now`` teaches the predictor (None: its attempt never started)."""
    started = job.run.attempt.started_at
    if started is None:
        return None
    spec = job.spec
    estimate = spec.expected_duration_minutes
    return RunObservation(
        tenant=job.tenant,
        family=spec.name,
        gpu_type=spec.resources.gpu_type,
        gpus=spec.resources.gpus,
        actual_s=max(0.0, (now - started).total_seconds()),
        estimate_s=None if estimate is None else estimate * 60.0,
    )


def observation_of(job: Job, event: JobEvent) -> RunObservation | None:
    """The run the event's row carries: that of a move to COMPLETED (``job`` is the completed
    version), None for every other event. Only completed runs teach the predictor (a failed or
    canceled run says little about how long the job takes); a run cut by a checkpoint restart counts
    from its last start."""
    if event.to is not JobStatus.COMPLETED or event.from_ is JobStatus.COMPLETED:
        return None
    return completed_run(job, event.at)
