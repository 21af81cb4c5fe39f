"""Where a job runs: one ``Site`` type and the typed placement record stored on the job.

The scheduler core decides a placement (``berth.scheduler.decisions``); the job keeps this record of
it, the API returns it, and the workflow branches on ``site``. Pure.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Site(StrEnum):
    ONPREM = "onprem"
    CLOUD = "cloud"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HostGpus(_Record):
    """The GPUs of one host that an attempt holds (``gpu_ids``: device UUIDs once the host reports them)."""

    host_id: str = Field(min_length=1)
    gpus: int = Field(ge=1)
    gpu_ids: tuple[str, ...] = ()


class OnPremPlacement(_Record):
    site: Literal[Site.ONPREM] = Site.ONPREM
    pool: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    hosts: tuple[HostGpus, ...] = Field(min_length=1)
    hourly_usd: float = Field(default=0.0, ge=0.0)
    """The internal rate of its GPUs per hour, fixed when placed (``berth.domain.cost``)."""


#: The most tasks one Batch array job carries (also one BatchGetItem's worth of members).
MAX_BATCH_GROUP = 100


class BatchGroup(_Record):
    """An array task's attempt that runs as a child of a Batch array job with its neighbours: the
    pass that placed them formed the group from consecutive tasks of one array, placed alike, on the
    same attempt number. Child ``k`` of the Batch array job runs task ``first + k``
    (``berth.domain.cloud``, "array groups")."""

    first: int = Field(ge=0)
    size: int = Field(ge=2, le=MAX_BATCH_GROUP)


class CloudPlacement(_Record):
    site: Literal[Site.CLOUD] = Site.CLOUD
    region: str = Field(min_length=1)
    zone: str = ""
    queue: str = Field(min_length=1)
    instance_type: str = Field(min_length=1)
    instances: int = Field(default=1, ge=1)
    gpu_type: str = Field(min_length=1)
    spot: bool = False
    hourly_usd: float = Field(default=0.0, ge=0.0)
    """What the job pays per hour: its instances' whole price, or its GPU share of a shared one."""
    group: BatchGroup | None = None
    """Set when this attempt runs as one child of a Batch array job (None: a Batch job of its own)."""


JobPlacement = Annotated[OnPremPlacement | CloudPlacement, Field(discriminator="site")]
