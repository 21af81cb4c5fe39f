"""Why a job is where it is, rendered from the pass's own outcome for it (never re-derived):
its outcome and steps, every candidate site with the rule that kept the job off it (or its price
when eligible), and its position in fair share. Backs ``berth explain`` / ``GET /v1/jobs/{id}/explain``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from berth.domain.placement import Site
from berth.scheduler.cloud_step import cloud_candidates
from berth.scheduler.core import SchedulingPass
from berth.scheduler.decisions import CloudAssignment, OnPremAssignment
from berth.scheduler.eligibility import cloud_job_exclusion, onprem_job_exclusion, pool_exclusion
from berth.scheduler.forecast import forecast_queue
from berth.scheduler.outcomes import Exclusion, JobOutcome, Rule
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.snapshot import PendingJob, Snapshot


@dataclass(slots=True, frozen=True)
class CandidateSite:
    site: str
    """``onprem:<pool>/<model>`` or ``cloud:<region>/<instance type>/<zone>``."""
    eligible: bool
    rule: str | None
    message: str
    hourly_usd: float | None = None
    chosen: bool = False


@dataclass(slots=True)
class JobExplanation:
    job_id: str
    tenant: str
    outcome: str
    """``onprem``, ``cloud`` or ``pending``."""
    summary: str
    fair_share: float
    fair_share_rank: int
    tenants: int
    rules: list[str] = field(default_factory=list)
    """The pass's rule ids for this job, in the order it met them."""
    candidates: list[CandidateSite] = field(default_factory=list)
    preempts: list[str] = field(default_factory=list)
    not_considered: int = 0
    """Queued jobs this pass did not read (every tenant's; ``Snapshot.unread``): the core decided
    without them."""
    tenant_not_considered: int = 0
    """Of those, the job's own tenant's (queued behind the head the pass read)."""
    queue_position: int | None = None
    """A waiting job's 1-based place in its tenant's queue in this pass (``forecast.py``)."""
    estimated_start: float | None = None
    """An estimate (epoch seconds) of when it starts, None when none can be made."""
    estimate_basis: str | None = None
    """``onprem`` (capacity predicted free) or ``burst`` (its burst wait ends)."""
    data_cached_on: list[str] = field(default_factory=list)
    """Healthy hosts whose object cache holds the job's data (the pass prefers them when free)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain_job(snapshot: Snapshot, policy: SchedulingPolicy, now: float, job_id: str) -> JobExplanation:
    """Run the pass and explain ``job_id`` (a pending job of ``snapshot``). KeyError if absent."""
    job = next((j for j in snapshot.pending if j.job_id == job_id), None)
    if job is None:
        raise KeyError(job_id)
    p = SchedulingPass(snapshot, policy, now)
    decisions = p.run()
    place = forecast_queue(p.ctx).get(job_id) if decisions.outcomes[job_id].placed is None else None
    outcome = decisions.outcomes[job_id]
    ranked = sorted(decisions.shares.items(), key=lambda kv: (kv[1], kv[0]))
    rank = next((i + 1 for i, (t, _) in enumerate(ranked) if t == job.tenant), len(ranked) + 1)
    candidates = _onprem_rows(p, job, outcome) + _cloud_rows(p, job, outcome)
    placed = outcome.placed
    if isinstance(placed, OnPremAssignment):
        kind, summary = (
            "onprem",
            f"placed on-prem in pool {placed.pool} on {', '.join(h for h, _ in placed.hosts)}",
        )
    elif isinstance(placed, CloudAssignment):
        kind = "cloud"
        summary = (
            f"placed in {placed.region} on {placed.instances} x {placed.instance_type} "
            f"({'spot' if placed.spot else 'on-demand'}, {placed.hourly_usd:.2f} USD/h)"
        )
    else:
        kind, summary = "pending", outcome.reason()
    holders = list(p.ctx.index.holding(job.datasets)) if job.datasets else []
    summary += _locality_note(placed, holders, p.ctx.policy.data_locality != "off")
    return JobExplanation(
        job_id=job_id,
        tenant=job.tenant,
        outcome=kind,
        summary=summary,
        fair_share=decisions.shares.get(job.tenant, 0.0),
        fair_share_rank=rank,
        tenants=len(ranked),
        rules=[str(r) for r in outcome.rules],
        candidates=candidates,
        preempts=[pr.job_id for pr in decisions.preemptions if pr.for_job == job_id],
        not_considered=sum(snapshot.unread.values()),
        tenant_not_considered=snapshot.unread.get(job.tenant, 0),
        queue_position=None if place is None else place.position,
        estimated_start=None if place is None else place.estimated_start,
        estimate_basis=None if place is None else place.basis,
        data_cached_on=holders,
    )


def _locality_note(placed: object, holders: list[str], enabled: bool) -> str:
    """A clause on data locality for the summary ("" when no host caches the job's data)."""
    if not holders:
        return ""
    names = ", ".join(holders[:5]) + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
    if isinstance(placed, OnPremAssignment) and placed.data_cached_on:
        there = ", ".join(placed.data_cached_on)
        return f"; its data is cached there ({there}): its objects are not downloaded again"
    if not enabled:
        return f"; its data is cached on {names} (data locality is off in this policy)"
    if isinstance(placed, OnPremAssignment | CloudAssignment):
        return f"; its data is cached on {names}, which had no room: it did not wait for them"
    return f"; its data is cached on {names} (preferred when they have room; it never waits for them)"


def not_considered(snapshot: Snapshot, tenant: str) -> dict[str, Any] | None:
    """Why a queued job of ``tenant`` is absent from the pass (None: it is not for that reason): the
    pass read only the head of its tenant's queue, or did not reach the tenant this time."""
    mine = snapshot.unread.get(tenant, 0)
    if mine <= 0:
        return None
    total = sum(snapshot.unread.values())
    read = sum(1 for j in snapshot.pending if j.tenant == tenant)
    where = (
        f"behind the first {read} of its team's queue that the pass read"
        if read
        else "its team's queue was not reached this pass (read round-robin)"
    )
    return {
        "summary": f"not considered this pass: {where}; {mine} of its team's and {total} queued jobs "
        "in all were not considered",
        "not_considered": total,
        "tenant_not_considered": mine,
        "tenant_read": read,
    }


def _onprem_rows(p: SchedulingPass, job: PendingJob, outcome: JobOutcome) -> list[CandidateSite]:
    ctx = p.ctx
    placed = outcome.placed
    step = outcome.step(Site.ONPREM)
    residency = ctx.residency(job)
    accepted = ctx.accepted(job.gpu_type)
    oex = onprem_job_exclusion(job, ctx.policy)
    rows = []
    for pool, model in sorted({(h.pool, h.gpu_type) for h in ctx.snapshot.hosts}):
        site = f"onprem:{pool}/{model}"
        if isinstance(placed, OnPremAssignment) and (placed.pool, placed.gpu_type) == (pool, model):
            rows.append(CandidateSite(site, True, None, "placed here", 0.0, True))
            continue
        ex: Exclusion | None = oex
        if ex is None and model not in accepted:
            ex = Exclusion(Rule.GPU_TYPE, f"{model} hosts; the job needs {' or '.join(accepted)}")
        ex = ex or pool_exclusion(pool, residency)
        if ex is not None:
            rows.append(CandidateSite(site, False, str(ex.rule), ex.message))
        elif step is not None:
            rows.append(CandidateSite(site, False, str(step.rule), step.detail))
        else:
            rows.append(CandidateSite(site, True, None, "eligible; the pass placed the job elsewhere"))
    return rows


def _cloud_rows(p: SchedulingPass, job: PendingJob, outcome: JobOutcome) -> list[CandidateSite]:
    ctx = p.ctx
    placed = outcome.placed
    step = outcome.step(Site.CLOUD)
    residency = ctx.residency(job)
    cex = cloud_job_exclusion(job, ctx.policy, residency)
    rows: list[CandidateSite] = []
    ok, out, _ = cloud_candidates(ctx, job, residency) if cex is None else ([], (), "")
    excluded = {id(o): ex for o, ex in out}
    priced = {id(po.offer): po for po, _ in ok}
    for offer in ctx.snapshot.offers:
        site = f"cloud:{offer.region}/{offer.instance_type}/{offer.zone}"
        if isinstance(placed, CloudAssignment) and (placed.zone, placed.instance_type) == (
            offer.zone,
            offer.instance_type,
        ):
            rows.append(CandidateSite(site, True, None, "placed here", placed.hourly_usd, True))
            continue
        ex = cex or excluded.get(id(offer))
        po = priced.get(id(offer))
        if ex is not None:
            rows.append(CandidateSite(site, False, str(ex.rule), ex.message))
        elif po is None:
            rows.append(
                CandidateSite(
                    site, False, str(Rule.GPU_TYPE), f"offers {offer.gpu_type}; the job needs {job.gpu_type}"
                )
            )
        elif step is not None:
            rows.append(CandidateSite(site, False, str(step.rule), step.detail, po.hourly_usd))
        else:
            what = "spot" if po.spot else "on-demand"
            rows.append(
                CandidateSite(
                    site, True, None, f"eligible at {po.hourly_usd:.2f} USD/h ({what})", po.hourly_usd
                )
            )
    return rows
