"""Cluster files: the on-prem fleet, the cloud offers and the simulation's rules (YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from berth.pricing.catalog import load_offers
from berth.scheduler.snapshot import CloudOffer, TenantState
from berth_tools.sim.data import DataSpec


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSpec(_M):
    name: str
    hosts: Annotated[int, Field(ge=0)]
    gpu_type: str
    gpus_per_host: Annotated[int, Field(ge=1, le=64)] = 8
    cpu: Annotated[float, Field(gt=0)] = 64
    memory_gib: Annotated[float, Field(gt=0)] = 488


class SpotSpec(_M):
    interruptions_per_hour: Annotated[float, Field(ge=0)] = 0.0
    """Per instance, Poisson; 0 disables interruptions."""
    seed: int = 0


class CloudSpec(_M):
    regions: list[str] = Field(default_factory=list)
    gpu_types: list[str] | None = None
    instance_types: list[str] | None = None
    startup_delay_s: Annotated[float, Field(ge=0)] = 180.0
    spot: SpotSpec = Field(default_factory=SpotSpec)


class JobDefaults(_M):
    checkpoint_interval_s: Annotated[float | None, Field(gt=0)] = 1800.0
    """None: trace jobs do not checkpoint."""
    cpu_per_gpu: Annotated[float, Field(gt=0)] = 4.0
    memory_gib_per_gpu: Annotated[float, Field(gt=0)] = 32.0
    timeout_s: Annotated[float | None, Field(gt=0)] = None
    """The trace jobs' timeout (a limit the service knows); None: none is known."""


class TenantSpec(_M):
    weight: Annotated[float, Field(gt=0)] = 1.0
    guaranteed_gpus: dict[str, int] = Field(default_factory=dict)
    borrow_limit_gpus: dict[str, int] = Field(default_factory=dict)
    default_borrow_limit: int | None = None
    monthly_budget_usd: float | None = None


class ClusterSpec(_M):
    name: str = "cluster"
    pools: list[PoolSpec] = Field(default_factory=list)
    cloud: CloudSpec = Field(default_factory=CloudSpec)
    jobs: JobDefaults = Field(default_factory=JobDefaults)
    tenant_defaults: TenantSpec = Field(default_factory=TenantSpec)
    tenants: dict[str, TenantSpec] = Field(default_factory=dict)
    pass_interval_s: Annotated[float, Field(ge=0)] = 60.0
    """Scheduling passes run on events, at most once per this interval (0: on every event)."""
    data: DataSpec = Field(default_factory=DataSpec)
    """Datasets, host caches and staging (used by ``berth sim --data-locality``; ``sim/data.py``)."""

    def offers(self) -> tuple[CloudOffer, ...]:
        if not self.cloud.regions:
            return ()
        return load_offers(self.cloud.regions, self.cloud.gpu_types, self.cloud.instance_types)

    def tenant_state(self, name: str) -> TenantState:
        spec = self.tenants.get(name, self.tenant_defaults)
        return TenantState(
            name=name,
            weight=spec.weight,
            guaranteed_gpus=dict(spec.guaranteed_gpus),
            borrow_limit_gpus=dict(spec.borrow_limit_gpus),
            default_borrow_limit=spec.default_borrow_limit,
            monthly_budget_usd=spec.monthly_budget_usd,
        )

    @property
    def onprem_gpus(self) -> int:
        return sum(p.hosts * p.gpus_per_host for p in self.pools)


def parse_cluster(data: dict[str, Any]) -> ClusterSpec:
    return ClusterSpec.model_validate(data)


def load_cluster(path: str | Path) -> ClusterSpec:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a cluster file is a YAML mapping")
    return parse_cluster(data)
