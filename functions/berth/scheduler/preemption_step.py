"""The preemption step: when on-prem has no room, stop jobs a rule allows (reclaim of borrowed
capacity for a tenant below its guarantee; its own lower-priority jobs) that lose the least."""

from __future__ import annotations

from collections.abc import Callable

from berth.domain.placement import Site
from berth.scheduler.context import RANK, PassContext
from berth.scheduler.decisions import Preemption
from berth.scheduler.fairshare import resource_amounts
from berth.scheduler.preemption import find_victims
from berth.scheduler.snapshot import PendingJob, RunningJob, TenantState


def _victim_index(ctx: PassContext) -> dict[str, list[RunningJob]]:
    on_host: dict[str, list[RunningJob]] = {}
    for r in ctx.snapshot.running:
        if r.site == Site.ONPREM:
            for hid, _ in r.hosts:
                on_host.setdefault(hid, []).append(r)
    return on_host


def _kinds(
    ctx: PassContext, job: PendingJob, tenant: TenantState, models: tuple[str, ...]
) -> list[tuple[str, tuple[str, ...]]]:
    """The preemption rules that may apply to this job, with the models each allows."""
    rule = ctx.policy.preemption
    kinds: list[tuple[str, tuple[str, ...]]] = []
    if rule.reclaim and ctx.any_borrowed:
        own = tuple(
            m
            for m in models
            if ctx.onprem_used.get((job.tenant, m), 0) + job.gpus <= tenant.guaranteed_gpus.get(m, 0)
        )
        if own:
            kinds.append(("reclaim", own))
    if rule.priority and ctx.lowest_rank.get(job.tenant, 99) < RANK[job.priority]:
        kinds.append(("priority", models))
    return kinds


def _eligible(ctx: PassContext, job: PendingJob, kind: str) -> Callable[[RunningJob], bool]:
    """Who may be stopped for ``job`` under rule ``kind``: reclaim takes other tenants' borrowed
    jobs while their owner is above its guarantee; priority takes the tenant's own lower-priority
    jobs. Never a job younger than ``min_runtime_s`` (no thrashing)."""
    now, min_runtime = ctx.now, ctx.policy.preemption.min_runtime_s
    job_rank = RANK[job.priority]

    def eligible(v: RunningJob) -> bool:
        if v.job_id in ctx.preempted or now - v.started_at < min_runtime:
            return False
        if kind == "reclaim":
            owner = ctx.tenant(v.tenant)
            return (
                v.borrowed
                and v.tenant != job.tenant
                and ctx.onprem_used.get((v.tenant, v.gpu_type), 0) > owner.guaranteed_gpus.get(v.gpu_type, 0)
            )
        return v.tenant == job.tenant and RANK[v.priority] < job_rank

    return eligible


def preempt_for(
    ctx: PassContext,
    job: PendingJob,
    tenant: TenantState,
    models: tuple[str, ...],
    pools: frozenset[str] | None,
) -> tuple[str, str, tuple[str, ...]] | None:
    """Stop the cheapest victims a rule allows so that the job fits; its fit, or None."""
    if ctx.preempt_budget <= 0 or not ctx.policy.use_onprem:
        return None
    for kind, kind_models in _kinds(ctx, job, tenant, models):
        shape = (kind_models, job.gpus_per_node, job.nodes, job.cpu, job.memory_gib, pools)
        memo = (kind, job.tenant if kind == "priority" else "", job.priority.rank, *shape)
        if memo in ctx.no_victims:
            continue
        if ctx.victims_on_host is None:
            ctx.victims_on_host = _victim_index(ctx)
        victims = find_victims(
            ctx.index, ctx.victims_on_host, _eligible(ctx, job, kind), *shape, ctx.preempt_budget, ctx.now
        )
        if victims is None:
            ctx.no_victims.add(memo)
            continue
        for v in victims:
            stop(ctx, v)
            ctx.decisions.preemptions.append(
                Preemption(
                    job_id=v.job_id,
                    tenant=v.tenant,
                    for_job=job.job_id,
                    rule=f"policy.preemption.{kind}",
                    lost_progress_s=v.lost_progress_s(ctx.now),
                )
            )
        ctx.preempt_budget -= len(victims)
        ctx.no_fit.clear()
        fit = ctx.index.find(*shape, job.avoid_hosts)
        if fit is not None:
            return fit
    return None


def stop(ctx: PassContext, v: RunningJob) -> None:
    """Release a running job's on-prem capacity within this pass."""
    ctx.preempted.add(v.job_id)
    nodes = max(1, len(v.hosts))
    ctx.index.release(v.hosts, v.cpu, v.memory_gib)
    key = (v.tenant, v.gpu_type)
    ctx.onprem_used[key] = ctx.onprem_used.get(key, 0) - v.gpus
    ctx.fair.remove(v.tenant, resource_amounts(v.gpu_type, v.gpus, v.cpu * nodes, v.memory_gib * nodes))
