"""What the control plane sends its on-prem agents (docs/agent-protocol.md), as models both sides import.

The control plane builds these and sends ``model_dump(mode="json")``; the agent (``berth_agent``, a
separate deployable of its own version) parses what it receives with the same models, so the two
cannot drift apart field by field. Compatibility rules, protocol ``PROTOCOL_VERSION``:

- every model here ignores fields it does not know: an agent reads the answers of a newer control
  plane (a field added there is simply unseen by an older agent); fields are only ever added, with a
  default, never renamed or retyped within a protocol version;
- a directive's ``action`` is any string: an agent acts on the ones it knows and logs the others;
- a work message names its ``protocol``: an agent refuses (deletes, logs) a message of another one.

What agents send the control plane (heartbeats, reports) is in ``berth.domain.workflow``
(``HeartbeatRequest``, ``AttemptReport``), validated strictly by the agent API (unknown fields 422).
Tests: ``tests/unit/test_agent_wire.py`` (round trips, an older agent's view of today's answers).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from berth.domain.job_spec import JobSpec

#: The protocol version in every work message and register answer.
PROTOCOL_VERSION = 1


class _FromControlPlane(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class WorkMessage(_FromControlPlane):
    """What the control plane puts on a host's queue: a pointer to an attempt, never a secret."""

    protocol: Literal[1] = 1
    kind: Literal["run"] = "run"
    job_id: Annotated[str, Field(min_length=1)]
    attempt: Annotated[int, Field(ge=1)]
    fencing_token: Annotated[str, Field(min_length=1)]
    rank: Annotated[int, Field(ge=0)]
    world_size: Annotated[int, Field(ge=1)]
    gpu_ids: tuple[str, ...]
    claim_by: datetime


class Directive(_FromControlPlane):
    """One instruction in a heartbeat answer: ``cancel``/``stop`` an attempt, ``drain`` the host, or
    ``clear-gpu-fault``: an admin cleared the fault ``fault_id`` of GPU ``gpu_id`` (the agent forgets
    it, and reports the GPU again only if it fails again)."""

    job_id: str | None = None
    attempt: int | None = None
    action: str
    reason: str = ""
    gpu_id: str | None = None
    fault_id: str | None = None

    @model_serializer(mode="wrap")
    def _without_unset_gpu(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The GPU fields only on a GPU directive: the other directives look as they always did."""
        out: dict[str, Any] = handler(self)
        for name in ("gpu_id", "fault_id"):
            if out.get(name) is None:
                out.pop(name, None)
        return out


class RegisterAnswer(_FromControlPlane):
    host_id: str
    queue_url: str
    lease_expires_at: datetime | None = None
    lease_s: Annotated[float, Field(gt=0)]
    #: How long past the lease the agent keeps its attempts when it cannot reach the control plane
    #: (0 from a control plane that predates it: stop at the lease).
    outage_tolerance_s: Annotated[float, Field(ge=0)] = 0.0
    heartbeat_s: Annotated[float, Field(gt=0)]
    protocol: int = PROTOCOL_VERSION


class HeartbeatAnswer(_FromControlPlane):
    lease_expires_at: datetime | None = None
    directives: tuple[Directive, ...] = ()
    #: The host was marked lost: it must register again (its listed attempts come with ``stop``).
    reregister: bool = False


class AttemptCredentials(_FromControlPlane):
    """An attempt's scoped STS credentials as ``POST /v1/agent/credentials`` answers them (the names
    the AWS SDKs' ``credential_process`` documents use); also in a claim's answer, so an agent starting
    an attempt needs no request of its own for them. The secrets stay out of ``repr``."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    access_key_id: str = Field(alias="AccessKeyId", min_length=1)
    secret_access_key: str = Field(alias="SecretAccessKey", min_length=1, repr=False)
    session_token: str = Field(alias="SessionToken", min_length=1, repr=False)
    expiration: str = Field(alias="Expiration", min_length=1)

    def wire(self) -> dict[str, str]:
        """The answer as sent: ``{"AccessKeyId": ..., "Expiration": ...}``."""
        return self.model_dump(mode="json")


class ClaimAnswer(_FromControlPlane):
    """The answer to a claim: the attempt to run on this host (rank ``rank`` of ``world_size``).
    ``credentials``: the attempt's scoped credentials, vended with the claim; absent when this
    deployment vends none or vending failed (the agent then asks ``/v1/agent/credentials``)."""

    job_id: str
    attempt: Annotated[int, Field(ge=1)]
    tenant: str
    spec: JobSpec
    gpu_ids: tuple[str, ...] = ()
    rank: Annotated[int, Field(ge=0)] = 0
    world_size: Annotated[int, Field(ge=1)] = 1
    hosts: tuple[str, ...] = ()
    master_addr: str | None = None
    master_port: int | None = None
    heartbeat_s: float | None = None
    credentials: AttemptCredentials | None = Field(default=None, repr=False)


# -- what an agent says of its host's object cache (in its heartbeat; docs/agent-protocol.md) ----------

#: At most this many entries in one heartbeat's ``cached_datasets`` (the most recently used first):
#: the host record stays small (DynamoDB reads it on every pass) whatever the cache holds.
MAX_CACHED_DATASETS = 64
#: The longest data source an entry names (a spec's ``data[].source`` is shorter in practice).
MAX_CACHED_SOURCE_CHARS = 1024


class CachedDataset(BaseModel):
    """One data source whose objects the host's cache holds in full: the source as a job spec names
    it (``s3://bucket/prefix/`` or ``s3://bucket/key``), the version the agent staged last (a digest
    of its objects' keys and S3 versions or ETags) and its size. Sent by agents, so strict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Annotated[str, Field(min_length=6, max_length=MAX_CACHED_SOURCE_CHARS, pattern=r"^s3://")]
    version: Annotated[str, Field(min_length=1, max_length=128)]
    size_bytes: Annotated[int, Field(ge=0)]


# -- the Batch launcher's document (``BERTH_LAUNCH``; docs/cloud.md) ----------------------------------


class LaunchCode(_FromControlPlane):
    uri: str
    digest: str


class LaunchData(_FromControlPlane):
    source: str
    mount: str


class LaunchOutputs(_FromControlPlane):
    bucket: str | None = None
    prefix: str | None = None


class LaunchTask(_FromControlPlane):
    """One row of a group's table: what differs between the tasks of one Batch array job."""

    job_id: Annotated[str, Field(min_length=1)]
    command: Annotated[tuple[str, ...], Field(min_length=1)]
    array_env: dict[str, str] = Field(default_factory=dict)


class LaunchDocument(_FromControlPlane):
    """What the launcher (``python -m berth_agent.launch``) of a code-bundle job runs: the control
    plane writes it into the container's ``BERTH_LAUNCH``; for a group's Batch array job, the
    per-task fields come from row ``AWS_BATCH_JOB_ARRAY_INDEX`` of ``tasks`` (``LaunchTask``)."""

    job_id: Annotated[str, Field(min_length=1)]
    attempt: Annotated[int, Field(ge=1)]
    tenant: Annotated[str, Field(min_length=1)]
    command: Annotated[tuple[str, ...], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    array_env: dict[str, str] = Field(default_factory=dict)
    code: LaunchCode | None = None
    data: tuple[LaunchData, ...] = ()
    outputs: LaunchOutputs = Field(default_factory=LaunchOutputs)
    checkpoint_prefix: str | None = None
    timeout_s: float | None = None
    aws_region: str = "us-east-1"
    endpoint_url: str | None = None
    sync_interval_s: float | None = None
    grace_s: float | None = None
    #: Names of variables ECS resolved from Secrets Manager (the values never sit in the document).
    secret_env: tuple[Annotated[str, Field(min_length=1)], ...] = ()
