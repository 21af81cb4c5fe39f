"""The cloud step of a pass: which offers a job may use, whether it may burst yet, and the
placement itself (a free slot of a shared instance, else the cheapest eligible offer)."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from berth.domain.job_spec import PlacementConstraint
from berth.domain.placement import Site
from berth.scheduler.circuit import CircuitState
from berth.scheduler.context import PassContext
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.eligibility import (
    PricedOffer,
    budget_exclusion,
    burst_eligible_at,
    cloud_job_exclusion,
    price_offer,
    wants_spot,
)
from berth.scheduler.outcomes import SHORTAGE_RULES, Exclusion, Rule, Step
from berth.scheduler.policy import ResidencyRule
from berth.scheduler.slots import SlotLedger, new_instance_id
from berth.scheduler.snapshot import CloudOffer, PendingJob, TenantState

Candidates = tuple[list[tuple[PricedOffer, CircuitState]], tuple[tuple[CloudOffer, Exclusion], ...], str]


class CloudLedger:
    """What the cloud step has given out in this pass: offer counts, circuit probes, memos."""

    __slots__ = ("by_key", "by_model", "ends", "left", "memo", "pos", "probes")

    def __init__(self, ctx: PassContext) -> None:
        offers = ctx.snapshot.offers
        self.left: dict[int, int] = {i: o.available for i, o in enumerate(offers) if o.available is not None}
        self.pos, self.by_model, self.by_key = _offer_index(offers)
        self.probes: dict[tuple[str, str], int] = {}
        self.memo: dict[tuple[object, ...], Candidates] = {}
        self.ends: dict[str, tuple[list[float], list[int]]] | None = None


OfferIndex = tuple[dict[int, int], dict[str, list[CloudOffer]], dict[tuple[str, str, str], CloudOffer]]
_INDEX: list[tuple[tuple[CloudOffer, ...], OfferIndex]] = []


def _offer_index(offers: tuple[CloudOffer, ...]) -> OfferIndex:
    """Offer positions, offers by GPU model and by (region, zone, instance type). Callers pass the
    same catalog tuple pass after pass, so the last index is kept (read only; it depends on
    nothing but that tuple)."""
    if _INDEX and _INDEX[0][0] is offers:
        return _INDEX[0][1]
    pos = {id(o): i for i, o in enumerate(offers)}
    by_model: dict[str, list[CloudOffer]] = {}
    for offer in offers:
        by_model.setdefault(offer.gpu_type, []).append(offer)
    index = (pos, by_model, {(o.region, o.zone, o.instance_type): o for o in offers})
    _INDEX[:] = [(offers, index)]
    return index


def spot_mode(ctx: PassContext, job: PendingJob) -> bool | None:
    return wants_spot(job, ctx.policy, ctx.remaining_s(job, ctx.policy.runtime.spot_q))


def cloud_candidates(ctx: PassContext, job: PendingJob, residency: list[ResidencyRule]) -> Candidates:
    """Eligible priced offers, cheapest first then healthiest; every other offer with the rule that
    excludes it; and a one-line summary of those."""
    led = ctx.cloud
    models = ctx.accepted(job.gpu_type)
    mode = spot_mode(ctx, job)
    # The horizon only bounds max_cost_usd here (the budget is checked at placement).
    horizon = ctx.cost_horizon_s(job) if job.max_cost_usd is not None else 3600.0
    key = (
        models,
        job.gpus,
        job.nodes,
        job.cpu,
        job.memory_gib,
        job.regions,
        job.max_hourly_usd,
        job.max_cost_usd,
        horizon if job.max_cost_usd is not None else None,
        tuple(id(r) for r in residency),
        job.avoid_regions,
        mode,
    )
    hit = led.memo.get(key)
    if hit is not None:
        return hit
    ok: list[tuple[PricedOffer, CircuitState]] = []
    out: list[tuple[CloudOffer, Exclusion]] = []
    for offer in (o for m in models for o in led.by_model.get(m, ())):
        priced = price_offer(job, offer, ctx.policy, residency, horizon, mode)
        if isinstance(priced, Exclusion):
            out.append((offer, priced))
            continue
        state = ctx.circuits.state(offer.region, offer.instance_type)
        if state is CircuitState.OPEN:
            out.append(
                (
                    offer,
                    Exclusion(
                        Rule.CIRCUIT,
                        "circuit open: recent capacity/API errors for "
                        f"{offer.instance_type} in {offer.region}",
                        f"{offer.region}/{offer.instance_type}",
                    ),
                )
            )
            continue
        ok.append((priced, state))
    ok.sort(
        key=lambda p: (
            p[0].hourly_usd,
            p[1] is CircuitState.HALF_OPEN,
            p[0].offer.region,
            p[0].offer.instance_type,
            p[0].offer.zone,
        )
    )
    result = (ok, tuple(out), _summary(ctx, models, out))
    led.memo[key] = result
    return result


def _summary(ctx: PassContext, models: tuple[str, ...], out: list[tuple[CloudOffer, Exclusion]]) -> str:
    excluded: dict[Rule, int] = {}
    first: dict[Rule, str] = {}
    other = len(ctx.snapshot.offers) - sum(len(ctx.cloud.by_model.get(m, ())) for m in models)
    if other:
        excluded[Rule.GPU_TYPE] = other
        first[Rule.GPU_TYPE] = f"they offer other GPU models than {' or '.join(models)}"
    for _, ex in out:
        excluded[ex.rule] = excluded.get(ex.rule, 0) + 1
        first.setdefault(ex.rule, ex.message)
    if not excluded:
        return "no cloud offers in the snapshot"
    return "; ".join(
        f"{n} offer{'s' if n > 1 else ''} excluded by {rule} (e.g. {first[rule]})"
        for rule, n in sorted(excluded.items(), key=lambda kv: -kv[1])
    )


def deciding_rule(out: tuple[tuple[CloudOffer, Exclusion], ...]) -> Rule:
    """The rule that kept a job off every offer: the commonest policy or constraint rule, else the
    commonest shortage (a plain mismatch says less than a rule the user or admin can change)."""
    counts: dict[Rule, int] = {}
    for _, ex in out:
        counts[ex.rule] = counts.get(ex.rule, 0) + 1
    if not counts:
        return Rule.NO_OFFERS
    return max(counts, key=lambda r: (r not in SHORTAGE_RULES, counts[r], str(r)))


def cloud_first(ctx: PassContext, job: PendingJob, residency: list[ResidencyRule]) -> bool:
    """A cheap-in-the-cloud job skips a contended on-prem fleet (policy.burst.cloud_first_*)."""
    burst = ctx.policy.burst
    if (
        burst is None
        or burst.cloud_first_below_usd_per_gpu_hour is None
        or job.placement is not PlacementConstraint.AUTO
    ):
        return False
    cap = ctx.index.capacity.get("gpu:" + job.gpu_type, 0.0)
    if cap and ctx.index.free_total.get(job.gpu_type, 0) >= burst.contended_below * cap:
        return False
    if cloud_job_exclusion(job, ctx.policy, residency) is not None:
        return False
    candidates = cloud_candidates(ctx, job, residency)[0]
    if not candidates:
        return False
    return candidates[0][0].hourly_usd / job.gpus <= burst.cloud_first_below_usd_per_gpu_hour


def cheapest_per_gpu_hour(ctx: PassContext, job: PendingJob, residency: list[ResidencyRule]) -> float | None:
    burst = ctx.policy.burst
    if burst is None or burst.reference_usd_per_gpu_hour is None:
        return None
    candidates = cloud_candidates(ctx, job, residency)[0]
    if not candidates:
        return None
    return candidates[0][0].hourly_usd / job.gpus


def may_burst_at(
    ctx: PassContext, job: PendingJob, residency: list[ResidencyRule], onprem_tried: bool
) -> float:
    """When the job may burst: after its wait (relative to its predicted run time), or now when
    ``burst.estimate_wait`` finds on-prem out of reach before the wait ends anyway."""
    run_s = ctx.remaining_s(job, ctx.policy.runtime.wait_q)
    eligible_at = burst_eligible_at(job, ctx.policy, run_s, cheapest_per_gpu_hour(ctx, job, residency))
    if ctx.now < eligible_at and onprem_tried and _onprem_out_of_reach(ctx, job, eligible_at):
        return ctx.now
    return eligible_at


def _onprem_out_of_reach(ctx: PassContext, job: PendingJob, eligible_at: float) -> bool:
    """policy.burst.estimate_wait: on-prem is not expected to take the job before it may burst
    anyway (and it has waited ``min_wait_s``), so waiting longer only adds to its JCT. The running
    jobs' ends are predicted (``runtime.wait_q``)."""
    burst = ctx.policy.burst
    if burst is None or not burst.estimate_wait or job.placement is not PlacementConstraint.AUTO:
        return False
    if ctx.now < job.submitted_at + burst.min_wait_s:
        return False
    led = ctx.cloud
    if led.ends is None:
        by_model: dict[str, list[tuple[float, int]]] = {}
        for r in ctx.snapshot.running:
            end = ctx.expected_end(r, ctx.policy.runtime.wait_q) if r.site == Site.ONPREM else None
            if end is not None:
                by_model.setdefault(r.gpu_type, []).append((end, r.gpus))
        led.ends = {}
        for model, ends in by_model.items():
            ends.sort()
            led.ends[model] = ([t for t, _ in ends], list(accumulate(g for _, g in ends)))
    model = job.gpu_type
    need = ctx.waiting_gpus.get(model, 0) + job.gpus - ctx.index.free_total.get(model, 0)
    times, freed = led.ends.get(model, ([], []))
    i = bisect_left(freed, max(1, need))
    return i >= len(times) or times[i] >= eligible_at


def try_cloud(
    ctx: PassContext, job: PendingJob, tenant: TenantState, residency: list[ResidencyRule]
) -> Step | None:
    """Place ``job`` in the cloud (None) or say why not: a free slot of a running shared
    instance first, else the cheapest eligible offer with capacity left."""
    slots: SlotLedger = ctx.slots
    if job.nodes == 1 and slots.join_best(ctx, job, tenant, ctx.cost_horizon_s(job)) is not None:
        return None
    candidates, out, summary = cloud_candidates(ctx, job, residency)
    if not candidates:
        return Step(Site.CLOUD, deciding_rule(out), "no eligible offer: " + summary)
    led = ctx.cloud
    why: Step | None = None
    horizon = ctx.cost_horizon_s(job)
    for priced, state in candidates:
        offer = priced.offer
        pos = led.pos[id(offer)]
        left = led.left.get(pos)
        if left is not None and left < priced.instances:
            why = why or Step(
                Site.CLOUD, Rule.OFFER_CAPACITY, f"{offer.instance_type} in {offer.zone} has no capacity left"
            )
            continue
        ckey = (offer.region, offer.instance_type)
        if state is CircuitState.HALF_OPEN and led.probes.get(ckey, 0) >= ctx.policy.circuit.half_open_probes:
            why = why or Step(
                Site.CLOUD,
                Rule.CIRCUIT_PROBE,
                f"circuit half-open for {offer.instance_type} in {offer.region}, probe already sent",
            )
            continue
        committed = ctx.committed_usd.get(job.tenant, 0.0)
        bex = budget_exclusion(tenant, priced.hourly_usd, committed, horizon)
        if bex is not None:
            return Step(Site.CLOUD, bex.rule, bex.message)  # every later offer costs at least as much
        if left is not None:
            led.left[pos] = left - priced.instances
        if state is CircuitState.HALF_OPEN:
            led.probes[ckey] = led.probes.get(ckey, 0) + 1
        ctx.committed_usd[job.tenant] = committed + priced.hourly_usd * horizon / 3600.0
        a = offer_assignment(job, priced, ctx.now)
        shared = a.instance_id is not None
        if shared and ctx.packs:
            # Provisional: the packing step may put it on a larger shared instance instead.
            slots.defer(ctx, job, a)
        else:
            slots.place(ctx, job, a)
        return None
    return why or Step(Site.CLOUD, Rule.NO_OFFERS, "no eligible offer")


def offer_assignment(job: PendingJob, priced: PricedOffer, now: float) -> CloudAssignment:
    """The assignment for a new offer: a single-node job on one instance launches a shared
    instance (others may join its free slots) and pays its GPU share, idle slots being billed to
    its users; a gang gets instances of its own at their whole price."""
    offer = priced.offer
    shared = job.nodes == 1 and priced.instances == 1
    return CloudAssignment(
        job_id=job.job_id,
        tenant=job.tenant,
        region=offer.region,
        zone=offer.zone,
        queue=offer.queue_name(priced.spot),
        instance_type=offer.instance_type,
        instances=priced.instances,
        gpu_type=offer.gpu_type,
        spot=priced.spot,
        hourly_usd=priced.hourly_usd * job.gpus / offer.gpus if shared else priced.hourly_usd,
        instance_id=new_instance_id(job, now) if shared else None,
        launch=shared,
        instance_hourly_usd=priced.hourly_usd if shared else 0.0,
    )
