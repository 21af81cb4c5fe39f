"""The preemption step: when on-prem has no room, stop jobs a rule allows (reclaim of borrowed
capacity for a tenant below its guarantee; its own lower-priority jobs) that lose the least."""

from __future__ import annotations

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


def preempt_for(
    ctx: PassContext,
    job: PendingJob,
    tenant: TenantState,
    models: tuple[str, ...],
    pools: frozenset[str] | None,
) -> tuple[str, str, tuple[str, ...]] | None:
    rule = ctx.policy.preemption
    if ctx.preempt_budget <= 0 or not ctx.policy.use_onprem:
        return None
    now = ctx.now
    kinds: list[tuple[str, tuple[str, ...]]] = []
    job_rank = RANK[job.priority]
    if rule.reclaim and ctx.any_borrowed:
        own = tuple(
            m
            for m in models
            if ctx.onprem_used.get((job.tenant, m), 0) + job.gpus <= tenant.guaranteed_gpus.get(m, 0)
        )
        if own:
            kinds.append(("reclaim", own))
    if rule.priority and ctx.lowest_rank.get(job.tenant, 99) < job_rank:
        kinds.append(("priority", models))
    for kind, kind_models in kinds:
        memo = (
            kind,
            job.tenant if kind == "priority" else "",
            job.priority.rank,
            kind_models,
            job.gpus_per_node,
            job.nodes,
            job.cpu,
            job.memory_gib,
            pools,
        )
        if memo in ctx.no_victims:
            continue

        def eligible(v: RunningJob, kind: str = kind) -> bool:
            if v.job_id in ctx.preempted or now - v.started_at < rule.min_runtime_s:
                return False
            if kind == "reclaim":
                owner = ctx.tenant(v.tenant)
                return (
                    v.borrowed
                    and v.tenant != job.tenant
                    and ctx.onprem_used.get((v.tenant, v.gpu_type), 0)
                    > owner.guaranteed_gpus.get(v.gpu_type, 0)
                )
            return v.tenant == job.tenant and RANK[v.priority] < job_rank

        if ctx.victims_on_host is None:
            ctx.victims_on_host = _victim_index(ctx)
        victims = find_victims(
            ctx.index,
            ctx.victims_on_host,
            eligible,
            kind_models,
            job.gpus_per_node,
            job.nodes,
            job.cpu,
            job.memory_gib,
            pools,
            ctx.preempt_budget,
            now,
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
                    lost_progress_s=v.lost_progress_s(now),
                )
            )
        ctx.preempt_budget -= len(victims)
        ctx.no_fit.clear()
        fit = ctx.index.find(
            kind_models, job.gpus_per_node, job.nodes, job.cpu, job.memory_gib, pools, job.avoid_hosts
        )
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
