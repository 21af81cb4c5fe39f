"""Where code, data, outputs and secrets live, and who may read them. Pure.

Layout (docs/data.md):
- artifacts bucket: ``bundles/<tenant>/sha256/<digest>.tar.gz`` (content-addressed, immutable);
- data bucket: ``<tenant>/...`` the tenant's data, ``<tenant>/jobs/<job>/`` a job's outputs and
  checkpoints (every attempt of the job gets the same prefix back, so it can resume);
- secrets: AWS Secrets Manager names under ``berth/<tenant>/``.
Every prefix ends with ``/`` so that ``vision`` never matches ``vision2``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from berth.domain.errors import Forbidden, ValidationFailed
from berth.domain.job_spec import JobSpec, check_safe_path

DIGEST_RE = re.compile(r"^[a-f0-9]{64}$")
SECRET_NAME_RE = r"^berth/[a-z][a-z0-9-]{1,31}/[A-Za-z0-9/_+=.@-]{1,400}$"
DATASET_NAME_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"
BUNDLE_MAX_BYTES = 2 * 1024**3


def bundle_key(tenant: str, digest: str) -> str:
    return f"bundles/{tenant}/sha256/{digest}.tar.gz"


def tenant_data_prefix(tenant: str) -> str:
    return f"{tenant}/"


def job_output_prefix(tenant: str, job_id: str) -> str:
    return f"{tenant}/jobs/{job_id}/"


def job_checkpoint_prefix(tenant: str, job_id: str) -> str:
    """Where every attempt of a job syncs ``$BERTH_CHECKPOINT_DIR`` (and a retry restores it from)."""
    return job_output_prefix(tenant, job_id) + "checkpoints/"


def secret_prefix(tenant: str) -> str:
    return f"berth/{tenant}/"


def parse_digest(code: str) -> str | None:
    """The hex digest of a ``sha256:<hex>`` code reference, else None."""
    if code.startswith("sha256:") and DIGEST_RE.fullmatch(code[7:]):
        return code[7:]
    return None


@dataclass(frozen=True, slots=True)
class S3Location:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return cls(bucket, key)

    def within(self, prefix: S3Location) -> bool:
        """Inside ``prefix`` (whose key is empty or ends with ``/``)."""
        return self.bucket == prefix.bucket and self.key.startswith(prefix.key)


class Residency(StrEnum):
    ANYWHERE = "anywhere"
    ONPREM_ONLY = "onprem-only"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetLocation(_Record):
    pool: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
    root: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]+$", max_length=512)]

    @field_validator("root")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_safe_path(v)


class Dataset(_Record):
    """A named on-prem dataset an admin registered: where it exists and who may read it."""

    locations: Annotated[list[DatasetLocation], Field(min_length=1, max_length=64)]
    tenants: Annotated[list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{1,31}$")]], Field(max_length=1000)]
    residency: Residency = Residency.ANYWHERE


class DataGrants(_Record):
    """S3 prefixes outside its own that an admin granted a tenant (read-only)."""

    s3_prefixes: Annotated[
        list[Annotated[str, Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^\s]*/)?$")]],
        Field(max_length=100),
    ] = Field(default_factory=list)

    @field_validator("s3_prefixes")
    @classmethod
    def _safe(cls, v: list[str]) -> list[str]:
        for p in v:
            check_safe_path(p)
        return v


@dataclass(frozen=True, slots=True)
class StorageLayout:
    """The deployment's buckets (from settings)."""

    artifacts_bucket: str
    data_bucket: str

    def readable_prefixes(self, tenant: str, grants: DataGrants) -> list[S3Location]:
        own = S3Location(self.data_bucket, tenant_data_prefix(tenant))
        return [own, *(S3Location.parse(p) for p in grants.s3_prefixes)]


def check_data_sources(
    spec: JobSpec,
    tenant: str,
    layout: StorageLayout,
    grants: DataGrants,
    datasets: dict[str, Dataset | None],
) -> None:
    """Refuse (403, naming the source) any data or code source the tenant may not read.

    ``datasets`` maps every ``dataset://`` name the spec uses to its record (None if unknown).
    """
    readable = layout.readable_prefixes(tenant, grants)
    sources = [d.source for d in spec.data]
    if spec.code is not None and spec.code.startswith("s3://"):
        sources.append(spec.code)
    for source in sources:
        if source.startswith("s3://"):
            loc = S3Location.parse(source)
            if not any(loc.within(p) for p in readable):
                raise Forbidden(
                    f"data source {source} is outside tenant {tenant!r}'s data "
                    f"(s3://{layout.data_bucket}/{tenant_data_prefix(tenant)}) and its granted prefixes",
                    details={"source": source},
                )
        elif source.startswith("dataset://"):
            name = source.removeprefix("dataset://").split("/", 1)[0]
            ds = datasets.get(name)
            if ds is None or tenant not in ds.tenants:
                raise Forbidden(
                    f"data source {source}: no dataset {name!r} readable by tenant {tenant!r}",
                    details={"source": source},
                )
        else:
            raise Forbidden(
                f"data source {source}: host paths are not allowed; an admin registers on-prem data "
                "as a dataset (PUT /v1/datasets/NAME) and jobs name it dataset://NAME",
                details={"source": source},
            )


def dataset_names(spec: JobSpec) -> list[str]:
    return sorted(
        {
            d.source.removeprefix("dataset://").split("/", 1)[0]
            for d in spec.data
            if d.source.startswith("dataset://")
        }
    )


def check_secret_names(spec_secrets: dict[str, str], tenant: str) -> None:
    """Secret names must sit under the tenant's own prefix (403 naming the secret otherwise)."""
    for env_name, name in spec_secrets.items():
        if not name.startswith(secret_prefix(tenant)):
            raise Forbidden(
                f"secret {name!r} (for {env_name}) is not under tenant {tenant!r}'s prefix "
                f"{secret_prefix(tenant)}",
                details={"secret": name},
            )


def check_bundle_size(size: int) -> None:
    if size <= 0 or size > BUNDLE_MAX_BYTES:
        raise ValidationFailed(f"bundle size must be 1..{BUNDLE_MAX_BYTES} bytes, got {size}")
