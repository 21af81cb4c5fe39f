"""Why a job is where it is: every candidate site, the rule or shortage excluding it, and the
job's position in fair share. Backs ``berth explain`` / ``GET /v1/jobs/{id}/explain``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from berth.scheduler.circuit import CircuitState
from berth.scheduler.core import SchedulingPass
from berth.scheduler.decisions import CloudAssignment, OnPremAssignment
from berth.scheduler.eligibility import (
    Exclusion,
    budget_exclusion,
    burst_eligible_at,
    cloud_job_exclusion,
    onprem_job_exclusion,
    pool_exclusion,
    price_offer,
)
from berth.scheduler.placement_onprem import OnPremIndex
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.snapshot import Snapshot


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
    candidates: list[CandidateSite] = field(default_factory=list)
    preempts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain_job(snapshot: Snapshot, policy: SchedulingPolicy, now: float, job_id: str) -> JobExplanation:
    """Replay the pass and explain ``job_id`` (a pending job of ``snapshot``). KeyError if absent."""
    job = next((j for j in snapshot.pending if j.job_id == job_id), None)
    if job is None:
        raise KeyError(job_id)
    before = OnPremIndex(snapshot.hosts)
    p = SchedulingPass(snapshot, policy, now)
    decisions = p.run()
    outcome_a = p.outcome.get(job_id)
    ranked = sorted(decisions.shares.items(), key=lambda kv: (kv[1], kv[0]))
    rank = next((i + 1 for i, (t, _) in enumerate(ranked) if t == job.tenant), len(ranked) + 1)
    share = decisions.shares.get(job.tenant, 0.0)
    tenant = snapshot.tenant(job.tenant)
    residency = policy.residency_for(job.tenant, job.datasets)
    candidates: list[CandidateSite] = []

    # On-prem: one row per (pool, model) the job could use.
    oex = onprem_job_exclusion(job, policy)
    pools_seen = sorted({(h.pool, h.gpu_type) for h in snapshot.hosts})
    accepted = policy.accepted_gpus(job.gpu_type)
    for pool, model in pools_seen:
        site = f"onprem:{pool}/{model}"
        chosen = (
            isinstance(outcome_a, OnPremAssignment) and outcome_a.pool == pool and outcome_a.gpu_type == model
        )
        ex: Exclusion | None = oex
        if ex is None and model not in accepted:
            ex = Exclusion("gpu_type", f"{model} hosts; the job needs {' or '.join(accepted)}")
        if ex is None:
            ex = pool_exclusion(pool, residency)
        if ex is None:
            limit = tenant.onprem_limit(model)
            used = sum(
                r.gpus
                for r in snapshot.running
                if r.site == "onprem" and r.tenant == job.tenant and r.gpu_type == model
            )
            if limit is not None and used + job.gpus > limit:
                ex = Exclusion(
                    "tenant.quota", f"tenant uses {used} of its {limit} {model} GPUs; needs {job.gpus}"
                )
        if ex is None and not chosen:
            fits = before.find(
                (model,), job.gpus_per_node, job.nodes, job.cpu, job.memory_gib, (pool,), job.avoid_hosts
            )
            if fits is None:
                block = before.largest_block(model, pool)
                ex = Exclusion(
                    "capacity",
                    f"no room: needs {job.nodes} x {job.gpus_per_node} GPUs, "
                    f"largest free block is {block} GPUs",
                )
            else:
                ex = Exclusion(
                    "fair-share", "free capacity went to jobs ahead of it in fair-share order this pass"
                )
        if chosen:
            candidates.append(CandidateSite(site, True, None, "placed here", 0.0, True))
        else:
            assert ex is not None
            candidates.append(CandidateSite(site, False, ex.rule, ex.message))

    # Cloud: one row per offer.
    cex = cloud_job_exclusion(job, policy, residency)
    eligible_at = burst_eligible_at(job, policy, p._cheapest_per_gpu_hour(job, residency))
    for offer in snapshot.offers:
        site = f"cloud:{offer.region}/{offer.instance_type}/{offer.zone}"
        if cex is not None:
            candidates.append(CandidateSite(site, False, cex.rule, cex.message))
            continue
        priced = price_offer(job, offer, policy, residency)
        if isinstance(priced, Exclusion):
            candidates.append(CandidateSite(site, False, priced.rule, priced.message))
            continue
        chosen = (
            isinstance(outcome_a, CloudAssignment)
            and outcome_a.zone == offer.zone
            and outcome_a.instance_type == offer.instance_type
        )
        state = p.circuits.state(offer.region, offer.instance_type)
        ex2: Exclusion | None = None
        if state is CircuitState.OPEN:
            ex2 = Exclusion(
                "circuit",
                f"circuit open: recent capacity/API errors for {offer.instance_type} in {offer.region}",
            )
        elif now < eligible_at:
            ex2 = Exclusion("policy.burst", f"waits for on-prem until {eligible_at - now:.0f} s from now")
        else:
            ex2 = budget_exclusion(job, tenant, priced.hourly_usd, 0.0)
        if chosen:
            candidates.append(CandidateSite(site, True, None, "placed here", priced.hourly_usd, True))
        elif ex2 is not None:
            candidates.append(CandidateSite(site, False, ex2.rule, ex2.message, priced.hourly_usd))
        else:
            candidates.append(
                CandidateSite(
                    site,
                    True,
                    None,
                    f"eligible at {priced.hourly_usd:.2f} USD/h "
                    f"({'spot' if priced.spot else 'on-demand'}, circuit {state})",
                    priced.hourly_usd,
                )
            )

    if isinstance(outcome_a, OnPremAssignment):
        outcome = "onprem"
        summary = f"placed on-prem in pool {outcome_a.pool} on {', '.join(h for h, _ in outcome_a.hosts)}"
    elif isinstance(outcome_a, CloudAssignment):
        outcome = "cloud"
        summary = (
            f"placed in {outcome_a.region} on {outcome_a.instances} x {outcome_a.instance_type} "
            f"({'spot' if outcome_a.spot else 'on-demand'}, {outcome_a.hourly_usd:.2f} USD/h)"
        )
    else:
        outcome = "pending"
        summary = decisions.reasons.get(job_id, "pending")
    preempts = [pr.job_id for pr in decisions.preemptions if pr.for_job == job_id]
    return JobExplanation(
        job_id=job_id,
        tenant=job.tenant,
        outcome=outcome,
        summary=summary,
        fair_share=share,
        fair_share_rank=rank,
        tenants=len(ranked),
        candidates=candidates,
        preempts=preempts,
    )
