"""Build scheduler inputs from the domain's job spec."""

from __future__ import annotations

from collections.abc import Mapping

from berth.domain.job_spec import JobSpec
from berth.domain.storage import Dataset, Residency
from berth.scheduler.policy import ResidencyRule, SchedulingPolicy
from berth.scheduler.snapshot import PendingJob


def pending_from_spec(
    job_id: str,
    tenant: str,
    spec: JobSpec,
    submitted_at: float,
    *,
    checkpointing: bool = False,
    avoid_hosts: tuple[str, ...] = (),
    avoid_regions: tuple[str, ...] = (),
) -> PendingJob:
    """A PendingJob for a submitted spec. ``cpu`` and ``memory_gib`` of the spec are per node; the
    user's ``expected_duration_minutes`` is the estimate (a hint the predictor calibrates) and the
    spec's name is the job's family in the predictor's history."""
    r = spec.resources
    c = spec.constraints
    return PendingJob(
        job_id=job_id,
        tenant=tenant,
        gpu_type=r.gpu_type,
        gpus=r.gpus,
        submitted_at=submitted_at,
        nodes=r.nodes,
        cpu=r.cpu,
        memory_gib=r.memory_gib,
        placement=c.placement,
        regions=tuple(c.regions),
        spot=c.spot,
        priority=c.priority,
        max_hourly_usd=c.max_hourly_usd,
        max_cost_usd=c.max_cost_usd,
        expected_duration_s=(
            spec.expected_duration_minutes * 60.0 if spec.expected_duration_minutes is not None else None
        ),
        family=spec.name,
        timeout_s=spec.timeout_minutes * 60.0,
        checkpointing=checkpointing,
        datasets=tuple(d.source for d in spec.data),
        avoid_hosts=avoid_hosts,
        avoid_regions=avoid_regions,
    )


def dataset_residency(datasets: Mapping[str, Dataset]) -> list[ResidencyRule]:
    """Registered datasets as the core's residency rules: a job reading ``dataset://NAME`` runs only
    in the pools where the dataset exists, and never in the cloud when it is marked on-prem only."""
    return [
        ResidencyRule(
            name=f"dataset {name}",
            dataset_prefix=f"dataset://{name}",
            onprem_only=ds.residency is Residency.ONPREM_ONLY,
            pools=sorted({loc.pool for loc in ds.locations}),
        )
        for name, ds in sorted(datasets.items())
    ]


def with_dataset_residency(policy: SchedulingPolicy, datasets: Mapping[str, Dataset]) -> SchedulingPolicy:
    """The organisation's policy plus the registered datasets' residency."""
    return policy.model_copy(update={"residency": [*policy.residency, *dataset_residency(datasets)]})
