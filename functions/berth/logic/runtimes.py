"""The run-time history the scheduler's predictor learns from (``berth.scheduler.predictor``).

When a job completes, the run of its final attempt is observed into its tenant's history
(``RuntimeHistory``: per tenant, per job family = the spec's name, per GPU model and count, plus the
calibration of the user's ``expected_duration_minutes``). Each pass reads the histories of the
tenants with jobs into one ``RuntimePredictor``: the burst wait, spot, cost and packing decisions
read quantiles of it instead of the timeout. ``berth sim`` replays the same predictor, learning from
the same events, as the service's knowledge.

Only completed runs teach it (a failed or canceled run says little about how long the job takes);
a run cut by a checkpoint restart counts from its last start. The history is advisory: losing an
observation (the store down when a job completes) costs nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from berth.domain.errors import Conflict, StoreUnavailable
from berth.domain.job import Job
from berth.domain.ports import RuntimeHistory
from berth.scheduler.predictor import RuntimePredictor

#: Keys kept per tenant (about 100 bytes each, under DynamoDB's 400 KB item limit): past it, new job
#: families are no longer added, the tenant's own level still learns.
MAX_LEVELS = 2000


@dataclass(frozen=True, slots=True)
class RunObservation:
    tenant: str
    family: str
    gpu_type: str
    gpus: int
    actual_s: float
    estimate_s: float | None


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


def observed(
    document: dict[str, Any] | None, run: RunObservation, max_levels: int = MAX_LEVELS
) -> dict[str, Any]:
    """The tenant's history document with ``run`` learnt (the pure update both stores apply)."""
    predictor = RuntimePredictor.from_dict(document or {})
    before = set(predictor.levels)
    predictor.observe(run.tenant, run.family, run.gpu_type, run.gpus, run.actual_s, run.estimate_s)
    if len(predictor.levels) > max_levels:
        for key in set(predictor.levels) - before:
            if len(key) > 1:
                del predictor.levels[key]
    return predictor.to_dict()


def record_completed_run(history: RuntimeHistory | None, job: Job, now: datetime) -> bool:
    """Observe the job's run; False when it could not be recorded (nothing else depends on it)."""
    run = completed_run(job, now)
    if history is None or run is None:
        return False
    try:
        history.update(run.tenant, lambda doc: observed(doc, run))
    except (StoreUnavailable, Conflict):
        return False
    return True


def predictor_for(history: RuntimeHistory, tenants: Iterable[str]) -> RuntimePredictor:
    """One predictor over these tenants' histories (each tenant's keys start with its name)."""
    merged = RuntimePredictor()
    for tenant, document in sorted(history.read(tenants).items()):
        one = RuntimePredictor.from_dict(document)
        merged.levels.update({k: v for k, v in one.levels.items() if k and k[0] == tenant})
        if tenant in one.calibration:
            merged.calibration[tenant] = one.calibration[tenant]
        merged.observed += one.observed
    return merged
