"""Packing the jobs that burst in one pass onto shared cloud instances (``burst.pack_instances``).

The single-node jobs sent to the cloud in a pass on an instance of their own are, after the
queue, packed (longest predicted run first, ``runtime.pack_q``, first fit) onto the multi-GPU
offer of their kind that saves the most per hour against each job's own choice, counting the
waiting jobs that would take its remaining slots at once (``slots.SlotLedger.fill_free_slots``).
Only jobs whose share passes their price limits are packed; the budget is charged the
difference; offers need a closed circuit and capacity left.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from berth.scheduler.circuit import CircuitState
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.eligibility import price_exclusion, wants_spot
from berth.scheduler.fits import fits
from berth.scheduler.outcomes import JobOutcome
from berth.scheduler.slots import (
    Kind,
    OpenInstance,
    SlotLedger,
    alone_price,
    new_instance_id,
    slot_assignment,
)
from berth.scheduler.snapshot import CloudOffer, PendingJob

if TYPE_CHECKING:
    from berth.scheduler.context import PassContext

__all__ = ["pack"]


def pack(led: SlotLedger, ctx: PassContext) -> None:
    """Resolve the deferred single-node cloud jobs (``burst.pack_instances``)."""
    groups: dict[Kind, list[tuple[PendingJob, CloudAssignment]]] = {}
    for job, a in led.deferred:
        groups.setdefault((a.gpu_type, a.spot, a.region), []).append((job, a))
    led.deferred = []
    q = ctx.policy.runtime.pack_q
    for kind, items in groups.items():
        run = {job.job_id: ctx.remaining_s(job, q) or 0.0 for job, _ in items}
        items.sort(key=lambda ja: (-run[ja[0].job_id], ja[0].job_id))
        offers = _pack_offers(ctx, kind)
        riders = [w for w in led.waiting if _rider_kind_ok(led, ctx, w, kind)]
        while items and offers:
            best: tuple[float, CloudOffer, float, list[int]] | None = None
            for offer, price in offers:
                chosen = _first_fit(ctx, items, offer, price)
                if not chosen:
                    continue
                value = sum(alone_price(items[i][1]) for i in chosen)
                until = ctx.now + max(run[items[i][0].job_id] for i in chosen)
                value += _rider_value(led, ctx, items, chosen, offer, riders, kind, until)
                saving = value - price
                if saving > 1e-9 and (best is None or saving > best[0]):
                    best = (saving, offer, price, chosen)
            if best is None:
                break
            _, offer, price, chosen = best
            _launch_packed(led, ctx, offer, price, [items[i] for i in chosen])
            taken = set(chosen)
            items = [ja for i, ja in enumerate(items) if i not in taken]
            if riders:
                led.fill_free_slots(ctx)
                riders = [r for r in riders if ctx.outcomes[r.job_id].placed is None]
        for job, a in items:
            led.place(ctx, job, a, deferred=True)
            inst = led.instances.get(a.instance_id or "")
            if inst is not None:
                inst.paid_until = max(inst.paid_until, ctx.now + run[job.job_id])


def _pack_offers(ctx: PassContext, kind: Kind) -> list[tuple[CloudOffer, float]]:
    """The cheapest zone of each multi-GPU instance type of this kind with a closed circuit
    and capacity left."""
    gpu_type, spot, region = kind
    best: dict[str, tuple[CloudOffer, float]] = {}
    for o in ctx.cloud.by_model.get(gpu_type, ()):
        if o.region != region or o.gpus < 2:
            continue
        price = o.spot_usd_h if spot else o.on_demand_usd_h
        if price is None or ctx.circuits.state(o.region, o.instance_type) is not CircuitState.CLOSED:
            continue
        left = ctx.cloud.left.get(ctx.cloud.pos[id(o)])
        if left is not None and left < 1:
            continue
        cur = best.get(o.instance_type)
        if cur is None or (price, o.zone) < (cur[1], cur[0].zone):
            best[o.instance_type] = (o, price)
    return sorted(best.values(), key=lambda op: (op[1] / op[0].gpus, op[0].instance_type))


def _launch_packed(
    led: SlotLedger,
    ctx: PassContext,
    offer: CloudOffer,
    price: float,
    chosen: list[tuple[PendingJob, CloudAssignment]],
) -> None:
    pos = ctx.cloud.pos[id(offer)]
    if pos in ctx.cloud.left:
        ctx.cloud.left[pos] -= 1
    iid = new_instance_id(chosen[0][0], ctx.now)
    q = ctx.policy.runtime.pack_q
    inst = OpenInstance(
        iid, offer.region, offer.zone, offer.instance_type, offer.gpu_type, chosen[0][1].spot, offer.gpus,
        price, offer.gpus, offer.vcpus, offer.memory_gib, ctx.now, offer.queue_name(chosen[0][1].spot),
    )  # fmt: skip
    led.open(inst)
    for n, (job, own) in enumerate(chosen):
        share = price * job.gpus / offer.gpus
        # The job's commitment was its own offer's price; it now pays its share instead.
        horizon = ctx.cost_horizon_s(job)
        ctx.committed_usd[job.tenant] = (
            ctx.committed_usd.get(job.tenant, 0.0) + (share - alone_price(own)) * horizon / 3600.0
        )
        # The first job launches the instance; the others packed with it join it.
        a = slot_assignment(job, inst, share, launch=n == 0)
        led.place(ctx, job, a, deferred=True)
        inst.paid_until = max(inst.paid_until, ctx.now + (ctx.remaining_s(job, q) or 0.0))
        ctx.outcomes[job.job_id] = JobOutcome(a, ctx.outcomes[job.job_id].steps)


def _alone_usd_h(led: SlotLedger, ctx: PassContext, gpus: int, kind: Kind) -> float:
    """The cheapest hourly price of instances holding ``gpus`` GPUs for one job alone."""
    key = (gpus, *kind)
    hit = led.alone_memo.get(key)
    if hit is not None:
        return hit
    gpu_type, spot, region = kind
    best = math.inf
    for o in ctx.cloud.by_model.get(gpu_type, ()):
        price = o.spot_usd_h if spot else o.on_demand_usd_h
        if o.region != region or price is None:
            continue
        # A single-node job: one instance holds it whole or it does not fit (never split).
        if o.gpus >= gpus:
            best = min(best, price)
    led.alone_memo[key] = best
    return best


def _rider_value(
    led: SlotLedger,
    ctx: PassContext,
    items: list[tuple[PendingJob, CloudAssignment]],
    chosen: list[int],
    offer: CloudOffer,
    riders: list[PendingJob],
    kind: Kind,
    until: float,
) -> float:
    """What the waiting jobs that would fill the rest of this instance cost alone per hour
    (only jobs the packed jobs keep it paid long enough for)."""
    if not riders:
        return 0.0
    gpus = offer.gpus - sum(items[i][0].gpus for i in chosen)
    cpu = offer.vcpus - sum(items[i][0].cpu for i in chosen)
    mem = offer.memory_gib - sum(items[i][0].memory_gib for i in chosen)
    need_q = ctx.policy.runtime.slot_need_q
    value = 0.0
    for job in riders:
        if gpus <= 0:
            break
        need = ctx.remaining_s(job, need_q)
        if (
            need is not None
            and ctx.now + need <= until
            and fits(gpus, cpu, mem, job.gpus, job.cpu, job.memory_gib)
        ):
            gpus -= job.gpus
            cpu -= job.cpu
            mem -= job.memory_gib
            value += _alone_usd_h(led, ctx, job.gpus, kind)
    return value


def _first_fit(
    ctx: PassContext, items: list[tuple[PendingJob, CloudAssignment]], offer: CloudOffer, price: float
) -> list[int]:
    """Jobs (in order) that fit ``offer`` together and whose share passes their price limits."""
    gpus, cpu, mem = offer.gpus, offer.vcpus, offer.memory_gib
    chosen = []
    for i, (job, _) in enumerate(items):
        if not fits(gpus, cpu, mem, job.gpus, job.cpu, job.memory_gib):
            continue
        share = price * job.gpus / offer.gpus
        where = f"a slot of {offer.instance_type} in {offer.zone}"
        if (
            price_exclusion(job, ctx.policy, where, price / offer.gpus, share, ctx.cost_horizon_s(job))
            is not None
        ):
            continue
        gpus -= job.gpus
        cpu -= job.cpu
        mem -= job.memory_gib
        chosen.append(i)
        if gpus == 0:
            break
    return chosen


def _rider_kind_ok(led: SlotLedger, ctx: PassContext, job: PendingJob, kind: Kind) -> bool:
    mode = wants_spot(job, ctx.policy, ctx.remaining_s(job, ctx.policy.runtime.spot_q))
    return led.kind_ok(ctx, job, kind, mode)
