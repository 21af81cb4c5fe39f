"""Submit-time feasibility: refuse a job no site could ever take, naming the rule that forbids it.

Only static facts count (fleet sizes, offers, rules, quotas, budget); transient ones (busy
hosts, open circuits, the burst wait) do not make a job infeasible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from berth.domain.job_spec import JobSpec, PlacementConstraint
from berth.scheduler.adapter import pending_from_spec
from berth.scheduler.eligibility import (
    Exclusion,
    cloud_job_exclusion,
    onprem_job_exclusion,
    pool_exclusion,
    price_offer,
)
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.snapshot import CloudOffer, Host, PendingJob, TenantState

# Rules that are a shortage of hardware or offers rather than a policy or constraint.
_SHORTAGE_RULES = frozenset({"capacity", "gpu_type", "shape", "offers"})


@dataclass(slots=True, frozen=True)
class Infeasible:
    """Why a job can never be placed: ``rule`` is the deciding rule, ``details`` every site's."""

    rule: str
    message: str
    details: tuple[Exclusion, ...] = ()


def _onprem_exclusion(
    job: PendingJob, tenant: TenantState, policy: SchedulingPolicy, hosts: Iterable[Host]
) -> Exclusion | None:
    ex = onprem_job_exclusion(job, policy)
    if ex is not None:
        return ex
    residency = policy.residency_for(job.tenant, job.datasets)
    models = policy.accepted_gpus(job.gpu_type)
    quota_ok = []
    for m in models:
        limit = tenant.onprem_limit(m)
        if limit is None or limit >= job.gpus:
            quota_ok.append(m)
    if not quota_ok:
        return Exclusion(
            "tenant.quota",
            f"tenant {tenant.name} may use at most "
            f"{tenant.onprem_limit(job.gpu_type)} {job.gpu_type} GPUs on-prem; the job needs {job.gpus}",
        )
    per_pool: dict[str, int] = {}
    pool_ex: Exclusion | None = None
    any_model = False
    for h in hosts:
        if h.gpu_type not in quota_ok:
            continue
        any_model = True
        pex = pool_exclusion(h.pool, residency)
        if pex is not None:
            pool_ex = pool_ex or pex
            continue
        if h.gpus >= job.gpus_per_node and h.cpu >= job.cpu and h.memory_gib >= job.memory_gib:
            per_pool[h.pool] = per_pool.get(h.pool, 0) + 1
    if any(n >= job.nodes for n in per_pool.values()):
        return None
    if pool_ex is not None and not per_pool:
        return pool_ex
    if not any_model:
        return Exclusion("gpu_type", f"the fleet has no {' or '.join(quota_ok)} hosts")
    return Exclusion(
        "capacity",
        f"no pool has {job.nodes} host(s) with {job.gpus_per_node} {job.gpu_type} GPUs, "
        f"{job.cpu:g} CPUs and {job.memory_gib:g} GiB each",
    )


def _cloud_exclusion(
    job: PendingJob, tenant: TenantState, policy: SchedulingPolicy, offers: Iterable[CloudOffer]
) -> Exclusion | None:
    residency = policy.residency_for(job.tenant, job.datasets)
    ex = cloud_job_exclusion(job, policy, residency)
    if ex is not None:
        return ex
    best: Exclusion | None = None
    cheapest: float | None = None
    for offer in offers:
        priced = price_offer(job, offer, policy, residency)
        if isinstance(priced, Exclusion):
            # Prefer reporting a policy/constraint rule over a plain mismatch.
            if best is None or (best.rule in _SHORTAGE_RULES and priced.rule not in _SHORTAGE_RULES):
                best = priced
            continue
        cheapest = priced.hourly_usd if cheapest is None else min(cheapest, priced.hourly_usd)
    if cheapest is None:
        return best or Exclusion("offers", "there are no cloud offers")
    if tenant.monthly_budget_usd is not None:
        est = cheapest * job.cost_horizon_s / 3600.0
        if est > tenant.monthly_budget_usd:
            return Exclusion(
                "tenant.monthly_budget_usd",
                f"the cheapest offer would cost about {est:.0f} USD, "
                f"above tenant {tenant.name}'s monthly budget of {tenant.monthly_budget_usd:.0f} USD",
            )
    return None


def check_feasible(
    job: JobSpec | PendingJob,
    tenant: TenantState | str,
    policy: SchedulingPolicy,
    hosts: Iterable[Host],
    offers: Iterable[CloudOffer],
) -> Infeasible | None:
    """None when some site could take the job some day; else the rule that forbids it."""
    t = tenant if isinstance(tenant, TenantState) else TenantState(name=tenant)
    pj = pending_from_spec("feasibility-check", t.name, job, 0.0) if isinstance(job, JobSpec) else job
    onprem = _onprem_exclusion(pj, t, policy, hosts)
    if onprem is None:
        return None
    cloud = _cloud_exclusion(pj, t, policy, offers)
    if cloud is None:
        return None
    details = (onprem, cloud)
    # The deciding rule: the one the job chose (placement) or a policy/constraint rule over a shortage.
    if pj.placement is PlacementConstraint.CLOUD:
        decisive = cloud
    elif pj.placement is PlacementConstraint.ONPREM:
        decisive = onprem
    elif onprem.rule in _SHORTAGE_RULES and cloud.rule not in _SHORTAGE_RULES:
        decisive = cloud
    else:
        decisive = onprem
    message = f"on-prem: {onprem.message}; cloud: {cloud.message}"
    return Infeasible(rule=decisive.rule, message=message, details=details)
