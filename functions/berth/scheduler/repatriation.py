"""Repatriation: move checkpointing cloud jobs back on-prem when capacity no pending job took
would save more than restarting costs. The remaining run time is predicted
(``runtime.repatriate_q``, conditioned on the work done), so a job running past its prediction
is re-scored at every pass."""

from __future__ import annotations

from berth.domain.job_spec import PlacementConstraint
from berth.domain.placement import Site
from berth.scheduler.circuit import CircuitState
from berth.scheduler.context import PassContext
from berth.scheduler.decisions import Preemption, Repatriation
from berth.scheduler.onprem_step import allowed_pools, assign_onprem, quota_models
from berth.scheduler.snapshot import PendingJob, RunningJob


def repatriate(ctx: PassContext) -> None:
    rule = ctx.policy.repatriation
    if not rule.enabled or not ctx.policy.use_onprem or not any(ctx.index.free_total.values()):
        return
    now = ctx.now
    rates = _instance_rates(ctx) if rule.instance_share else {}
    scored: list[tuple[float, str, RunningJob, float]] = []
    for r in ctx.snapshot.running:
        if (
            r.site != Site.CLOUD
            or not r.checkpointing
            or r.placement is PlacementConstraint.CLOUD
            or r.job_id in ctx.preempted
            or r.job_id in ctx.repatriated
        ):
            continue
        end = ctx.expected_end(r, ctx.policy.runtime.repatriate_q)
        if end is None:
            continue
        lost = r.lost_progress_s(now)
        if lost > rule.max_lost_progress_s:
            continue
        hourly = rates.get(r.instance_id, 0.0) * r.gpus if r.instance_id else 0.0
        saving = max(hourly, r.hourly_usd) * (end - now - lost - rule.restart_overhead_s) / 3600.0
        if saving >= rule.min_saving_usd:
            scored.append((-saving, r.job_id, r, lost))
    scored.sort(key=lambda s: (s[0], s[1]))
    moved = len(ctx.repatriated)
    for neg_saving, _, r, lost in scored:
        if moved >= rule.max_per_pass or not any(ctx.index.free_total.values()):
            break
        if _move(ctx, r, -neg_saving, lost):
            moved += 1


CONSOLIDATE = "repatriation.consolidate"
"""The rule of a stop that frees a shared instance a job holds alone (``Preemption.rule``)."""


def consolidate(ctx: PassContext) -> None:
    """``repatriation.consolidate``: a checkpointing job left alone on a larger shared instance
    keeps all of it paid. When a smaller instance of the same kind (GPU model, spot mode, region:
    every constraint it was placed under still holds) would save more than restarting costs, it
    is stopped and requeued; the next pass places it again under every rule (on-prem, a free slot,
    or its own instance)."""
    rule = ctx.policy.repatriation
    if not (rule.enabled and rule.consolidate) or not ctx.snapshot.instances:
        return
    now = ctx.now
    alone: dict[str, RunningJob | None] = {}
    for r in ctx.snapshot.running:
        if r.instance_id is not None:
            alone[r.instance_id] = None if r.instance_id in alone else r
    min_run = ctx.policy.preemption.min_runtime_s
    scored: list[tuple[float, str, RunningJob, float]] = []
    for iid, only in alone.items():
        inst = ctx.slots.instances.get(iid)
        if only is None or inst is None or inst.gpus - inst.free_gpus != only.gpus or inst.gpus <= only.gpus:
            continue  # shared with others (maybe joined in this pass), or already the smallest
        if (
            not only.checkpointing
            or only.job_id in ctx.preempted
            or only.job_id in ctx.repatriated
            or now - only.started_at < min_run
        ):
            continue
        lost = only.lost_progress_s(now)
        end = ctx.expected_end(only, ctx.policy.runtime.repatriate_q)
        alt = _smallest_offer_usd(ctx, only, inst.spot)
        if lost > rule.max_lost_progress_s or end is None or alt is None:
            continue
        saving = (inst.hourly_usd - alt) * (end - now - lost - rule.restart_overhead_s) / 3600.0
        if saving >= rule.min_saving_usd:
            scored.append((-saving, only.job_id, only, lost))
    scored.sort(key=lambda s: (s[0], s[1]))
    for _, _, r, lost in scored[: max(0, rule.max_per_pass - len(ctx.repatriated))]:
        ctx.preempted.add(r.job_id)
        ctx.fair.remove(r.tenant, {"gpu:" + r.gpu_type: float(r.gpus)})
        ctx.decisions.preemptions.append(
            Preemption(
                job_id=r.job_id, tenant=r.tenant, for_job=r.job_id, rule=CONSOLIDATE, lost_progress_s=lost
            )
        )
        # Run again soon: the job is back in the queue.
        wake = now + 1.0
        if ctx.decisions.wake_at is None or wake < ctx.decisions.wake_at:
            ctx.decisions.wake_at = wake


def _smallest_offer_usd(ctx: PassContext, r: RunningJob, spot: bool) -> float | None:
    """The cheapest instance of the job's kind (model, spot mode, region) it fits on alone."""
    best: float | None = None
    for offer in ctx.cloud.by_model.get(r.gpu_type, ()):
        if offer.region != r.region or offer.gpus < r.gpus:
            continue
        price = offer.spot_usd_h if spot else offer.on_demand_usd_h
        if price is None or ctx.circuits.state(offer.region, offer.instance_type) is CircuitState.OPEN:
            continue
        if best is None or price < best:
            best = price
    return best


def _instance_rates(ctx: PassContext) -> dict[str | None, float]:
    """Per shared instance: its whole price per hour over the GPUs its jobs use now. A job left
    alone on a large instance keeps all of it paid, so moving it saves that, not its GPU share."""
    used: dict[str, int] = {}
    for r in ctx.snapshot.running:
        if r.instance_id is not None:
            used[r.instance_id] = used.get(r.instance_id, 0) + r.gpus
    rates: dict[str | None, float] = {}
    for iid, gpus in used.items():
        inst = ctx.slots.instances.get(iid)
        if inst is not None and gpus > 0:
            rates[iid] = inst.hourly_usd / gpus
    return rates


def _move(ctx: PassContext, r: RunningJob, saving: float, lost: float) -> bool:
    job = PendingJob(
        job_id=r.job_id,
        tenant=r.tenant,
        gpu_type=r.gpu_type,
        gpus=r.gpus,
        submitted_at=r.started_at,
        nodes=max(1, r.nodes),
        cpu=r.cpu,
        memory_gib=r.memory_gib,
        priority=r.priority,
        datasets=r.datasets,
    )
    if job.gpus % job.nodes:
        return False
    models, _ = quota_models(ctx, job, ctx.tenant(r.tenant))
    if not models:
        return False
    pools = allowed_pools(ctx.residency(job))
    fit = ctx.index.find(models, job.gpus_per_node, job.nodes, job.cpu, job.memory_gib, pools)
    if fit is None:
        return False
    pool, model, host_ids = fit
    a = assign_onprem(ctx, job, pool, model, host_ids, record=False)
    ctx.fair.remove(r.tenant, {"gpu:" + r.gpu_type: float(r.gpus)})
    ctx.decisions.repatriations.append(
        Repatriation(
            job_id=r.job_id,
            tenant=r.tenant,
            from_region=r.region or "",
            to=a,
            saving_usd=saving,
            lost_progress_s=lost,
        )
    )
    ctx.repatriated.add(r.job_id)
    return True
