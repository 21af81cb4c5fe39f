"""The on-prem step of a pass: quota, residency pools, best-fit gang placement, else preemption."""

from __future__ import annotations

from berth.domain.placement import Site
from berth.scheduler.context import PassContext, ShapeKey
from berth.scheduler.decisions import OnPremAssignment
from berth.scheduler.eligibility import pool_exclusion, quota_exclusion
from berth.scheduler.fairshare import resource_amounts
from berth.scheduler.outcomes import Exclusion, Rule, Step, step_from
from berth.scheduler.policy import ResidencyRule
from berth.scheduler.preemption_step import preempt_for
from berth.scheduler.snapshot import PendingJob, TenantState


def quota_models(
    ctx: PassContext, job: PendingJob, tenant: TenantState
) -> tuple[tuple[str, ...], Exclusion | None]:
    """The accepted models whose on-prem limit the job stays within, and the first that it breaks."""
    ok: list[str] = []
    first: Exclusion | None = None
    for model in ctx.accepted(job.gpu_type):
        ex = quota_exclusion(job, tenant, model, ctx.onprem_used.get((job.tenant, model), 0))
        if ex is not None:
            first = first or ex
            continue
        ok.append(model)
    return tuple(ok), first


def allowed_pools(residency: list[ResidencyRule]) -> frozenset[str] | None:
    allowed: frozenset[str] | None = None
    for rule in residency:
        if rule.pools:
            allowed = frozenset(rule.pools) if allowed is None else allowed & frozenset(rule.pools)
    return allowed


def try_onprem(
    ctx: PassContext, job: PendingJob, tenant: TenantState, residency: list[ResidencyRule]
) -> Step | None:
    """Place ``job`` on-prem (None) or say why not."""
    models, quota_ex = quota_models(ctx, job, tenant)
    if not models:
        return step_from(Site.ONPREM, quota_ex or Exclusion(Rule.GPU_TYPE, "no GPU model allowed"))
    pools = allowed_pools(residency)
    if pools is not None and not any(p in pools for m in models for p in ctx.index.pools(m)):
        ex = pool_exclusion("", residency)
        return step_from(Site.ONPREM, ex or Exclusion(Rule.POOLS, "no allowed pool"))
    gpn = job.gpus_per_node
    key = ShapeKey(models, gpn, job.nodes, job.cpu, job.memory_gib, pools)
    fit = None
    known = ctx.no_fit.get(key)
    if job.avoid_hosts or known is None:
        mode = ctx.policy.data_locality
        prefer = ctx.index.holding(job.datasets) if mode != "off" and job.datasets else ()
        fit = ctx.index.find(
            models, gpn, job.nodes, job.cpu, job.memory_gib, pools, job.avoid_hosts, prefer, mode == "ties"
        )
    if fit is None:
        if known is None and not job.avoid_hosts:
            known = ctx.no_fit[key] = shortage(ctx, key)
        fit = preempt_for(ctx, job, tenant, models, pools)
        if fit is None:
            return known or shortage(ctx, key)
    pool, model, host_ids = fit
    assign_onprem(ctx, job, pool, model, host_ids)
    return None


def shortage(ctx: PassContext, key: ShapeKey) -> Step:
    parts = []
    for m in key.models:
        cap = ctx.index.capacity.get("gpu:" + m, 0)
        if not cap:
            parts.append(f"no healthy {m} hosts")
            continue
        block = max(
            (
                ctx.index.largest_block(m, p)
                for p in ctx.index.pools(m)
                if key.pools is None or p in key.pools
            ),
            default=0,
        )
        gpn, nodes = key.gpus_per_node, key.nodes
        free = ctx.index.free_total.get(m, 0)
        parts.append(f"{_no_room(nodes, gpn, m)} ({free} of {cap:.0f} free, largest free block {block})")
    return Step(Site.ONPREM, Rule.CAPACITY, "; ".join(parts))


def _no_room(nodes: int, gpus_per_node: int, model: str) -> str:
    """``no host with 8 free V100 GPUs``, ``fewer than 2 hosts with 8 free V100 GPUs each``."""
    gpus = f"{gpus_per_node} free {model} GPU{'s' if gpus_per_node != 1 else ''}"
    return f"fewer than {nodes} hosts with {gpus} each" if nodes > 1 else f"no host with {gpus}"


def assign_onprem(
    ctx: PassContext, job: PendingJob, pool: str, model: str, host_ids: tuple[str, ...], record: bool = True
) -> OnPremAssignment:
    gpn = job.gpus_per_node
    ctx.index.allocate(host_ids, gpn, job.cpu, job.memory_gib)
    tenant = ctx.tenant(job.tenant)
    key = (job.tenant, model)
    used = ctx.onprem_used.get(key, 0) + job.gpus
    ctx.onprem_used[key] = used
    a = OnPremAssignment(
        job_id=job.job_id,
        tenant=job.tenant,
        pool=pool,
        gpu_type=model,
        hosts=tuple((h, gpn) for h in host_ids),
        cpu=job.cpu,
        memory_gib=job.memory_gib,
        borrowed=used > tenant.guaranteed_gpus.get(model, 0),
        data_cached_on=cached_on(ctx, job, host_ids),
    )
    if record:
        ctx.decisions.placements.append(a)
        ctx.last_placed = a
    ctx.fair.add(
        job.tenant, resource_amounts(model, job.gpus, job.cpu * job.nodes, job.memory_gib * job.nodes)
    )
    return a


def cached_on(ctx: PassContext, job: PendingJob, host_ids: tuple[str, ...]) -> tuple[str, ...]:
    """The hosts among ``host_ids`` whose cache holds the job's data."""
    if not job.datasets:
        return ()
    holders = set(ctx.index.holding(job.datasets))
    return tuple(h for h in host_ids if h in holders)
