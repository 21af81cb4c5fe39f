"""A dry run of a submit (``POST /v1/jobs/plan``, ``berth submit --dry-run``): the same checks as a
submit, then the scheduler core's answer for the spec now, and nothing written.

The answer is rendered from the core's own typed outcome: the store is read into the snapshot a
scheduling pass reads (``SnapshotSource.pass_inputs``), the spec is added to it as one more pending
job of the caller's tenant, submitted now (so it queues behind what is already waiting), and
``explain_job`` runs the ONE pass over it (``SchedulingPass``) and renders the outcome. No job, event,
counter or quota is written; the queue cursor the read advances lives in this process only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from berth.domain.cost import CostRates, onprem_hourly_usd
from berth.domain.errors import InvalidRequest, ValidationFailed
from berth.domain.job_spec import JobSpec
from berth.domain.storage import dataset_names
from berth.domain.tenancy import Caller, Quota
from berth.logic.arrays import task_spec
from berth.logic.jobs import AccessCheck, Clock, FeasibilityCheck
from berth.logic.snapshot import SnapshotSource, dataset_names_of
from berth.scheduler.adapter import pending_from_spec
from berth.scheduler.explain import JobExplanation, explain_job

#: The hypothetical job's id in the pass (never stored; it matches no job id pattern).
PLAN_JOB_ID = "j-plan"


@dataclass(frozen=True)
class PlanService:
    source: SnapshotSource
    clock: Clock
    feasibility: FeasibilityCheck | None = None
    access: AccessCheck | None = None

    def plan(self, caller: Caller, spec: JobSpec) -> dict[str, Any]:
        """Validate ``spec`` as a submit would (the same 4xx), then what a pass would decide now."""
        if spec.array_task is not None:
            raise InvalidRequest("array_task is set by Berth on an array's tasks; submit an 'array' instead")
        record = self.source.tenants.record(caller.tenant)
        sample = spec if spec.array is None else _first_task(spec, record.quota or Quota(), caller.tenant)
        if self.access is not None:
            self.access(sample, caller.tenant, record)
        if self.feasibility is not None:
            self.feasibility(sample, caller.tenant, record)
        inputs = self.source.pass_inputs()
        snapshot = inputs.snapshot
        names = (
            dataset_names_of(d for j in snapshot.pending for d in j.datasets)
            | {n for j in inputs.running_jobs for n in dataset_names(j.spec)}
            | set(dataset_names(spec))
        )
        policy, policy_version = self.source.policy(names)
        now = self.clock()
        job = pending_from_spec(PLAN_JOB_ID, caller.tenant, sample, now.timestamp())
        tenants = dict(snapshot.tenants)
        if caller.tenant not in tenants:
            tenants[caller.tenant] = self.source.tenant_state(caller.tenant)
        hypothetical = replace(snapshot, pending=(*snapshot.pending, job), tenants=tenants)
        explanation = explain_job(hypothetical, policy, now.timestamp(), PLAN_JOB_ID)
        tenant = tenants[caller.tenant]
        return {
            "tenant": caller.tenant,
            "name": spec.name,
            "resources": sample.resources.model_dump(mode="json"),
            "tasks": 1 if spec.array is None else spec.array.count,
            "outcome": explanation.outcome,
            "summary": explanation.summary,
            "hourly_usd": _hourly_usd(explanation, policy.accounting, spec),
            "limits": {
                "max_cost_usd": spec.constraints.max_cost_usd,
                "max_hourly_usd": spec.constraints.max_hourly_usd,
                "timeout_minutes": spec.timeout_minutes,
                "monthly_cloud_budget_usd": tenant.monthly_budget_usd,
                "cloud_budget_left_usd": None
                if tenant.monthly_budget_usd is None
                else round(max(0.0, tenant.monthly_budget_usd - tenant.cloud_spend_month_usd), 2),
            },
            "explanation": {**explanation.to_dict(), "job_id": None},
            "policy_version": policy_version,
            "offers_version": inputs.fleet.offers_version,
            "stored": False,
        }


def _first_task(spec: JobSpec, quota: Quota, tenant: str) -> JobSpec:
    """An array's task 0, as the array submit checks it (and the size against ``max_active_jobs``);
    every task asks for the same resources, so the plan of one is the plan of each."""
    assert spec.array is not None
    size = spec.array.count
    if size > quota.max_active_jobs:
        raise ValidationFailed(
            f"an array of {size} tasks can never fit tenant {tenant!r}'s max_active_jobs "
            f"({quota.max_active_jobs}); split it or ask an admin for a larger quota",
            details={"size": size, "max_active_jobs": quota.max_active_jobs},
        )
    first = spec.array.parameters[0] if spec.array.parameters else None
    return task_spec(spec, "j-" + "0" * 26, 0, size, first)


def _hourly_usd(explanation: JobExplanation, rates: CostRates, spec: JobSpec) -> float | None:
    """What the job would cost per hour where the pass put it (on-prem: the internal rate for its
    GPUs; cloud: the price the core gave the chosen offer). Pending: the cheapest price the core gave
    an eligible cloud site (what it would pay if it burst now), else None."""
    if explanation.outcome == "onprem":
        return onprem_hourly_usd(rates, spec.resources.gpus)
    chosen = [c.hourly_usd for c in explanation.candidates if c.chosen and c.hourly_usd is not None]
    if chosen:
        return chosen[0]
    priced = [
        c.hourly_usd
        for c in explanation.candidates
        if c.hourly_usd is not None and c.site.startswith("cloud:")
    ]
    return min(priced) if priced else None
