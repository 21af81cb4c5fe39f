"""Organisational placement rules as data: validated from YAML/JSON dicts. No file I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from berth.domain.cost import CostRates


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BurstRule(_Rule):
    """Who may burst to the cloud, and when: after waiting max(min_wait_s, wait_fraction x run time)."""

    tenants: list[str] = Field(default_factory=lambda: ["*"])
    min_wait_s: Annotated[float, Field(ge=0)] = 0.0
    wait_fraction: Annotated[float, Field(ge=0, le=100)] = 0.0
    max_wait_s: Annotated[float | None, Field(ge=0)] = None
    """Cap on the relative wait (a 10-day job need not wait a day)."""
    reference_usd_per_gpu_hour: Annotated[float | None, Field(gt=0)] = None
    """When set, the relative wait is scaled by (the job's cheapest cloud USD per GPU-hour /
    this reference) ** price_exponent: jobs that are dear to run in the cloud wait longer for
    on-prem, jobs that are cheap there burst sooner."""
    price_exponent: Annotated[float, Field(ge=0, le=8)] = 1.0
    cloud_first_below_usd_per_gpu_hour: Annotated[float | None, Field(gt=0)] = None
    """When on-prem is contended (free share of the job's GPU model below ``contended_below``),
    a job whose cheapest cloud offer costs at most this per GPU-hour goes to the cloud first:
    on-prem GPU-hours are then spent on jobs that are dear to run in the cloud (e.g. 1-GPU jobs
    on 1-GPU instances) rather than on jobs cheap there (8-GPU jobs on 8-GPU spot instances)."""
    contended_below: Annotated[float, Field(ge=0, le=1)] = 0.1
    estimate_wait: bool = False
    """Burst as soon as ``min_wait_s`` has passed when on-prem is not expected to take the job
    within the rest of its wait: the estimate is when enough GPUs of its model free up, from the
    running on-prem jobs' expected ends, for the jobs left waiting ahead of it in this pass plus
    itself (fragmentation ignored). A job on-prem would take soon keeps waiting."""
    pack_instances: bool = False
    """Cloud instances are shared hosts (several containers per instance, as AWS Batch places
    them). Every policy fills free GPU slots of running instances first; without this a new
    instance is the cheapest offer for the job alone. With it, the single-node jobs bursting in
    one pass are packed onto larger instances, cheaper per GPU-hour, when the jobs packed onto
    one (plus the waiting jobs it would take at once) cost more per hour alone than the
    instance, and a waiting job goes at once into a free slot that the instance's other jobs
    keep paid for at least as long as it needs (``runtime`` quantiles). Decided by the pass
    (``berth.scheduler.packing``), under every rule a cloud placement obeys."""

    def allows(self, tenant: str) -> bool:
        return "*" in self.tenants or tenant in self.tenants

    def wait_s(self, expected_duration_s: float | None, usd_per_gpu_hour: float | None = None) -> float:
        relative = self.wait_fraction * (expected_duration_s or 0.0)
        if self.reference_usd_per_gpu_hour is not None and usd_per_gpu_hour is not None:
            relative *= (usd_per_gpu_hour / self.reference_usd_per_gpu_hour) ** self.price_exponent
        if self.max_wait_s is not None:
            relative = min(relative, self.max_wait_s)
        return max(self.min_wait_s, relative)


class RuntimeRule(_Rule):
    """Which quantile of a job's predicted run time each decision reads. A low quantile is a
    bet that the job is short, a high one that it is long; each is chosen so that a wrong guess
    costs little (a job that runs past its prediction is re-predicted, conditioned on the work
    done, at every pass)."""

    wait_q: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """The burst wait's relative part."""
    spot_q: Annotated[float, Field(gt=0, lt=1)] = 0.9
    """The short-job test for spot (``spot.short_job_s``): only jobs likely short."""
    cost_q: Annotated[float, Field(gt=0, lt=1)] = 0.9
    """``max_cost_usd`` and the monthly budget: bound the cost of a long guess."""
    pack_q: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """Packing: order of the jobs packed, and how long a shared instance's jobs keep it paid."""
    slot_need_q: Annotated[float, Field(gt=0, lt=1)] = 0.75
    """A waiting job starts in a free slot only if the instance is paid that long anyway."""
    repatriate_q: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """The remaining run time counted in a repatriation's saving."""


class ResidencyRule(_Rule):
    """Where a tenant's jobs, or jobs reading a dataset, may run.

    Match by ``tenant`` and/or ``dataset_prefix`` (a job matches when it is the tenant's, or one
    of its data sources starts with the prefix). ``onprem_only`` forbids the cloud; ``regions``
    limits cloud regions; ``pools`` limits on-prem pools.
    """

    name: str = ""
    tenant: str | None = None
    dataset_prefix: str | None = None
    onprem_only: bool = False
    regions: list[str] = Field(default_factory=list)
    pools: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_selector(self) -> Self:
        if self.tenant is None and self.dataset_prefix is None:
            raise ValueError("a residency rule needs a tenant or a dataset_prefix")
        if self.onprem_only and self.regions:
            raise ValueError("onprem_only and regions contradict each other")
        return self

    def matches(self, tenant: str, datasets: tuple[str, ...]) -> bool:
        if self.tenant is not None and self.tenant != tenant:
            return False
        if self.dataset_prefix is not None:
            return any(d.startswith(self.dataset_prefix) for d in datasets)
        return True

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        who = f"tenant {self.tenant}" if self.tenant else f"dataset {self.dataset_prefix}"
        return f"residency[{who}]"


class SpotRule(_Rule):
    """When a job that allows spot gets spot: ``always``; ``checkpointing`` (checkpointing jobs,
    or jobs expected to run at most ``short_job_s``); ``never``. spot: required jobs always do."""

    use: Literal["always", "checkpointing", "never"] = "checkpointing"
    short_job_s: Annotated[float, Field(ge=0)] = 3600.0


class PreemptionRule(_Rule):
    reclaim: bool = True
    """A tenant below its guarantee may preempt other tenants' borrowed jobs."""
    priority: bool = True
    """A tenant's higher-priority job may preempt its own lower-priority jobs."""
    max_per_pass: Annotated[int, Field(ge=0)] = 8
    min_runtime_s: Annotated[float, Field(ge=0)] = 300.0
    """A job that started less than this ago is not a victim (no thrashing)."""


class RepatriationRule(_Rule):
    enabled: bool = True
    min_saving_usd: Annotated[float, Field(ge=0)] = 1.0
    max_lost_progress_s: Annotated[float, Field(ge=0)] = 1800.0
    restart_overhead_s: Annotated[float, Field(ge=0)] = 300.0
    max_per_pass: Annotated[int, Field(ge=0)] = 16
    instance_share: bool = False
    """Score a job on a shared instance by the instance's whole price over the GPUs in use on it
    (a job left alone on a large instance keeps all of it paid), not only by its GPU share."""
    consolidate: bool = False
    """Stop and requeue (with ``enabled``) a checkpointing job left alone on a larger shared
    instance when a smaller instance of its kind would save ``min_saving_usd`` after the restart
    (``runtime.repatriate_q``)."""
    before_queue: bool = False
    """Offer freed on-prem capacity to long-running cloud jobs before the queue: a slot holding a
    job with days left saves more cloud hours than one holding a fresh short job (which may burst)."""


class CircuitRule(_Rule):
    failure_threshold: Annotated[int, Field(ge=1)] = 3
    window_s: Annotated[float, Field(gt=0)] = 600.0
    open_s: Annotated[float, Field(gt=0)] = 900.0
    half_open_probes: Annotated[int, Field(ge=1)] = 1


class FairShareRule(_Rule):
    ordering: Literal["fair-share", "fifo"] = "fair-share"
    half_life_s: Annotated[float, Field(gt=0)] = 7 * 86400.0
    history_weight: Annotated[float, Field(ge=0, le=1)] = 0.5
    """0: current allocation only (pure DRF); 1: decayed usage only."""
    within_tenant: Literal["submit", "longest-first"] = "submit"
    """After priority: earliest submitted first, or longest expected run first (long jobs are the
    dearest to burst and the longest to keep the cloud busy after a peak; short ones burst sooner)."""


class SchedulingPolicy(_Rule):
    name: Annotated[str, Field(min_length=1, max_length=64)] = "berth"
    use_onprem: bool = True
    burst: BurstRule | None = Field(default_factory=BurstRule)
    """None: never burst to the cloud."""
    max_usd_per_gpu_hour: Annotated[float | None, Field(gt=0)] = None
    gpu_equivalents: dict[str, list[str]] = Field(default_factory=dict)
    """Models a job may run on instead of the one it asked for, in order of preference."""
    residency: list[ResidencyRule] = Field(default_factory=list)
    spot: SpotRule = Field(default_factory=SpotRule)
    preemption: PreemptionRule = Field(default_factory=PreemptionRule)
    repatriation: RepatriationRule = Field(default_factory=RepatriationRule)
    circuit: CircuitRule = Field(default_factory=CircuitRule)
    fair_share: FairShareRule = Field(default_factory=FairShareRule)
    runtime: RuntimeRule = Field(default_factory=RuntimeRule)
    accounting: CostRates = Field(default_factory=CostRates)
    """The on-prem internal rate and how often running jobs' cost is written (``berth.domain.cost``)."""
    data_locality: Literal["prefer", "ties", "off"] = "prefer"
    """Hosts whose object cache holds a job's data (``Host.cached_datasets``): ``prefer`` takes them
    first among the hosts that can take the job now (before best fit); ``ties`` only among hosts of
    equal fit; ``off`` ignores caches. Always after fairness, quotas and placement rules, and never a
    reason to wait (docs/scheduling.md, "Data locality")."""

    def accepted_gpus(self, gpu_type: str) -> tuple[str, ...]:
        """The job's own model first, then its equivalents in order of preference."""
        extra = [g for g in self.gpu_equivalents.get(gpu_type, []) if g != gpu_type]
        return (gpu_type, *extra)

    def residency_for(self, tenant: str, datasets: tuple[str, ...]) -> list[ResidencyRule]:
        return [r for r in self.residency if r.matches(tenant, datasets)]


def load_policy(data: Mapping[str, Any]) -> SchedulingPolicy:
    """Validate a policy document (parsed YAML/JSON). Raises pydantic.ValidationError."""
    return SchedulingPolicy.model_validate(dict(data))
