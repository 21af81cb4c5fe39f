"""Tenants, roles, callers and quotas. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from berth.domain.identity import canonical_principal
from berth.domain.job_spec import GPU_TYPES, INTEGRAL

__all__ = ["Caller", "GpuQuota", "Quota", "Role", "canonical_principal", "valid_tenant_name"]

TENANT_RE = r"^[a-z][a-z0-9-]{1,31}$"


class Role(StrEnum):
    MEMBER = "member"
    ADMIN = "admin"
    HOST = "host"
    """An on-prem host's identity: its membership row's ``tenant`` field holds the host id, and it may
    call the agent API only (never the public API)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as established from the verified IAM identity (never from the body)."""

    principal: str
    tenant: str
    role: Role
    #: The person acting: the role session's name (an SSO user, a CI job) or the IAM user's name.
    actor: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def name(self) -> str:
        return self.actor or self.principal.rsplit("/", 1)[-1]


class GpuQuota(BaseModel):
    # Strict like the job spec: ``false`` or ``"5"`` are refused, not coerced (an int for a float is fine).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    guaranteed: Annotated[int, Field(strict=True, ge=0, le=100_000), INTEGRAL] = 0
    borrow_limit: Annotated[int, Field(strict=True, ge=0, le=100_000), INTEGRAL] = 0


class Quota(BaseModel):
    """A tenant's share of the fleet. ``gpus`` is keyed by GPU model."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    gpus: dict[str, GpuQuota] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": {"enum": list(GPU_TYPES)}}
    )
    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0
    monthly_cloud_budget_usd: Annotated[float | None, Field(ge=0, le=100_000_000)] = None
    max_active_jobs: Annotated[int, Field(strict=True, ge=0, le=1_000_000), INTEGRAL] = 1000

    @field_validator("gpus")
    @classmethod
    def _known_models(cls, v: dict[str, GpuQuota]) -> dict[str, GpuQuota]:
        unknown = sorted(set(v) - set(GPU_TYPES))
        if unknown:
            raise ValueError(f"unknown GPU model(s) {unknown}; expected some of {', '.join(GPU_TYPES)}")
        return v


def valid_tenant_name(name: str) -> bool:
    return re.fullmatch(TENANT_RE, name) is not None
