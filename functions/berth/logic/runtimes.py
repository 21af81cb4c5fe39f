"""The run-time history the scheduler's predictor learns from (``berth.scheduler.predictor``).

When a job completes, the run of its final attempt (``berth.domain.run_observation``) is written on
the COMPLETED event's row, in the job's own transaction; the job-events stream's consumer (the
notifier) learns a batch's runs into their tenants' histories, one update per tenant per batch
(``learn``; ``RuntimeHistory``: per tenant, per job family = the spec's name, per GPU model and count,
plus the calibration of the user's ``expected_duration_minutes``). Each pass reads the histories of
the tenants with jobs into one ``RuntimePredictor``: the burst wait, spot, cost and packing decisions
read quantiles of it instead of the timeout. ``berth sim`` replays the same predictor, learning from
the same events, as the service's knowledge.

Only completed runs teach it (a failed or canceled run says little about how long the job takes);
a run cut by a checkpoint restart counts from its last start. The history is advisory: losing an
observation (the store down when the batch is learnt) costs nothing else, and the stream's
at-least-once delivery may learn a run twice (a batch retried after it was learnt).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from berth.domain.errors import Conflict, StoreUnavailable
from berth.domain.ports import RuntimeHistory
from berth.domain.run_observation import RunObservation
from berth.scheduler.predictor import RuntimePredictor

#: Keys kept per tenant (about 100 bytes each, under DynamoDB's 400 KB item limit): past it, new job
#: families are no longer added, the tenant's own level still learns.
MAX_LEVELS = 2000


def observed(
    document: dict[str, Any] | None, run: RunObservation, max_levels: int = MAX_LEVELS
) -> dict[str, Any]:
    """The tenant's history document with ``run`` learnt."""
    return observed_all(document, [run], max_levels)


def observed_all(
    document: dict[str, Any] | None, runs: Iterable[RunObservation], max_levels: int = MAX_LEVELS
) -> dict[str, Any]:
    """The tenant's history document with ``runs`` learnt in order (the pure update both stores
    apply): past ``max_levels`` keys, a run's new keys other than the tenant's own are not kept."""
    predictor = RuntimePredictor.from_dict(document or {})
    for run in runs:
        before = set(predictor.levels)
        predictor.observe(run.tenant, run.family, run.gpu_type, run.gpus, run.actual_s, run.estimate_s)
        if len(predictor.levels) > max_levels:
            for key in set(predictor.levels) - before:
                if len(key) > 1:
                    del predictor.levels[key]
    return predictor.to_dict()


@dataclass(frozen=True, slots=True)
class Learnt:
    """What ``learn`` did: the runs learnt, and the tenants whose history could not be written
    (their runs of this batch are lost: the history is advisory)."""

    runs: int = 0
    failed: tuple[str, ...] = ()


def learn(history: RuntimeHistory, runs: Iterable[RunObservation]) -> Learnt:
    """Learn a batch of completed runs: ONE history update per tenant, applying all of that tenant's
    runs in the batch's order. A tenant whose store is unavailable (or keeps changing) is skipped;
    the others are still learnt."""
    by_tenant: dict[str, list[RunObservation]] = defaultdict(list)
    for run in runs:
        by_tenant[run.tenant].append(run)
    learnt, failed = 0, []
    for tenant, theirs in by_tenant.items():
        try:
            history.update(tenant, partial(observed_all, runs=theirs))
        except (StoreUnavailable, Conflict):
            failed.append(tenant)
            continue
        learnt += len(theirs)
    return Learnt(runs=learnt, failed=tuple(failed))


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
