"""The job spec: what a team submits. Pure pydantic, no I/O.

Contract: ../../docs/api.md and the product brief. Unknown fields are rejected.
"""

from __future__ import annotations

import difflib
import json
import re
from enum import StrEnum
from typing import Annotated, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict, JsonValue, SkipJsonSchema

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_KEY_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
REGION_RE = r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$"
# Container image reference: [registry/]repo[:tag][@digest]
IMAGE_RE = (
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
CODE_RE = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/\S+|sha256:[a-f0-9]{64})$"
DATA_SOURCE_RE = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?|/[^\x00]+|dataset://[a-z0-9][a-z0-9._/-]*)$"
MOUNT_RE = r"^/[A-Za-z0-9._/-]+$"

GPU_TYPES = ("H100", "A100", "A100-80G", "A10G", "L4", "T4", "V100", "L40S", "H200")


def canonical_gpu_type(v: object) -> object:
    """GPU models are matched ignoring case: ``a100`` is ``A100``, ``a100-80g`` is ``A100-80G``."""
    if isinstance(v, str):
        return next((g for g in GPU_TYPES if g.lower() == v.strip().lower()), v)
    return v


#: What a value of a pattern-checked field must look like, in words (by dotted field, ``*`` for a
#: list index or a map key): validation errors say this instead of the regex.
FIELD_FORMS = {
    "name": "is not a job name: 1 to 63 lowercase letters, digits and '-', starting and ending with a "
    "letter or digit (e.g. resnet50-imagenet)",
    "image": "is not an image reference: [registry/]repository[:tag][@sha256:digest], the registry and "
    "repository in lowercase (e.g. registry.example.com/team/train:v1)",
    "code": "is not a code reference: sha256:<64 hex digits> (a bundle you uploaded; berth submit makes "
    "it from code: ./dir) or s3://bucket/key",
    "data.*.source": "is not a data source: s3://bucket/prefix, or dataset://name for a registered dataset",
    "data.*.mount": "is not a mount point: an absolute path of letters, digits, '.', '_', '-' and '/'",
    "constraints.regions.*": "is not an AWS region name (e.g. us-east-1, eu-west-1)",
    "secrets.*": "is not a secret name: berth/<your tenant>/<name> in AWS Secrets Manager "
    "(e.g. berth/vision/wandb-key)",
}

#: Fields with a closed set of values that a validator (not an enum) checks: errors list them.
FIELD_CHOICES: dict[str, tuple[str, ...]] = {"resources.gpu_type": GPU_TYPES}

RESERVED_ENV_PREFIXES = ("AWS_", "BERTH_", "NVIDIA_", "LD_")
RESERVED_ENV_KEYS = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})
_RESERVED_NAME = r"(?:AWS_|BERTH_|NVIDIA_|LD_)[A-Za-z0-9_]*|" + "|".join(sorted(RESERVED_ENV_KEYS))
#: A reserved variable set or unset through the command: ``env NAME=...``, a shell's ``NAME=... cmd``
#: or ``export NAME=...``, ``env -u NAME``, ``unset NAME`` (the argv joined by spaces). A defence in
#: depth: where the host does not enforce GPU isolation, a job's own code can still change its
#: environment (docs/security.md, "GPU isolation").
_RESERVED_IN_COMMAND = re.compile(
    rf"(?:^|[\s;&|(`'\"])(?:export\s+)?({_RESERVED_NAME})="
    rf"|(?:^|[\s;&|(`'\"])(?:unset\s+|-u\s*|--unset=)({_RESERVED_NAME})\b"
)

# The published schema (docs/openapi.json) states every rule the validators below enforce, so a client
# generated from it never sends what the server refuses; tests/functional/test_openapi_fuzz.py checks it.
SAFE_PATH_SCHEMA: JsonDict = {"not": {"pattern": r"(^|/|://)\.{1,2}(/|$)|%(2[eEfF]|5[cC]|00)|\\"}}
# In the schema only: the validators refuse NUL with a clearer message than a pattern would.
NO_NUL: JsonDict = {"pattern": r"^[^\x00]*$"}
ENV_KEYS_SCHEMA: JsonDict = {
    "pattern": ENV_KEY_RE,
    "not": {
        "anyOf": [
            {"pattern": "^(AWS_|BERTH_|NVIDIA_|LD_)"},
            {"enum": ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]},
        ]
    },
}

MAX_COMMAND_ARGS = 256
MAX_SECRETS = 32
#: A Secrets Manager name under a tenant's prefix: berth/<tenant>/<name>.
SECRET_NAME_RE = r"^berth/[a-z][a-z0-9-]{1,31}/[A-Za-z0-9_+=.@-][A-Za-z0-9/_+=.@-]{0,399}$"
MAX_ARG_LEN = 4096
MAX_ENV_VARS = 128
MAX_ENV_VALUE_LEN = 4096


def _integral_number(v: object) -> object:
    """JSON has one number type: ``4.0`` is the integer 4 (as JSON Schema's ``integer`` says); ``4.5``,
    ``true`` and ``"4"`` stay refused by the strict int that follows."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


#: Marks an integer field of a request body (``Annotated[int, Field(strict=True, ...), INTEGRAL]``):
#: strict (no bools, no strings) but integral floats are taken as ints.
INTEGRAL = BeforeValidator(_integral_number)


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


_ENCODED_SEPARATORS = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)


def check_safe_path(v: str) -> str:
    """Refuse what could step out of a prefix or root once some layer decodes or normalises it:
    ``.`` or ``..`` segments, percent-encoded dots, slashes, backslashes or NUL, backslashes."""
    path = v.split("://", 1)[-1]
    if "\\" in path:
        raise ValueError("paths must not contain backslashes")
    if _ENCODED_SEPARATORS.search(path):
        raise ValueError("paths must not contain percent-encoded '.', '/', '\\' or NUL")
    if any(seg in (".", "..") for seg in path.split("/")):
        raise ValueError("paths must not contain '.' or '..' segments")
    return v


class DataMount(Strict):
    source: Annotated[str, Field(pattern=DATA_SOURCE_RE, max_length=1024, json_schema_extra=SAFE_PATH_SCHEMA)]
    mount: Annotated[str, Field(pattern=MOUNT_RE, max_length=512, json_schema_extra=SAFE_PATH_SCHEMA)]

    @field_validator("mount", "source")
    @classmethod
    def _no_traversal(cls, v: str) -> str:
        return check_safe_path(v)


def _gpus_multiple_of_nodes() -> JsonDict:
    """JSON Schema for ``gpus % nodes == 0``: one branch per possible ``nodes``."""
    branches: list[JsonValue] = [{"not": {"required": ["nodes"]}}]
    branches.append({"required": ["nodes"], "properties": {"nodes": {"const": 1}}})
    # gpus defaults to 1, so more than one node needs gpus stated (and a multiple of the nodes).
    branches += [
        {"required": ["nodes", "gpus"], "properties": {"nodes": {"const": n}, "gpus": {"multipleOf": n}}}
        for n in range(2, MAX_NODES + 1)
    ]
    return {"anyOf": branches, "description": "gpus must be a multiple of nodes"}


MAX_NODES = 8


class Resources(Strict):
    model_config = ConfigDict(json_schema_extra=_gpus_multiple_of_nodes())

    gpu_type: Annotated[
        str,
        BeforeValidator(canonical_gpu_type),
        Field(
            min_length=1,
            max_length=32,
            json_schema_extra={"enum": list(GPU_TYPES)},
            description="A GPU model; any case is accepted and stored as listed (a100 is A100)",
        ),
    ] = "A100"
    gpus: Annotated[int, Field(strict=True, ge=1, le=64), INTEGRAL] = 1
    cpu: Annotated[float, Field(strict=True, gt=0, le=1024)] = 4
    memory_gib: Annotated[float, Field(strict=True, gt=0, le=8192)] = 16
    nodes: Annotated[int, Field(strict=True, ge=1, le=MAX_NODES), INTEGRAL] = 1

    @field_validator("gpu_type")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPU_TYPES:
            close = difflib.get_close_matches(v.upper(), GPU_TYPES, n=1, cutoff=0.6)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown GPU model {v!r}{guess}; use one of {', '.join(GPU_TYPES)}")
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
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["placement", "spot"],
                "properties": {"placement": {"const": "onprem"}, "spot": {"const": "required"}},
            },
            "description": "spot: required cannot be combined with placement: onprem",
        }
    )

    placement: PlacementConstraint = PlacementConstraint.AUTO
    regions: Annotated[
        list[Annotated[str, Field(pattern=REGION_RE)]],
        Field(max_length=16, json_schema_extra={"uniqueItems": True}),
    ] = Field(default_factory=list)
    max_cost_usd: Annotated[float, Field(strict=True, gt=0, le=10_000_000)] | SkipJsonSchema[None] = None
    max_hourly_usd: Annotated[float, Field(strict=True, gt=0, le=100_000)] | SkipJsonSchema[None] = None
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
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=10), INTEGRAL] = 3


#: The grace between SIGTERM and SIGKILL when a spec says nothing: the agent's ``cancel_grace_s``
#: default, today's cancel grace.
DEFAULT_GRACE_SECONDS = 30
MAX_GRACE_SECONDS = 900


class CheckpointPolicy(Strict):
    """How a job is stopped (preemption, cancel): SIGTERM, ``grace_seconds`` to write its checkpoint
    into ``BERTH_CHECKPOINT_DIR`` (synced while it does, and before the SIGKILL), then SIGKILL."""

    grace_seconds: Annotated[
        int,
        Field(
            strict=True,
            ge=1,
            le=MAX_GRACE_SECONDS,
            description="Seconds between SIGTERM and SIGKILL when the attempt is preempted or canceled",
        ),
        INTEGRAL,
    ] = DEFAULT_GRACE_SECONDS


MAX_ARRAY_SIZE = 10_000
#: A parameter's name: it becomes ``BERTH_PARAM_<NAME>`` (upper-cased) and ``{name}`` in the command.
PARAM_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MAX_PARAM_KEYS = 32
MAX_PARAM_VALUE_LEN = 1024
#: All parameters of one array, as compact JSON: they are stored with the array in one transaction.
MAX_PARAMETERS_BYTES = 3_000_000

ParamText = Annotated[str, Field(max_length=MAX_PARAM_VALUE_LEN, json_schema_extra=NO_NUL)]
ParamValue = ParamText | int | float | bool


class ArraySpec(Strict):
    """``size`` identical tasks, or one task per entry of ``parameters`` (exactly one of the two)."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["size"], "not": {"required": ["parameters"]}},
                {"required": ["parameters"], "not": {"required": ["size"]}},
            ]
        }
    )

    size: Annotated[int, Field(strict=True, ge=1, le=MAX_ARRAY_SIZE), INTEGRAL] | SkipJsonSchema[None] = None
    parameters: (
        Annotated[
            list[
                Annotated[
                    dict[str, ParamValue],
                    Field(
                        json_schema_extra={
                            "propertyNames": {"pattern": PARAM_NAME_RE},
                            "maxProperties": MAX_PARAM_KEYS,
                            "description": "One task's parameters: names distinct ignoring case (each "
                            "becomes BERTH_PARAM_<NAME>); all parameters at most 3 MB as JSON",
                        }
                    ),
                ]
            ],
            Field(min_length=1, max_length=MAX_ARRAY_SIZE),
        ]
        | SkipJsonSchema[None]
    ) = None

    @field_validator("parameters")
    @classmethod
    def _param_names(cls, v: list[dict[str, object]] | None) -> list[dict[str, object]] | None:
        for i, entry in enumerate(v or []):
            if len(entry) > MAX_PARAM_KEYS:
                raise ValueError(f"parameters[{i}] has more than {MAX_PARAM_KEYS} names")
            for key, value in entry.items():
                if not re.fullmatch(PARAM_NAME_RE, key):
                    raise ValueError(
                        f"parameters[{i}]: name {key!r} is not a parameter name: letters, digits and '_', "
                        "not starting with a digit, at most 64 characters (it becomes the variable "
                        "BERTH_PARAM_<NAME>)"
                    )
                if isinstance(value, str) and "\x00" in value:
                    raise ValueError(f"parameters[{i}].{key} contains a NUL byte")
            if len({k.upper() for k in entry}) != len(entry):
                raise ValueError(f"parameters[{i}]: names differ only in case (BERTH_PARAM_ is upper-case)")
        return v

    @model_validator(mode="after")
    def _size_xor_parameters(self) -> Self:
        if (self.size is None) == (self.parameters is None):
            raise ValueError("an array has exactly one of 'size' or 'parameters'")
        if self.parameters is not None:
            packed = len(json.dumps(self.parameters, separators=(",", ":")))
            if packed > MAX_PARAMETERS_BYTES:
                raise ValueError(
                    f"parameters are {packed} bytes as JSON; at most {MAX_PARAMETERS_BYTES} (store large "
                    "inputs in S3 and pass their keys)"
                )
        return self

    @property
    def count(self) -> int:
        return self.size if self.parameters is None else len(self.parameters)  # type: ignore[return-value]


class ArrayTask(Strict):
    """Set by Berth on each task of an array (never by a user): where it sits in its array."""

    array_id: str
    index: Annotated[int, Field(ge=0, lt=MAX_ARRAY_SIZE)]
    size: Annotated[int, Field(ge=1, le=MAX_ARRAY_SIZE)]
    params: dict[str, str] = Field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """The variables the task's process sees on top of its spec's ``env``."""
        out = {
            "BERTH_ARRAY_ID": self.array_id,
            "BERTH_ARRAY_INDEX": str(self.index),
            "BERTH_ARRAY_SIZE": str(self.size),
        }
        out.update({f"BERTH_PARAM_{k.upper()}": v for k, v in self.params.items()})
        return out


class JobSpec(Strict):
    """A training job as submitted. Exactly one of ``image`` or ``code``; a code bundle needs a
    command; data mounts are distinct."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["image"], "not": {"required": ["code"]}},
                {
                    "required": ["code", "command"],
                    "not": {"required": ["image"]},
                    "properties": {"command": {"minItems": 1}},
                },
            ]
        }
    )

    name: Annotated[str, Field(pattern=NAME_RE)]
    image: Annotated[str, Field(max_length=512, pattern=IMAGE_RE)] | SkipJsonSchema[None] = None
    code: (
        Annotated[str, Field(max_length=1024, pattern=CODE_RE, json_schema_extra=SAFE_PATH_SCHEMA)]
        | SkipJsonSchema[None]
    ) = None
    command: Annotated[
        list[Annotated[str, Field(max_length=MAX_ARG_LEN, json_schema_extra=NO_NUL)]],
        Field(max_length=MAX_COMMAND_ARGS),
    ] = Field(default_factory=list)
    env: Annotated[
        dict[str, Annotated[str, Field(max_length=MAX_ENV_VALUE_LEN, json_schema_extra=NO_NUL)]],
        Field(json_schema_extra={"propertyNames": ENV_KEYS_SCHEMA, "maxProperties": MAX_ENV_VARS}),
    ] = Field(default_factory=dict)
    data: Annotated[list[DataMount], Field(max_length=32)] = Field(default_factory=list)
    secrets: Annotated[
        dict[str, Annotated[str, Field(pattern=SECRET_NAME_RE, max_length=512)]],
        Field(
            json_schema_extra={"propertyNames": ENV_KEYS_SCHEMA, "maxProperties": MAX_SECRETS},
            description="ENV_NAME -> AWS Secrets Manager name under berth/<tenant>/; resolved at run time",
        ),
    ] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    constraints: Constraints = Field(default_factory=Constraints)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_minutes: Annotated[int, Field(strict=True, ge=1, le=60 * 24 * 30), INTEGRAL] = 24 * 60
    expected_duration_minutes: (
        Annotated[
            int,
            Field(
                strict=True,
                ge=1,
                le=60 * 24 * 30,
                description="A hint of the run time, never a limit; at most timeout_minutes",
            ),
            INTEGRAL,
        ]
        | SkipJsonSchema[None]
    ) = None
    """The user's guess of the run time: a hint for placement (burst wait, spot, cost), never a
    limit (``timeout_minutes`` is the limit). The scheduler calibrates it per tenant."""
    array: (
        Annotated[ArraySpec, Field(description="Run this spec as an array of tasks (docs/api.md)")]
        | SkipJsonSchema[None]
    ) = None
    array_task: SkipJsonSchema[ArrayTask | None] = None
    """Set by Berth on each task of an array; a submitted spec that sets it is refused."""
    checkpoint: (
        Annotated[
            CheckpointPolicy,
            Field(description="How the job is stopped: SIGTERM, then grace_seconds to checkpoint"),
        ]
        | SkipJsonSchema[None]
    ) = None

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

    @field_validator("code")
    @classmethod
    def _code_inside_its_prefix(cls, v: str | None) -> str | None:
        return None if v is None else check_safe_path(v)

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError(
                "command must be a list of arguments, not a shell string (e.g. [python, train.py])"
            )
        if isinstance(v, list) and any(isinstance(a, str) and "\x00" in a for a in v):
            raise ValueError("command arguments must not contain NUL bytes")
        if isinstance(v, list):
            found = _RESERVED_IN_COMMAND.search(" ".join(a for a in v if isinstance(a, str)))
            if found:
                name = found.group(1) or found.group(2)
                raise ValueError(
                    f"the command sets or unsets {name}, which is reserved: Berth sets AWS_*, BERTH_*, "
                    "NVIDIA_*, LD_* and CUDA_VISIBLE_DEVICES itself (GPU visibility and credentials are "
                    "not the job's to choose)"
                )
        return v

    @field_validator("env", "secrets")
    @classmethod
    def _env_keys(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"at most {MAX_ENV_VARS} variables")
        for key in v:
            if not re.fullmatch(ENV_KEY_RE, key):
                raise ValueError(
                    f"key {key!r} is not a variable name: letters, digits and '_', not starting with a "
                    "digit, at most 128 characters"
                )
            if key.startswith(RESERVED_ENV_PREFIXES) or key in RESERVED_ENV_KEYS:
                raise ValueError(
                    f"key {key!r} is reserved: Berth sets AWS_*, BERTH_*, NVIDIA_*, LD_* and "
                    "CUDA_VISIBLE_DEVICES itself (GPU visibility and credentials are not the job's to choose)"
                )
            if "\x00" in v[key]:
                raise ValueError(f"value of {key!r} contains a NUL byte")
        return v

    @model_validator(mode="after")
    def _image_xor_code(self) -> Self:
        if (self.image is None) == (self.code is None):
            raise ValueError("exactly one of 'image' or 'code' must be given")
        if self.code is not None and not self.command:
            raise ValueError("a code bundle needs a command (e.g. [python, train.py])")
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"{both} set both in env and in secrets; a variable comes from one place")
        if len(self.secrets) > MAX_SECRETS:
            raise ValueError(f"at most {MAX_SECRETS} secrets")
        mounts = [d.mount for d in self.data]
        if len(set(mounts)) != len(mounts):
            raise ValueError("data mounts must be distinct")
        return self


#: The resource fields whose defaults decide what a job costs and where it fits.
DEFAULTED_RESOURCES = ("gpu_type", "gpus", "cpu", "memory_gib")


def defaults_applied(spec: JobSpec) -> list[str]:
    """The resource fields the submitter left out and Berth filled with its defaults (1 x A100,
    4 CPUs, 16 GiB, one node): ``["resources"]`` when the whole section was left out, else each
    ``resources.<field>``. From pydantic's record of the fields given, so only a spec validated from
    the request itself answers right (a spec dumped and validated again has every field set)."""
    if "resources" not in spec.model_fields_set:
        return ["resources"]
    given = spec.resources.model_fields_set
    return [f"resources.{f}" for f in DEFAULTED_RESOURCES if f not in given]
