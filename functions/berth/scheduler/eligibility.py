"""Per-site placement rules: why a site may not take a job. Shared by the pass, the submit-time
feasibility check and ``explain``, so all three name the same rule for the same cause."""

from __future__ import annotations

from dataclasses import dataclass

from berth.domain.job_spec import PlacementConstraint, SpotPolicy
from berth.scheduler.policy import ResidencyRule, SchedulingPolicy
from berth.scheduler.snapshot import CloudOffer, PendingJob, TenantState


@dataclass(slots=True, frozen=True)
class Exclusion:
    """The rule (or shortage) that keeps a job off a site, and a sentence for humans."""

    rule: str
    message: str


def onprem_job_exclusion(job: PendingJob, policy: SchedulingPolicy) -> Exclusion | None:
    if job.placement is PlacementConstraint.CLOUD:
        return Exclusion("job.placement", "the job asks for placement: cloud")
    if not policy.use_onprem:
        return Exclusion("policy.use_onprem", f"policy {policy.name} does not use on-prem hosts")
    return None


def pool_exclusion(pool: str, residency: list[ResidencyRule]) -> Exclusion | None:
    for rule in residency:
        if rule.pools and pool not in rule.pools:
            return Exclusion(rule.label, f"{rule.label} keeps the job in pools {', '.join(rule.pools)}")
    return None


def cloud_job_exclusion(
    job: PendingJob, policy: SchedulingPolicy, residency: list[ResidencyRule]
) -> Exclusion | None:
    """Rules that forbid the cloud for this job whatever the offer."""
    if job.placement is PlacementConstraint.ONPREM:
        return Exclusion("job.placement", "the job asks for placement: onprem")
    if policy.burst is None:
        return Exclusion("policy.burst", f"policy {policy.name} never bursts to the cloud")
    if not policy.burst.allows(job.tenant):
        return Exclusion("policy.burst.tenants", f"tenant {job.tenant} may not burst to the cloud")
    for rule in residency:
        if rule.onprem_only:
            return Exclusion(rule.label, f"{rule.label} keeps the job on-prem")
    return None


def burst_eligible_at(
    job: PendingJob, policy: SchedulingPolicy, usd_per_gpu_hour: float | None = None
) -> float:
    """When an auto-placed job may burst (it waits for on-prem first); cloud jobs at once.
    ``usd_per_gpu_hour``: its cheapest eligible cloud price, for a price-weighted wait."""
    if policy.burst is None or job.placement is PlacementConstraint.CLOUD or not policy.use_onprem:
        return job.submitted_at
    return job.submitted_at + policy.burst.wait_s(job.expected_duration_s, usd_per_gpu_hour)


def wants_spot(job: PendingJob, policy: SchedulingPolicy) -> bool | None:
    """True: spot only; False: on-demand only; None: spot where sold, else on-demand."""
    if job.spot is SpotPolicy.NEVER:
        return False
    if job.spot is SpotPolicy.REQUIRED:
        return True
    use = policy.spot.use
    if use == "never":
        return False
    if use == "always":
        return None
    short = job.expected_duration_s is not None and job.expected_duration_s <= policy.spot.short_job_s
    return None if (job.checkpointing or short) else False


def instances_for(job: PendingJob, offer: CloudOffer) -> int | None:
    """Instances of ``offer`` that hold the whole gang, or None when it cannot be shaped."""
    if offer.gpus >= job.gpus:
        n = 1
    elif job.gpus % offer.gpus == 0:
        n = job.gpus // offer.gpus
    elif offer.gpus >= job.gpus_per_node:
        n = job.nodes
    else:
        return None
    if n * offer.vcpus < job.cpu * job.nodes or n * offer.memory_gib < job.memory_gib * job.nodes:
        return None
    return n


@dataclass(slots=True, frozen=True)
class PricedOffer:
    offer: CloudOffer
    instances: int
    spot: bool
    hourly_usd: float


def price_offer(
    job: PendingJob, offer: CloudOffer, policy: SchedulingPolicy, residency: list[ResidencyRule]
) -> PricedOffer | Exclusion:
    """Price ``offer`` for ``job`` or name the rule that excludes it (offer-level rules only)."""
    where = f"{offer.instance_type} in {offer.zone}"
    if offer.gpu_type not in policy.accepted_gpus(job.gpu_type):
        return Exclusion("gpu_type", f"{where} has {offer.gpu_type}, the job needs {job.gpu_type}")
    if job.regions and offer.region not in job.regions:
        return Exclusion(
            "job.regions", f"{offer.region} is not in the job's regions {', '.join(job.regions)}"
        )
    for rule in residency:
        if rule.regions and offer.region not in rule.regions:
            return Exclusion(rule.label, f"{rule.label} keeps the job in regions {', '.join(rule.regions)}")
    if offer.region in job.avoid_regions:
        return Exclusion("retry.avoid", f"{offer.region} failed this job before")
    n = instances_for(job, offer)
    if n is None:
        return Exclusion(
            "shape", f"{where} ({offer.gpus} GPUs) cannot hold {job.gpus} GPUs x {job.nodes} nodes"
        )
    mode = wants_spot(job, policy)
    if mode is True and offer.spot_usd_h is None:
        return Exclusion("job.spot", f"{where} sells no spot and the job requires spot")
    spot = offer.spot_usd_h is not None and mode is not False
    unit = offer.spot_usd_h if spot and offer.spot_usd_h is not None else offer.on_demand_usd_h
    per_gpu = unit / offer.gpus
    if policy.max_usd_per_gpu_hour is not None and per_gpu > policy.max_usd_per_gpu_hour:
        return Exclusion(
            "policy.max_usd_per_gpu_hour",
            f"{where} costs {per_gpu:.2f} USD per GPU-hour, "
            f"above the policy's {policy.max_usd_per_gpu_hour:.2f}",
        )
    hourly = unit * n
    if job.max_hourly_usd is not None and hourly > job.max_hourly_usd:
        return Exclusion(
            "job.max_hourly_usd",
            f"{where} x{n} costs {hourly:.2f} USD/h, above the job's {job.max_hourly_usd:.2f}",
        )
    if job.max_cost_usd is not None:
        est = hourly * job.cost_horizon_s / 3600.0
        if est > job.max_cost_usd:
            return Exclusion(
                "job.max_cost_usd",
                f"{where} x{n} would cost about {est:.2f} USD, "
                f"above the job's max_cost_usd {job.max_cost_usd:.2f}",
            )
    return PricedOffer(offer, n, spot, hourly)


def budget_exclusion(
    job: PendingJob, tenant: TenantState, hourly_usd: float, committed: float
) -> Exclusion | None:
    """The tenant's monthly cloud budget: spend so far plus what this pass committed plus the job."""
    if tenant.monthly_budget_usd is None:
        return None
    est = hourly_usd * job.cost_horizon_s / 3600.0
    if tenant.cloud_spend_month_usd + committed + est > tenant.monthly_budget_usd:
        return Exclusion(
            "tenant.monthly_budget_usd",
            f"tenant {tenant.name} would exceed its monthly cloud budget of "
            f"{tenant.monthly_budget_usd:.0f} USD "
            f"(spent {tenant.cloud_spend_month_usd + committed:.0f}, this job about {est:.0f})",
        )
    return None
