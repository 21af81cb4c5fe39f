"""Per-site placement rules: why a site may not take a job. Shared by the pass, the submit-time
feasibility check and ``explain``, so all three name the same rule for the same cause."""

from __future__ import annotations

from dataclasses import dataclass

from berth.domain.job_spec import PlacementConstraint, SpotPolicy
from berth.scheduler.outcomes import Exclusion, Rule
from berth.scheduler.policy import ResidencyRule, SchedulingPolicy
from berth.scheduler.snapshot import CloudOffer, PendingJob, TenantState


def onprem_job_exclusion(job: PendingJob, policy: SchedulingPolicy) -> Exclusion | None:
    if job.placement is PlacementConstraint.CLOUD:
        return Exclusion(Rule.PLACEMENT, "the job asks for placement: cloud")
    if not policy.use_onprem:
        return Exclusion(Rule.USE_ONPREM, f"policy {policy.name} does not use on-prem hosts")
    return None


def pool_exclusion(pool: str, residency: list[ResidencyRule]) -> Exclusion | None:
    for rule in residency:
        if rule.pools and pool not in rule.pools:
            return Exclusion(
                Rule.POOLS, f"{rule.label} keeps the job in pools {', '.join(rule.pools)}", rule.label
            )
    return None


def cloud_job_exclusion(
    job: PendingJob, policy: SchedulingPolicy, residency: list[ResidencyRule]
) -> Exclusion | None:
    """Rules that forbid the cloud for this job whatever the offer."""
    if job.placement is PlacementConstraint.ONPREM:
        return Exclusion(Rule.PLACEMENT, "the job asks for placement: onprem")
    if policy.burst is None:
        return Exclusion(Rule.BURST, f"policy {policy.name} never bursts to the cloud")
    if not policy.burst.allows(job.tenant):
        return Exclusion(Rule.BURST_TENANTS, f"tenant {job.tenant} may not burst to the cloud")
    for rule in residency:
        if rule.onprem_only:
            return Exclusion(Rule.RESIDENCY, f"{rule.label} keeps the job on-prem", rule.label)
    return None


def burst_eligible_at(
    job: PendingJob, policy: SchedulingPolicy, run_s: float | None, usd_per_gpu_hour: float | None = None
) -> float:
    """When an auto-placed job may burst (it waits for on-prem first); cloud jobs at once.
    ``run_s``: its predicted run time (``runtime.wait_q``); ``usd_per_gpu_hour``: its cheapest
    eligible cloud price, for a price-weighted wait."""
    if policy.burst is None or job.placement is PlacementConstraint.CLOUD or not policy.use_onprem:
        return job.submitted_at
    return job.submitted_at + policy.burst.wait_s(run_s, usd_per_gpu_hour)


def quota_exclusion(job: PendingJob, tenant: TenantState, model: str, used: int) -> Exclusion | None:
    """The tenant's on-prem limit of ``model`` (guarantee plus borrowing limit) with ``used`` GPUs
    already held: ``QUOTA`` when the job alone exceeds it, ``BORROW_LIMIT`` when it is what the
    tenant already runs."""
    limit = tenant.onprem_limit(model)
    if limit is None or used + job.gpus <= limit:
        return None
    if job.gpus > limit:
        return Exclusion(
            Rule.QUOTA,
            f"tenant {tenant.name} may use at most {limit} {model} GPUs on-prem; the job needs {job.gpus}",
            model,
        )
    return Exclusion(
        Rule.BORROW_LIMIT,
        f"tenant {tenant.name} uses {used} of its {limit} {model} GPUs "
        f"(guarantee plus borrowing limit); the job needs {job.gpus}",
        model,
    )


def wants_spot(job: PendingJob, policy: SchedulingPolicy, likely_run_s: float | None = None) -> bool | None:
    """True: spot only; False: on-demand only; None: spot where sold, else on-demand.
    ``likely_run_s``: a high quantile of its predicted run time (``runtime.spot_q``). A gang
    (``nodes`` > 1) runs in the cloud as an AWS Batch multi-node parallel job, which Batch does not
    run on spot compute environments: on-demand only (``spot: required`` keeps it off every offer)."""
    if job.spot is SpotPolicy.NEVER:
        return False
    if job.spot is SpotPolicy.REQUIRED:
        return True
    if job.nodes > 1:
        return False
    use = policy.spot.use
    if use == "never":
        return False
    if use == "always":
        return None
    short = likely_run_s is not None and likely_run_s <= policy.spot.short_job_s
    return None if (job.checkpointing or short) else False


def nodes_per_instance(job: PendingJob, gpus: int, vcpus: float, memory_gib: float) -> int:
    """How many of the job's nodes one instance of this shape holds whole (0: not even one).
    A node's share (GPUs, CPU, memory) is never split across instances."""
    k = min(job.nodes, gpus // job.gpus_per_node if job.gpus_per_node > 0 else job.nodes)
    return max(0, min(_whole(vcpus, job.cpu, k), _whole(memory_gib, job.memory_gib, k)))


def _whole(room: float, need: float, cap: int) -> int:
    """How many times ``need`` fits in ``room``, at most ``cap`` (a tiny ``need`` may overflow)."""
    if need <= 0:
        return cap
    return int(min(float(cap), room / need + 1e-9))


def instances_for(job: PendingJob, offer: CloudOffer) -> int | None:
    """Instances of ``offer`` that hold the whole gang, or None when one node's share (GPUs, CPU,
    memory per node) does not fit one instance. A gang runs as a Batch multi-node parallel job: one
    node per instance (Batch runs one node's container per instance), so ``nodes`` instances."""
    if nodes_per_instance(job, offer.gpus, offer.vcpus, offer.memory_gib) == 0:
        return None
    return job.nodes


@dataclass(slots=True, frozen=True)
class PricedOffer:
    offer: CloudOffer
    instances: int
    spot: bool
    hourly_usd: float


def offer_kind_exclusion(
    job: PendingJob,
    policy: SchedulingPolicy,
    residency: list[ResidencyRule],
    gpu_type: str,
    region: str,
    spot: bool,
    mode: bool | None,
) -> Exclusion | None:
    """Rules on the kind of capacity (GPU model, region, spot), for a new offer or a free slot of
    a running instance alike."""
    if gpu_type not in policy.accepted_gpus(job.gpu_type):
        return Exclusion(Rule.GPU_TYPE, f"{gpu_type} capacity; the job needs {job.gpu_type}", gpu_type)
    if job.regions and region not in job.regions:
        return Exclusion(
            Rule.REGIONS, f"{region} is not in the job's regions {', '.join(job.regions)}", region
        )
    for rule in residency:
        if rule.regions and region not in rule.regions:
            return Exclusion(
                Rule.RESIDENCY, f"{rule.label} keeps the job in regions {', '.join(rule.regions)}", rule.label
            )
    if region in job.avoid_regions:
        return Exclusion(Rule.AVOID, f"{region} failed this job before", region)
    if (mode is False and spot) or (mode is True and not spot):
        return Exclusion(Rule.SPOT, "spot capacity" if spot else "on-demand capacity", "spot" if spot else "")
    return None


def price_exclusion(
    job: PendingJob, policy: SchedulingPolicy, where: str, per_gpu: float, hourly: float, horizon_s: float
) -> Exclusion | None:
    """Price limits: the policy's per GPU-hour, the job's per hour and its total (at ``horizon_s``)."""
    if policy.max_usd_per_gpu_hour is not None and per_gpu > policy.max_usd_per_gpu_hour + 1e-9:
        return Exclusion(
            Rule.MAX_USD_PER_GPU_HOUR,
            f"{where} costs {per_gpu:.2f} USD per GPU-hour, "
            f"above the policy's {policy.max_usd_per_gpu_hour:.2f}",
        )
    if job.max_hourly_usd is not None and hourly > job.max_hourly_usd + 1e-9:
        return Exclusion(
            Rule.MAX_HOURLY_USD, f"{where} costs {hourly:.2f} USD/h, above the job's {job.max_hourly_usd:.2f}"
        )
    if job.max_cost_usd is not None:
        est = hourly * horizon_s / 3600.0
        if est > job.max_cost_usd:
            return Exclusion(
                Rule.MAX_COST_USD,
                f"{where} would cost about {est:.2f} USD, "
                f"above the job's max_cost_usd {job.max_cost_usd:.2f}",
            )
    return None


def price_offer(
    job: PendingJob,
    offer: CloudOffer,
    policy: SchedulingPolicy,
    residency: list[ResidencyRule],
    horizon_s: float = 3600.0,
    mode: bool | None = None,
) -> PricedOffer | Exclusion:
    """Price ``offer`` for ``job`` or name the rule that excludes it (offer-level rules only).
    ``horizon_s``: the run time that bounds its cost; ``mode``: ``wants_spot``."""
    where = f"{offer.instance_type} in {offer.zone}"
    if offer.gpu_type not in policy.accepted_gpus(job.gpu_type):
        return Exclusion(Rule.GPU_TYPE, f"{where} has {offer.gpu_type}, the job needs {job.gpu_type}")
    n = instances_for(job, offer)
    if n is None:
        return Exclusion(
            Rule.SHAPE,
            f"{where} ({offer.gpus} GPUs, {offer.vcpus:g} vCPUs, {offer.memory_gib:g} GiB) cannot hold "
            f"one node's share ({job.gpus_per_node} GPUs, {job.cpu:g} CPUs, {job.memory_gib:g} GiB)",
        )
    if mode is True and job.nodes > 1:
        return Exclusion(
            Rule.SPOT, f"{where}: a multi-node job cannot run on spot (AWS Batch multi-node parallel)"
        )
    if mode is True and offer.spot_usd_h is None:
        return Exclusion(Rule.SPOT, f"{where} sells no spot and the job requires spot")
    spot = offer.spot_usd_h is not None and mode is not False
    kind = offer_kind_exclusion(job, policy, residency, offer.gpu_type, offer.region, spot, mode)
    if kind is not None:
        return kind
    unit = offer.spot_usd_h if spot and offer.spot_usd_h is not None else offer.on_demand_usd_h
    hourly = unit * n
    pex = price_exclusion(job, policy, f"{where} x{n}", unit / offer.gpus, hourly, horizon_s)
    if pex is not None:
        return pex
    return PricedOffer(offer, n, spot, hourly)


def budget_exclusion(
    tenant: TenantState, hourly_usd: float, committed: float, horizon_s: float
) -> Exclusion | None:
    """The tenant's monthly cloud budget: spend so far plus what this pass committed plus the job
    (``hourly_usd`` for ``horizon_s``)."""
    if tenant.monthly_budget_usd is None:
        return None
    est = hourly_usd * horizon_s / 3600.0
    if tenant.cloud_spend_month_usd + committed + est > tenant.monthly_budget_usd:
        return Exclusion(
            Rule.BUDGET,
            f"tenant {tenant.name} would exceed its monthly cloud budget of "
            f"{tenant.monthly_budget_usd:.0f} USD "
            f"(spent {tenant.cloud_spend_month_usd + committed:.0f}, this job about {est:.0f})",
        )
    return None
