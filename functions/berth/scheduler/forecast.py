"""Where each job the pass left waiting stands: its place in its team's queue and an estimate of when
it starts. Pure; read from the pass's own ledger after it ran, never re-decided.

- **Position.** The pass's outcomes are recorded in the order it served the jobs (``ordering``: within
  a tenant by priority then submit time, or longest first; FIFO by submit time), so a job's position
  is its 1-based rank among its tenant's jobs left waiting, in that order (1: the next the tenant's
  share will go to).
- **Estimated start** (an estimate, never a promise), the earlier of:
  - ``onprem``: for a job that waits for on-prem capacity (its on-prem step is ``capacity``), the time
    at which the on-prem jobs of its GPU model, by predicted end (the run-time predictor's median,
    ``ESTIMATE_Q``: an estimate for people, where the burst decision reads the more careful
    ``runtime.wait_q``; the jobs this pass placed included), have freed enough GPUs for the jobs
    waiting ahead of it in the pass's order plus itself, minus the GPUs free after the pass
    (fragmentation ignored; the rule ``burst.estimate_wait`` uses, ``cloud_step``);
  - ``burst``: when its burst wait ends (its ``policy.burst.wait`` step's ``at``), where the pass has
    any cloud offer or instance at all.
  None when neither applies (a quota, a budget, a constraint keeps it waiting, or no running job's
  end is predictable).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from berth.domain.placement import Site
from berth.scheduler.context import PassContext
from berth.scheduler.decisions import OnPremAssignment
from berth.scheduler.outcomes import Rule

ONPREM = "onprem"
BURST = "burst"
#: The quantile of running jobs' predicted ends an estimated start reads: the median.
ESTIMATE_Q = 0.5


@dataclass(slots=True, frozen=True)
class QueueForecast:
    tenant: str
    position: int
    """1-based, among the tenant's jobs left waiting by this pass, in the order the pass served them."""
    estimated_start: float | None = None
    """Epoch seconds; an estimate (see the module)."""
    basis: str | None = None
    """``onprem`` (capacity predicted free) or ``burst`` (the burst wait ends); None with no estimate."""


def forecast_queue(ctx: PassContext) -> dict[str, QueueForecast]:
    """Every job the pass left waiting, in the pass's order, with its position and estimate."""
    ends = _onprem_ends(ctx)
    free = ctx.index.free_total
    positions: dict[str, int] = {}
    ahead: dict[str, int] = {}
    by_id = {j.job_id: j for j in ctx.snapshot.pending}
    out: dict[str, QueueForecast] = {}
    for job_id, outcome in ctx.outcomes.items():
        if outcome.placed is not None:
            continue
        job = by_id.get(job_id)
        if job is None:
            continue
        position = positions[job.tenant] = positions.get(job.tenant, 0) + 1
        candidates: list[tuple[float, str]] = []
        onprem = outcome.step(Site.ONPREM)
        if onprem is not None and onprem.rule is Rule.CAPACITY:
            model = job.gpu_type
            waiting = ahead.get(model, 0)
            ahead[model] = waiting + job.gpus
            need = waiting + job.gpus - free.get(model, 0)
            times, freed = ends.get(model, ((), ()))
            i = bisect_left(freed, max(1, need))
            if i < len(times):
                candidates.append((max(ctx.now, times[i]), ONPREM))
        cloud = outcome.step(Site.CLOUD)
        if (
            ctx.cloud_possible
            and cloud is not None
            and cloud.rule is Rule.BURST_WAIT
            and cloud.at is not None
        ):
            candidates.append((cloud.at, BURST))
        at, basis = min(candidates) if candidates else (None, None)
        out[job_id] = QueueForecast(job.tenant, position, at, basis)
    return out


def _onprem_ends(ctx: PassContext) -> dict[str, tuple[list[float], list[int]]]:
    """Per GPU model: predicted end times of the on-prem jobs (running, and placed by this pass),
    sorted, with the GPUs freed by then (cumulative)."""
    q = ESTIMATE_Q
    by_model: dict[str, list[tuple[float, int]]] = {}
    stopped = {p.job_id for p in ctx.decisions.preemptions}
    for r in ctx.snapshot.running:
        if r.site != Site.ONPREM or r.job_id in stopped:
            continue
        end = ctx.expected_end(r, q)
        if end is not None:
            by_model.setdefault(r.gpu_type, []).append((end, r.gpus))
    pending = {j.job_id: j for j in ctx.snapshot.pending}
    for a in ctx.decisions.placements:
        job = pending.get(a.job_id)
        if not isinstance(a, OnPremAssignment) or job is None:
            continue
        remaining = ctx.remaining_s(job, q)
        if remaining is not None:
            by_model.setdefault(a.gpu_type, []).append((ctx.now + remaining, job.gpus))
    out: dict[str, tuple[list[float], list[int]]] = {}
    for model, ends in by_model.items():
        ends.sort()
        out[model] = ([t for t, _ in ends], list(accumulate(g for _, g in ends)))
    return out
