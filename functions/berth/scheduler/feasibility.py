"""Submit-time feasibility: refuse a job no site could ever take, naming the rule that forbids it.

Only static facts count (fleet sizes, offers, rules, quotas, budget); transient ones (busy
hosts, open circuits, the burst wait, quota already in use) do not make a job infeasible. The
checks are the pass's own (``eligibility``): the same functions and the same rule ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from berth.domain.job_spec import JobSpec, PlacementConstraint
from berth.scheduler.adapter import pending_from_spec
from berth.scheduler.eligibility import (
    budget_exclusion,
    cloud_job_exclusion,
    onprem_job_exclusion,
    pool_exclusion,
    price_offer,
    quota_exclusion,
    wants_spot,
)
from berth.scheduler.fits import fits
from berth.scheduler.outcomes import SHORTAGE_RULES, Exclusion, Rule
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.predictor import fallback_runtime
from berth.scheduler.shapes import LargestShapes, largest_shapes
from berth.scheduler.snapshot import CloudOffer, Host, PendingJob, TenantState


@dataclass(slots=True, frozen=True)
class Infeasible:
    """Why a job can never be placed: ``rule`` is the deciding rule, ``details`` every site's."""

    rule: Rule
    message: str
    details: tuple[Exclusion, ...] = ()
    largest: LargestShapes | None = None
    """Where a node's share fits nowhere (rule ``shape``): the largest shapes of its model."""


def _onprem_exclusion(
    job: PendingJob, tenant: TenantState, policy: SchedulingPolicy, hosts: Iterable[Host]
) -> Exclusion | None:
    ex = onprem_job_exclusion(job, policy)
    if ex is not None:
        return ex
    residency = policy.residency_for(job.tenant, job.datasets)
    quota_ok = []
    first: Exclusion | None = None
    for m in policy.accepted_gpus(job.gpu_type):
        qex = quota_exclusion(job, tenant, m, 0)
        if qex is None:
            quota_ok.append(m)
        else:
            first = first or qex
    if not quota_ok:
        assert first is not None
        return first
    per_pool: dict[str, int] = {}
    pool_ex: Exclusion | None = None
    any_model = False
    any_shape = False
    for h in hosts:
        if h.gpu_type not in quota_ok:
            continue
        any_model = True
        # A node's share must fit one host whole: nodes are never split across hosts.
        if not fits(h.gpus, h.cpu, h.memory_gib, job.gpus_per_node, job.cpu, job.memory_gib):
            continue
        any_shape = True
        pex = pool_exclusion(h.pool, residency)
        if pex is not None:
            pool_ex = pool_ex or pex
            continue
        per_pool[h.pool] = per_pool.get(h.pool, 0) + 1
    if any(n >= job.nodes for n in per_pool.values()):
        return None
    if pool_ex is not None and not per_pool:
        return pool_ex
    if not any_model:
        return Exclusion(Rule.GPU_TYPE, f"the fleet has no {' or '.join(quota_ok)} hosts")
    if not any_shape:
        return Exclusion(
            Rule.SHAPE,
            f"no {' or '.join(quota_ok)} host holds one node's share ({job.gpus_per_node} GPUs, "
            f"{job.cpu:g} CPUs, {job.memory_gib:g} GiB)",
        )
    return Exclusion(
        Rule.CAPACITY,
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
    # Statically, only the user's estimate or the timeout is known (no history is assumed).
    rt = fallback_runtime(job.expected_duration_s, job.timeout_s)
    horizon = 3600.0 if rt is None else rt.quantile(policy.runtime.cost_q)
    mode = wants_spot(job, policy, None if rt is None else rt.quantile(policy.runtime.spot_q))
    best: Exclusion | None = None
    cheapest: float | None = None
    for offer in offers:
        priced = price_offer(job, offer, policy, residency, horizon, mode)
        if isinstance(priced, Exclusion):
            # Prefer reporting a policy/constraint rule over a plain mismatch.
            if best is None or (best.rule in SHORTAGE_RULES and priced.rule not in SHORTAGE_RULES):
                best = priced
            continue
        cheapest = priced.hourly_usd if cheapest is None else min(cheapest, priced.hourly_usd)
    if cheapest is None:
        return best or Exclusion(Rule.NO_OFFERS, "there are no cloud offers")
    # A fresh month: spend so far is transient.
    return budget_exclusion(replace(tenant, cloud_spend_month_usd=0.0), cheapest, 0.0, horizon)


def check_feasible(
    job: JobSpec | PendingJob,
    tenant: TenantState | str,
    policy: SchedulingPolicy,
    hosts: Iterable[Host],
    offers: Iterable[CloudOffer],
) -> Infeasible | None:
    """None when some site could take the job some day; else the rule that forbids it."""
    t = tenant if isinstance(tenant, TenantState) else TenantState(name=tenant)
    hosts, offers = tuple(hosts), tuple(offers)
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
    elif onprem.rule in SHORTAGE_RULES and cloud.rule not in SHORTAGE_RULES:
        decisive = cloud
    else:
        decisive = onprem
    message = f"on-prem: {onprem.message}; cloud: {cloud.message}"
    largest = None
    if Rule.SHAPE in (onprem.rule, cloud.rule):
        largest = largest_shapes(pj.gpu_type, policy.accepted_gpus(pj.gpu_type), hosts, offers)
        message += f"; {largest.describe()}"
    return Infeasible(rule=decisive.rule, message=message, details=details, largest=largest)
