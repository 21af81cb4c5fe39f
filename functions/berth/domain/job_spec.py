"""The job spec: what a team submits. Pure pydantic, no I/O.

Contract: ../../docs/api.md and the product brief. Unknown fields are rejected.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_KEY_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
REGION_RE = r"^[a-z]{2}(-gov)?-[a-z]+-\d$"
# Container image reference: [registry/]repo[:tag][@digest]
IMAGE_RE = (
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[\w][\w.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
CODE_RE = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/\S+|sha256:[a-f0-9]{64})$"
DATA_SOURCE_RE = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?|/[^\x00]+|dataset://[a-z0-9][a-z0-9._/-]*)$"
MOUNT_RE = r"^/[A-Za-z0-9._/-]+$"

GPU_TYPES = ("H100", "A100", "A100-80G", "A10G", "L4", "T4", "V100", "L40S", "H200")

RESERVED_ENV_PREFIXES = ("AWS_", "BERTH_", "NVIDIA_", "LD_")
RESERVED_ENV_KEYS = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})

MAX_COMMAND_ARGS = 256
MAX_ARG_LEN = 4096
MAX_ENV_VARS = 128
MAX_ENV_VALUE_LEN = 4096


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class PlacementConstraint(StrEnum):
    AUTO = "auto"
    ONPREM = "onprem"
    CLOUD = "cloud"


class SpotPolicy(StrEnum):
    ALLOWED = "allowed"
    REQUIRED = "required"
    NEVER = "never"


class Priority(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def rank(self) -> int:
        return {"low": 0, "normal": 1, "high": 2}[self.value]


class DataMount(Strict):
    source: Annotated[str, Field(pattern=DATA_SOURCE_RE, max_length=1024)]
    mount: Annotated[str, Field(pattern=MOUNT_RE, max_length=512)]

    @field_validator("mount", "source")
    @classmethod
    def _no_traversal(cls, v: str) -> str:
        if ".." in v.split("/"):
            raise ValueError("paths must not contain '..' segments")
        return v


class Resources(Strict):
    gpu_type: Annotated[str, Field(min_length=1, max_length=32)] = "A100"
    gpus: Annotated[int, Field(strict=True, ge=1, le=64)] = 1
    cpu: Annotated[float, Field(strict=True, gt=0, le=1024)] = 4
    memory_gib: Annotated[float, Field(strict=True, gt=0, le=8192)] = 16
    nodes: Annotated[int, Field(strict=True, ge=1, le=8)] = 1

    @field_validator("gpu_type")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPU_TYPES:
            raise ValueError(f"unknown gpu_type {v!r}; expected one of {', '.join(GPU_TYPES)}")
        return v

    @model_validator(mode="after")
    def _gpus_divide_nodes(self) -> Self:
        if self.gpus % self.nodes != 0:
            raise ValueError(f"gpus ({self.gpus}) must be a multiple of nodes ({self.nodes})")
        return self

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


class Constraints(Strict):
    placement: PlacementConstraint = PlacementConstraint.AUTO
    regions: Annotated[list[Annotated[str, Field(pattern=REGION_RE)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    max_cost_usd: Annotated[float | None, Field(strict=True, gt=0, le=10_000_000)] = None
    max_hourly_usd: Annotated[float | None, Field(strict=True, gt=0, le=100_000)] = None
    spot: SpotPolicy = SpotPolicy.ALLOWED
    priority: Priority = Priority.NORMAL

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.placement is PlacementConstraint.ONPREM and self.spot is SpotPolicy.REQUIRED:
            raise ValueError("spot: required cannot be combined with placement: onprem")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError("regions must not repeat")
        return self


class RetryPolicy(Strict):
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=10)] = 3


class JobSpec(Strict):
    """A training job as submitted. Exactly one of ``image`` or ``code``."""

    name: Annotated[str, Field(pattern=NAME_RE)]
    image: Annotated[str | None, Field(max_length=512, pattern=IMAGE_RE)] = None
    code: Annotated[str | None, Field(max_length=1024, pattern=CODE_RE)] = None
    command: Annotated[
        list[Annotated[str, Field(max_length=MAX_ARG_LEN)]], Field(max_length=MAX_COMMAND_ARGS)
    ] = Field(default_factory=list)
    env: dict[str, Annotated[str, Field(max_length=MAX_ENV_VALUE_LEN)]] = Field(default_factory=dict)
    data: Annotated[list[DataMount], Field(max_length=32)] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    constraints: Constraints = Field(default_factory=Constraints)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_minutes: Annotated[int, Field(strict=True, ge=1, le=60 * 24 * 30)] = 24 * 60
    expected_duration_minutes: Annotated[int | None, Field(strict=True, ge=1, le=60 * 24 * 30)] = None
    """The user's guess of the run time: a hint for placement (burst wait, spot, cost), never a
    limit (``timeout_minutes`` is the limit). The scheduler calibrates it per tenant."""

    @field_validator("expected_duration_minutes")
    @classmethod
    def _estimate_within_timeout(cls, v: int | None, info: ValidationInfo) -> int | None:
        # A hint longer than the limit describes a job the timeout would kill: say so at submit.
        timeout = info.data.get("timeout_minutes")
        if v is not None and isinstance(timeout, int) and v > timeout:
            raise ValueError(
                f"expected_duration_minutes ({v}) is longer than timeout_minutes ({timeout}): "
                "the job would be stopped at the timeout; raise timeout_minutes or lower the estimate"
            )
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError(
                "command must be a list of arguments, not a shell string (e.g. [python, train.py])"
            )
        if isinstance(v, list) and any(isinstance(a, str) and "\x00" in a for a in v):
            raise ValueError("command arguments must not contain NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env_keys(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"at most {MAX_ENV_VARS} env variables")
        for key in v:
            if not re.fullmatch(ENV_KEY_RE, key):
                raise ValueError(f"env key {key!r} must match {ENV_KEY_RE}")
            if key.startswith(RESERVED_ENV_PREFIXES) or key in RESERVED_ENV_KEYS:
                raise ValueError(
                    f"env key {key!r} is reserved: Berth sets AWS_*, BERTH_*, NVIDIA_*, LD_* and "
                    "CUDA_VISIBLE_DEVICES itself (GPU visibility and credentials are not the job's to choose)"
                )
            if "\x00" in v[key]:
                raise ValueError(f"env value of {key!r} contains a NUL byte")
        return v

    @model_validator(mode="after")
    def _image_xor_code(self) -> Self:
        if (self.image is None) == (self.code is None):
            raise ValueError("exactly one of 'image' or 'code' must be given")
        if self.code is not None and not self.command:
            raise ValueError("a code bundle needs a command (e.g. [python, train.py])")
        mounts = [d.mount for d in self.data]
        if len(set(mounts)) != len(mounts):
            raise ValueError("data mounts must be distinct")
        return self
