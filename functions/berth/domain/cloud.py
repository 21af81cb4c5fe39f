"""The cloud branch's pure parts (AWS Batch): names, the submission an attempt becomes, what a Batch
job's outcome means in the failure taxonomy, and the circuit signals it raises. Pure.

Names are fixed by ``docs/cloud.md`` (shared with the Batch stacks and the local Batch runner): a
Batch job is named ``<job_id>-a<attempt>``, a job definition ``berth-img-<sha256(image)[:16]>-<tenant>``
(``-s<sha256(secrets)[:16]>`` appended when the job names secrets: they live in the definition;
``-mnp`` for the multi-node parallel definition of a gang, ``resources.nodes`` > 1). A node of a
multi-node parallel job is ``<batch job id>#<node index>`` (Batch's own naming).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from berth.domain.agent_wire import LaunchCode, LaunchData, LaunchDocument, LaunchOutputs
from berth.domain.errors import DomainError
from berth.domain.job import Job
from berth.domain.placement import MAX_BATCH_GROUP, BatchGroup, CloudPlacement
from berth.domain.reasons import exit_words, logs_pointer
from berth.domain.storage import bundle_key, job_checkpoint_prefix, job_output_prefix, parse_digest
from berth.domain.workflow import Failure

#: A Batch job name: letters, digits, hyphens and underscores, at most 128.
_JOB_NAME_RE = re.compile(r"^(?P<job>[A-Za-z0-9_-]+)-a(?P<attempt>[0-9]{1,4})$")
#: ``Host EC2 (instance i-0abc) terminated.``: Batch's reason when the instance under a job went away.
_HOST_TERMINATED_RE = re.compile(r"^Host EC2 \(instance [^)]*\) terminated", re.IGNORECASE)
#: ``arn:aws:secretsmanager:us-east-1:123456789012:secret:`` before a secret's name.
_SECRET_ARN_RE = re.compile(r"arn:[a-z-]+:secretsmanager:[a-z0-9-]*:[0-9]*:secret:")
_CAPACITY_MARKERS = ("CAPACITY_UNAVAILABLE", "INSUFFICIENT_INSTANCE_CAPACITY", "INSUFFICIENTINSTANCECAPACITY")
#: The launcher's exit code when the command ran past ``timeout_s`` (as ``timeout(1)``).
TIMEOUT_EXIT_CODE = 124
#: The launcher's exit code when the code bundle is a broken archive (``berth_agent.launch``).
LAUNCHER_INVALID_BUNDLE_EXIT = 66
#: Batch's reason for a container that exited by itself (its exit code says how).
_CONTAINER_EXITED = "Essential container in task exited"
#: Batch's own reason when ``attemptDurationSeconds`` ran out.
_BATCH_TIMEOUT_REASON = "Job attempt duration exceeded timeout"
REGION_WIDE = "*"
#: The start of the reason Berth gives TerminateJob: such a job failed because Berth stopped it (a
#: cancel, a preemption, an attempt given up), never because of the cloud.
TERMINATED_BY_BERTH = "Berth: "
LAUNCH_COMMAND = ("python", "-m", "berth_agent.launch")
#: The reason Berth gives TerminateJob when one node of a gang (a multi-node parallel job) failed: Batch
#: ends such a job only when its main node exits, so Berth ends it for a child node (fail fast). The
#: attempt fails as that node's exit (``NonZeroExit``), not as a cancel.
GANG_NODE_FAILED = "Berth gang: node "
#: The suffix of a multi-node parallel job definition's name.
MULTINODE_SUFFIX = "-mnp"


def batch_job_name(job_id: str, attempt: int) -> str:
    """``<job id>-a<attempt>``; an array task's ``:`` becomes ``_`` (Batch names allow neither ``:``)."""
    return f"{job_id.replace(':', '_')}-a{attempt}"


def parse_batch_job_name(name: str) -> tuple[str, int] | None:
    """``(job_id, attempt)`` of a Batch job Berth submitted, else None."""
    m = _JOB_NAME_RE.fullmatch(name or "")
    return None if m is None else (m["job"].replace("_", ":"), int(m["attempt"]))


_GROUP_NAME_RE = re.compile(
    r"^(?P<array>j-[0-9a-z]{26})_(?P<first>[0-9]{1,5})-(?P<last>[0-9]{1,5})-g(?P<attempt>[0-9]{1,4})$"
)


def batch_group_name(array_id: str, group: BatchGroup, attempt: int) -> str:
    """``<array id>_<first>-<last>-g<attempt>``: the Batch array job of a group of array tasks."""
    return f"{array_id}_{group.first}-{group.first + group.size - 1}-g{attempt}"


def expected_batch_name(job: Job) -> str:
    """The name of the Batch job the job's current attempt runs in: its own, or its group's."""
    placement = job.placement
    if isinstance(placement, CloudPlacement) and placement.group is not None and job.spec.array_task:
        return batch_group_name(job.spec.array_task.array_id, placement.group, job.attempts)
    return batch_job_name(job.id, job.attempts)


def group_child_id(parent_batch_job_id: str, index: int) -> str:
    """A child of an array job, as Batch names it: ``<parent job id>:<index>``."""
    return f"{parent_batch_job_id}:{index}"


def batch_job_task(batch_job_id: str, name: str) -> tuple[str, int] | None:
    """``(job_id, attempt)`` of the Berth attempt a Batch job runs: from its name, or, for a child
    of a group's array job, from the group's name and the child's index. None for a Batch job that
    is not Berth's, and for a group's parent array job (it runs nothing itself)."""
    single = parse_batch_job_name(name)
    if single is not None:
        return single
    m = _GROUP_NAME_RE.fullmatch(name or "")
    parent, sep, child = (batch_job_id or "").rpartition(":")
    if m is None or not sep or not parent or not child.isdigit():
        return None
    first, last, index = int(m["first"]), int(m["last"]), int(child)
    if first + index > last:
        return None
    return f"{m['array']}:{first + index}", int(m["attempt"])


def job_definition_name(
    image: str, tenant: str, secrets: tuple[tuple[str, str], ...] = (), multinode: bool = False
) -> str:
    """One job definition per image (and tenant: Batch takes the job role from the definition, never
    from SubmitJob), registered once and reused by every job of that image and tenant. A job that
    names secrets gets the definition of its secret set too (``(ENV_NAME, secret ARN)`` pairs: ECS
    resolves a definition's ``secrets`` with its execution role, SubmitJob cannot override them).
    A gang's is a multi-node parallel definition (``type: multinode``, a job definition's type
    cannot be overridden at submit): its own name, ``-mnp``."""
    name = f"berth-img-{hashlib.sha256(image.encode()).hexdigest()[:16]}-{tenant}"
    if secrets:
        canonical = json.dumps(sorted([list(p) for p in secrets]), separators=(",", ":"))
        name += f"-s{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"
    return name + (MULTINODE_SUFFIX if multinode else "")


def node_job_id(batch_job_id: str, index: int) -> str:
    """A node of a multi-node parallel job, as Batch names it: ``<job id>#<node index>``."""
    return f"{batch_job_id}#{index}"


def parse_node_job_id(batch_job_id: str) -> tuple[str, int] | None:
    """``(parent Batch job id, node index)`` of a node of a multi-node parallel job, else None."""
    parent, sep, index = (batch_job_id or "").rpartition("#")
    return (parent, int(index)) if sep and parent and index.isdigit() else None


def job_role_name(tenant: str) -> str:
    """The per-tenant job role the Batch container runs as (created by the stack)."""
    return f"Berth-job-{tenant}"


def execution_role_name(tenant: str) -> str:
    """The per-tenant ECS execution role that resolves a definition's ``secrets`` (created by the
    stack; it may read only ``berth/<tenant>/*``)."""
    return f"Berth-exec-{tenant}"


class SecretScopeError(DomainError):
    """A stored spec names a secret outside its tenant's prefix (the submit check was bypassed)."""

    code = "SecretScopeError"


def secret_arn(name: str, region: str, account: str, partition: str = "aws") -> str:
    """The partial ARN (no ``-XXXXXX`` suffix) ECS takes as a secret's ``valueFrom``: secrets live in
    the home region, jobs may run in any region, so a name alone would not do."""
    return f"arn:{partition}:secretsmanager:{region}:{account}:secret:{name}"


def batch_secrets(
    spec_secrets: dict[str, str], tenant: str, settings: CloudSettings
) -> tuple[tuple[str, str], ...]:
    """``(ENV_NAME, valueFrom)`` of a job's secrets, sorted; every name re-checked against the tenant's
    ``berth/<tenant>/`` prefix (the stored spec is not trusted alone). Raises ``SecretScopeError``."""
    prefix = f"berth/{tenant}/"
    out = []
    for env_name, name in sorted(spec_secrets.items()):
        rest = name[len(prefix) :] if name.startswith(prefix) else ""
        if not rest or rest.startswith("/") or "*" in name or "?" in name:
            raise SecretScopeError(
                f"secret {name!r} (for {env_name}) is not under tenant {tenant!r}'s prefix {prefix}",
                details={"secret": name},
            )
        if not settings.account or not settings.home_region:
            raise SecretScopeError(
                "this deployment cannot pass secrets to Batch jobs (no account or home region configured)"
            )
        out.append((env_name, secret_arn(name, settings.home_region, settings.account, settings.partition)))
    return tuple(out)


def region_of_queue_arn(arn: str) -> str | None:
    """``arn:aws:batch:<region>:<account>:job-queue/<name>`` -> region."""
    parts = arn.split(":")
    return parts[3] if len(parts) >= 6 and parts[2] == "batch" else None


class BatchStatus(StrEnum):
    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    RUNNABLE = "RUNNABLE"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (BatchStatus.SUCCEEDED, BatchStatus.FAILED)

    @property
    def is_queued(self) -> bool:
        """Waiting for an instance (the time a capacity shortage shows up as)."""
        return self in (BatchStatus.SUBMITTED, BatchStatus.PENDING, BatchStatus.RUNNABLE)


#: The state changes the cloud branch acts on: both event rules (each region's, the home bus's)
#: forward only these; SUBMITTED..STARTING change nothing Berth keeps (the sweep watches waits).
ACTED_ON_STATUSES = (BatchStatus.RUNNING, BatchStatus.SUCCEEDED, BatchStatus.FAILED)


@dataclass(frozen=True, slots=True)
class BatchJob:
    """What DescribeJobs says about one Batch job (the only source the cloud branch trusts)."""

    batch_job_id: str
    name: str
    status: BatchStatus
    status_reason: str = ""
    exit_code: int | None = None
    container_reason: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    #: ``stoppedAt``: when the job reached SUCCEEDED or FAILED; None while it has not.
    stopped_at: datetime | None = None
    #: ``container.logStreamName``: the stream the awslogs driver writes the container's output to
    #: (``<awslogs-stream-prefix>/default/<ECS task id>``); None until the container has started.
    log_stream: str | None = None


# -- errors the Batch adapter raises (AWS errors translated) ----------------------------------------


class CloudError(DomainError):
    """A Batch or EC2 API call failed; ``region`` names where."""

    code = "CloudError"

    def __init__(self, message: str, region: str, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.region = region


class CloudThrottled(CloudError):
    """Throttled beyond the adapter's own backoff: try again later (the message stays queued)."""

    code = "CloudThrottled"


class CloudOutcomeUnknown(CloudError):
    """A call that creates something (SubmitJob) failed in a way that leaves open whether it took
    effect (a timeout, a dropped connection, a 5xx), and no job of its name is found: the request
    goes back to its queue, and its redelivery looks the job up by name again before submitting."""


class CloudUnavailable(CloudError):
    """The region's API answered 5xx or could not be reached (an outage: feeds the region circuit)."""

    code = "CloudUnavailable"


class CloudRejected(CloudError):
    """The API refused the request (4xx other than throttling): a queue missing, a bad definition."""

    code = "CloudRejected"


# -- the outcome of a Batch job in the failure taxonomy ---------------------------------------------


@dataclass(frozen=True, slots=True)
class CloudOutcome:
    """A finished Batch job's failure: the ``Failure`` kind, its detail, and the circuit it feeds
    (``(region, instance type or '*')``; None: not the cloud's fault)."""

    failure: Failure
    detail: str
    circuit: tuple[str, str] | None = None


#: Reasons a container could not start because of the job itself (its image, entry point or
#: command): the same in every region, so permanent and never counted against a circuit.
_JOB_START_MARKERS = (
    "executable file not found",
    "command not found",
    "no such file or directory",
    "exec format error",
    "permission denied",
    "not found in $path",
    "invalid reference format",
    "manifest unknown",
    "manifest for",
    "repository does not exist",
    "pull access denied",
    "not found: manifest",
    "no such image",
    "requested access to the resource is denied",
    "unauthorized",
    ": not found",
)
#: ... unless the instance names itself as why (its GPU driver, its disk, its network): the cloud's.
_INSTANCE_START_MARKERS = (
    "nvidia",
    "no space left on device",
    "devmapper",
    "thin pool",
    "toomanyrequests",
    "timeout",
    "deadline exceeded",
    "connection reset",
    "connection refused",
)
#: ECS/Batch reasons of a container that never started: the job's fault when a job marker names why,
#: else the instance's (a GPU driver, a full disk, a Docker daemon that did not answer).
_CONTAINER_START_ERRORS = (
    "CannotPullContainerError",
    "CannotStartContainerError",
    "CannotCreateContainerError",
    "CannotInspectContainerError",
    "ResourceInitializationError",
)


def container_start_error(text: str) -> tuple[str, bool] | None:
    """``(error name, the job's fault)`` when ``text`` says the container could not start, else None.
    The job's fault: its image cannot be pulled as named, or its entry point or command does not exist
    or cannot run (``CannotStartContainerError: ... executable file not found in $PATH``). Anything
    else (``CannotInspectContainerError``, a driver or disk error, a registry timeout) is the cloud's."""
    name = next((n for n in _CONTAINER_START_ERRORS if n in text), None)
    if name is None:
        return None
    lower = text.lower()
    if any(m in lower for m in _INSTANCE_START_MARKERS):
        return name, False
    return name, any(m in lower for m in _JOB_START_MARKERS)


def gang_node_reason(index: int, node: BatchJob) -> str:
    """The reason Berth ends a gang with when its node ``index`` failed as ``node`` says: the node
    and its exit, and Batch's reason for it unless that is only "the container exited"."""
    why = node.status_reason.strip()
    tail = f": {why}" if why and not why.startswith(_CONTAINER_EXITED) else ""
    return f"{GANG_NODE_FAILED}{index} {exit_words(node.exit_code)}{tail}"[:256]


def _gang_outcome(job: BatchJob, placement: CloudPlacement, node_part: str, launcher: bool) -> CloudOutcome:
    """A gang Berth ended for one node: that node's instance going away, or no capacity for it, is
    the cloud's (as for a single job); anything else is the node's exit (``NonZeroExit``)."""
    detail = f"{placement.region} {placement.instance_type}: gang {node_part}"
    _, sep, why = node_part.partition(": ")
    if sep:
        inner = failed_outcome(
            replace(job, status_reason=why, container_reason="", exit_code=None), placement
        )
        if inner.failure in (Failure.SPOT_INTERRUPTION, Failure.CAPACITY):
            return CloudOutcome(inner.failure, detail, inner.circuit)
    return CloudOutcome(Failure.NONZERO_EXIT, detail)


def failed_outcome(job: BatchJob, placement: CloudPlacement, launcher: bool = False) -> CloudOutcome:
    """What a FAILED Batch job means (docs/cloud.md, failure mapping).

    The instance going away under the job (spot reclaimed it) is a spot interruption: transient, not
    counted, resumes from the last checkpoint. A capacity reason is ``Capacity``. A timeout (Batch's
    own, or the launcher's exit 124) is the job's ``Timeout``. Any other exit code is the job's
    ``NonZeroExit`` (its retry rules). A container that could not start because of the job (an image
    not found, an entry point or command that does not exist) is the job's ``BadImage`` (permanent,
    no circuit); one that could not start for the instance's reasons, or no exit code and no known
    reason, is the cloud's (``CloudApiError``: transient), counted against the (region, instance
    type) circuit only: one instance type's trouble never closes a region to the others. A
    ``launcher`` (code-bundle) job's exit 66 is the launcher's: a broken bundle, ``InvalidBundle``.
    """
    reason = job.status_reason or ""
    # Batch often repeats the reason as the container's: say it once
    text = " ".join(dict.fromkeys(x.strip() for x in (reason, job.container_reason) if x.strip()))
    where = f"{placement.region} {placement.instance_type}"
    own_circuit = (placement.region, placement.instance_type)
    if reason.startswith(GANG_NODE_FAILED):
        return _gang_outcome(job, placement, reason[len("Berth gang: ") :], launcher)
    if reason.startswith(TERMINATED_BY_BERTH):
        return CloudOutcome(Failure.CANCELED, f"{where}: {reason}")
    if _HOST_TERMINATED_RE.match(reason) or ("spot" in reason.lower() and "interrupt" in reason.lower()):
        return CloudOutcome(Failure.SPOT_INTERRUPTION, f"{where}: {text}", own_circuit)
    if any(m in text.upper().replace(" ", "_") for m in _CAPACITY_MARKERS):
        return CloudOutcome(Failure.CAPACITY, f"{where}: {text}", own_circuit)
    if job.exit_code == TIMEOUT_EXIT_CODE or reason.startswith(_BATCH_TIMEOUT_REASON):
        return CloudOutcome(Failure.TIMEOUT, f"{where}: {text or 'timed out'}")
    if launcher and job.exit_code == LAUNCHER_INVALID_BUNDLE_EXIT:
        return CloudOutcome(
            Failure.INVALID_BUNDLE, f"{where}: exit code 66: the code bundle is a broken archive"
        )
    if job.exit_code is not None and job.exit_code != 0:
        # Berth's words and where the output is (never the output: docs/security.md, reasons).
        named = parse_batch_job_name(job.name)
        pointer = f"; {logs_pointer(named[0])}" if named else ""
        return CloudOutcome(Failure.NONZERO_EXIT, f"{where}: {exit_words(job.exit_code)}{pointer}")
    if "ResourceInitializationError" in text and "secret" in text.lower():
        # ECS could not read a secret the definition names with the execution role (missing, or not
        # the tenant's): the job's own mistake, the same everywhere, so never retried.
        # ECS's reason is long ("...: unable to retrieve secret from asm: <why>"): keep why, and the
        # secret's name rather than its ARN, so the job's reason (cut at 256) still names it.
        why = _SECRET_ARN_RE.sub("", text.rsplit(" from asm: ", 1)[-1])
        return CloudOutcome(
            Failure.INVALID_SPEC, f"{where}: a secret could not be read (ResourceInitializationError): {why}"
        )
    start = container_start_error(text)
    if start is not None and start[1]:
        return CloudOutcome(Failure.BAD_IMAGE, f"{where}: the container could not start ({text})")
    if start is not None:
        return CloudOutcome(
            Failure.CLOUD_API, f"{where}: the instance could not start it ({text})", own_circuit
        )
    return CloudOutcome(Failure.CLOUD_API, f"{where}: {text or 'the Batch job failed'}", own_circuit)


# -- the submission ---------------------------------------------------------------------------------


class SubmitRequest(BaseModel):
    """A message on the submit queue: a pointer to an attempt, never a spec or a secret."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: Annotated[str, Field(min_length=1, max_length=64)]
    attempt: Annotated[int, Field(ge=1, le=1000)]
    action: str = "submit"
    group: Annotated[str | None, Field(max_length=128)] = None
    """The attempt's Batch array group (``batch_group_name``), if it runs in one: the group's requests
    share one FIFO message group, so its array job is submitted by one of them at a time."""

    @property
    def message_group(self) -> str:
        return self.group or self.job_id

    @property
    def dedup_id(self) -> str:
        return f"{self.action}-{batch_job_name(self.job_id, self.attempt)}"


@dataclass(frozen=True, slots=True)
class CloudSettings:
    """What the cloud branch needs to know about the deployment."""

    base_image: str = "public.ecr.aws/docker/library/python:3.11-slim"
    """The image code-bundle jobs run in (with ``python -m berth_agent.launch``)."""
    artifacts_bucket: str = ""
    data_bucket: str = ""
    runnable_timeout_s: int = 600
    """A cloud attempt waiting this long for an instance (SUBMITTED..RUNNABLE) fails as ``Capacity``."""
    submit_grace_s: int = 120
    """A dispatched attempt with no Batch job after this long gets its submit request sent again."""
    event_grace_s: int = 60
    """The sweep leaves a Batch outcome younger than this (since ``stoppedAt``) to the job's own
    state-change event, so the attempt's token is answered once; older, the event was missed."""
    account: str = ""
    partition: str = "aws"
    endpoint_url: str | None = None
    """A custom AWS endpoint the launcher talks to; None for AWS's own."""
    home_region: str = ""
    """The control plane's region: where the tenants' secrets live (their ``valueFrom`` ARNs)."""


@dataclass(frozen=True, slots=True)
class BatchSubmission:
    """Everything SubmitJob needs, decided from the job record (never from an event)."""

    region: str
    queue: str
    name: str
    image: str
    definition: str
    command: tuple[str, ...]
    environment: dict[str, str]
    gpus: int
    vcpus: int
    memory_mib: int
    timeout_s: int
    tenant: str
    job_role: str
    tags: dict[str, str] = field(default_factory=dict)
    secrets: tuple[tuple[str, str], ...] = ()
    """``(ENV_NAME, secret ARN)``: names only, resolved by ECS with ``execution_role`` at start."""
    execution_role: str = ""
    array_size: int = 0
    """Children of the Batch array job this submission is (0: a single job)."""
    num_nodes: int = 1
    """Nodes of the multi-node parallel job this submission is (1: a single container); each node
    gets ``gpus``, ``vcpus`` and ``memory_mib`` on an instance of its own."""


def submission(job: Job, placement: CloudPlacement, settings: CloudSettings) -> BatchSubmission:
    """The Batch job an attempt becomes: image jobs run their image with their command; code-bundle
    jobs run the base image with the launcher, which fetches and verifies the bundle (BERTH_LAUNCH)."""
    spec = job.spec
    attempt = job.attempts
    name = batch_job_name(job.id, attempt)
    timeout_s = spec.timeout_minutes * 60
    outputs = job_output_prefix(job.tenant, job.id)
    berth_env = {
        "BERTH_JOB_ID": job.id,
        "BERTH_ATTEMPT": str(attempt),
        "BERTH_TENANT": job.tenant,
    }
    tags = dict(berth_env)
    array_env = {} if spec.array_task is None else spec.array_task.env()
    berth_env.update(array_env)
    code: dict[str, str] | None = None
    if spec.code is not None:
        digest = parse_digest(spec.code)
        uri = f"s3://{settings.artifacts_bucket}/{bundle_key(job.tenant, digest)}" if digest else spec.code
        # the launcher takes the reference as the job names it (``sha256:<hex>``), as its agent does
        code = {"uri": uri, "digest": f"sha256:{digest}" if digest else ""}
    image = spec.image or settings.base_image
    secrets = batch_secrets(dict(spec.secrets), job.tenant, settings)
    launch = LaunchDocument(
        job_id=job.id,
        attempt=attempt,
        tenant=job.tenant,
        command=tuple(spec.command),
        env=dict(spec.env),
        array_env=array_env,
        code=None if code is None else LaunchCode.model_validate(code),
        data=tuple(LaunchData(source=d.source, mount=d.mount) for d in spec.data),
        outputs=LaunchOutputs(bucket=settings.data_bucket, prefix=outputs),
        checkpoint_prefix=job_checkpoint_prefix(job.tenant, job.id),
        timeout_s=timeout_s,
        aws_region=placement.region,
        endpoint_url=settings.endpoint_url,
        # ECS puts secrets in the container's environment; the launcher passes these names on to the job.
        secret_env=tuple(env_name for env_name, _ in secrets) if spec.code is not None else (),
    )
    command = tuple(spec.command) if spec.image else LAUNCH_COMMAND
    env = {**spec.env, **berth_env, "BERTH_LAUNCH": launch.model_dump_json(exclude_none=True)}
    r = spec.resources
    return BatchSubmission(
        region=placement.region,
        queue=placement.queue,
        name=name,
        image=image,
        definition=job_definition_name(image, job.tenant, secrets, multinode=r.nodes > 1),
        command=command,
        environment=env,
        gpus=r.gpus // r.nodes,
        vcpus=max(1, int(r.cpu)),
        memory_mib=int(r.memory_gib * 1024),
        # Batch enforces the job's limit itself; the launcher's own limit (124) is the same.
        timeout_s=max(60, timeout_s),
        tenant=job.tenant,
        job_role=f"arn:{settings.partition}:iam::{settings.account}:role/{job_role_name(job.tenant)}"
        if settings.account
        else "",
        tags={**tags, "berth:tenant": job.tenant},
        secrets=secrets,
        execution_role=f"arn:{settings.partition}:iam::{settings.account}:role/{execution_role_name(job.tenant)}"
        if secrets
        else "",
        num_nodes=r.nodes,
    )


# -- array groups ------------------------------------------------------------------------------------
#
# Consecutive tasks of one array that one pass placed alike (same offer, same attempt number) run as
# the children of one Batch array job: one SubmitJob for the group, not one per task. Every child
# gets the same container overrides, so the per-task part (job id, command, array variables) travels
# as a table in the launch spec; the launcher picks its row by ``AWS_BATCH_JOB_ARRAY_INDEX``. Image
# jobs run their own command with no launcher to pick a row, so only code-bundle tasks are grouped.

#: The group's task table at most this many bytes of JSON (SubmitJob takes 30 KiB in all).
GROUP_TABLE_BYTES = 16_000
#: Container variables that differ between an array's tasks: the table carries them instead.
_PER_TASK_ENV = ("BERTH_JOB_ID", "BERTH_ARRAY_INDEX", "BERTH_ARRAY_SIZE")


def groupable(job: Job, placement: CloudPlacement) -> bool:
    """Whether the attempt may run as a child of a group's array job: an array task run by the
    launcher (a code bundle), on one whole instance of its own, one node."""
    spec = job.spec
    return (
        spec.array_task is not None
        and spec.image is None
        and spec.resources.nodes == 1
        and placement.instances == 1
    )


def group_entry(job: Job) -> dict[str, Any]:
    """One row of a group's task table: what differs between the tasks of one array."""
    task = job.spec.array_task
    return {
        "job_id": job.id,
        "command": list(job.spec.command),
        "array_env": {} if task is None else task.env(),
    }


def group_entry_bytes(job: Job) -> int:
    return len(json.dumps(group_entry(job), separators=(",", ":"))) + 1


def group_submission(
    members: list[Job | None], placement: CloudPlacement, settings: CloudSettings
) -> BatchSubmission:
    """The Batch array job of a group: child ``k`` runs ``members[k]`` (None: a task no longer on
    this attempt, whose child exits at once without running anything; trailing ones are left out,
    so the array job may be smaller than the group). Raises ``SecretScopeError``
    as ``submission`` does (the tasks of one array share their secrets)."""
    present = [m for m in members if m is not None]
    if not present or placement.group is None or len(members) != placement.group.size:
        raise ValueError("a group needs its table, one row per child, and at least one task")
    first = present[0]
    assert first.spec.array_task is not None
    base = submission(first, placement, settings)
    launch = json.loads(base.environment["BERTH_LAUNCH"])
    for key in ("job_id", "command", "array_env"):
        launch.pop(key, None)
    # Children past the last task still on the group would only start and exit: Batch runs as many
    # as the array's size, so the table ends at that task (an array job has at least 2 children).
    last = max(k for k, m in enumerate(members) if m is not None)
    size = max(2, last + 1)
    launch["tasks"] = [None if m is None else group_entry(m) for m in members[:size]]
    array_id = first.spec.array_task.array_id
    env = {
        k: v
        for k, v in base.environment.items()
        if k not in _PER_TASK_ENV and not k.startswith("BERTH_PARAM_")
    }
    name = batch_group_name(array_id, placement.group, first.attempts)
    env["BERTH_LAUNCH"] = json.dumps(launch, separators=(",", ":"))
    env["BERTH_ARRAY_ID"] = array_id
    tags = {**base.tags, "BERTH_JOB_ID": array_id, "berth:group": name}
    return replace(base, name=name, environment=env, tags=tags, array_size=size)


def form_batch_groups(placed: list[tuple[Job, CloudPlacement]]) -> dict[str, BatchGroup]:
    """The groups one pass's cloud placements form, by job id: runs of consecutive tasks of one
    array, on the same attempt number, placed alike (``groupable``), at most ``MAX_BATCH_GROUP``
    tasks and ``GROUP_TABLE_BYTES`` of table each; a run of one stays a Batch job of its own."""
    runs: dict[tuple[Any, ...], list[tuple[int, Job]]] = {}
    for job, placement in placed:
        task = job.spec.array_task
        if task is None or not groupable(job, placement):
            continue
        key = (task.array_id, job.attempts, placement.model_dump_json(exclude={"group"}))
        runs.setdefault(key, []).append((task.index, job))
    groups: dict[str, BatchGroup] = {}

    def close(run: list[tuple[int, Job]]) -> None:
        if len(run) >= 2:
            group = BatchGroup(first=run[0][0], size=len(run))
            groups.update({job.id: group for _, job in run})

    for members in runs.values():
        run: list[tuple[int, Job]] = []
        used = 0
        for index, job in sorted(members, key=lambda m: m[0]):
            size = group_entry_bytes(job)
            if run and (
                index != run[-1][0] + 1 or len(run) >= MAX_BATCH_GROUP or used + size > GROUP_TABLE_BYTES
            ):
                close(run)
                run, used = [], 0
            run.append((index, job))
            used += size
        close(run)
    return groups


__all__ = [
    "GANG_NODE_FAILED",
    "GROUP_TABLE_BYTES",
    "MULTINODE_SUFFIX",
    "BatchJob",
    "BatchStatus",
    "BatchSubmission",
    "CloudError",
    "CloudOutcome",
    "CloudOutcomeUnknown",
    "CloudRejected",
    "CloudSettings",
    "CloudThrottled",
    "CloudUnavailable",
    "SecretScopeError",
    "SubmitRequest",
    "batch_group_name",
    "batch_job_name",
    "batch_job_task",
    "batch_secrets",
    "container_start_error",
    "execution_role_name",
    "expected_batch_name",
    "failed_outcome",
    "form_batch_groups",
    "gang_node_reason",
    "group_child_id",
    "group_entry",
    "group_entry_bytes",
    "group_submission",
    "groupable",
    "job_definition_name",
    "node_job_id",
    "parse_batch_job_name",
    "parse_node_job_id",
    "submission",
]


# -- circuit records: what is kept of the cloud's health signal ---------------------------------------

#: Failures older than this are dropped (the policy's window is 10 minutes by default).
CIRCUIT_KEEP_S = 3600.0
#: At most this many recent failures per circuit.
CIRCUIT_KEEP_FAILURES = 32


def circuit_key(region: str, instance_type: str) -> str:
    return f"{region}|{instance_type}"


def record_circuit_event(
    circuits: dict[str, dict[str, Any]], region: str, instance_type: str, at: float, failed: bool
) -> dict[str, dict[str, Any]] | None:
    """``circuits`` (as stored: key -> {region, instance_type, failures, last_success_at}) with one
    failure or success added, old failures pruned; None when nothing changes (a success with no
    failure since the last one: the common case, so successes cost no write). Pure: the adapters
    store what this returns."""
    out = {k: dict(v) for k, v in circuits.items()}
    key = circuit_key(region, instance_type)
    entry = out.get(key) or {
        "region": region,
        "instance_type": instance_type,
        "failures": [],
        "last_success_at": None,
    }
    failures = [float(f) for f in entry.get("failures", []) if at - float(f) <= CIRCUIT_KEEP_S]
    last_success = entry.get("last_success_at")
    if not failed and not any(last_success is None or f > float(last_success) for f in failures):
        return None
    if failed:
        failures.append(at)
    else:
        last_success = max(at, float(last_success)) if last_success is not None else at
    entry = {
        **entry,
        "failures": sorted(failures)[-CIRCUIT_KEEP_FAILURES:],
        "last_success_at": last_success,
    }
    out[key] = entry
    return out


def reset_circuit_records(
    circuits: dict[str, dict[str, Any]], region: str, instance_type: str | None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``circuits`` without the records an admin reset, and their keys: one (region, instance type
    or ``'*'``), or with ``instance_type`` None every circuit of the region (its API's and each
    instance type's). A reset circuit is closed: its failures are gone. Pure."""
    gone = sorted(
        k
        for k, v in circuits.items()
        if v.get("region") == region and (instance_type is None or v.get("instance_type") == instance_type)
    )
    return {k: dict(v) for k, v in circuits.items() if k not in gone}, gone
