"""The job workflow's pure parts: the run state it keeps on the job (the job's own part and the
current attempt's), the failure taxonomy, the retry decision and its backoff, and the dispatch
protocol's messages. Pure.

The Step Functions state machine (``infra/berth_infra/workflow.py``) drives one execution per job;
its task Lambdas call ``berth.logic.workflow``, which decides with the functions here. Every failure,
whoever reports it (an agent, the lease reaper, a state timeout), is named by one ``Failure`` kind;
``classify`` maps it to a class (transient, permanent, canceled) and ``retry_decision`` to an action.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from berth.domain.agent_wire import MAX_CACHED_DATASETS, CachedDataset

# The dispatch protocol's messages to agents live with the wire (both deployables import them).
from berth.domain.agent_wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from berth.domain.agent_wire import Directive as Directive
from berth.domain.agent_wire import WorkMessage as WorkMessage
from berth.domain.gpu_health import GpuFaultReport


class Failure(StrEnum):
    """Every way an attempt can end other than success. The Step Functions error name is
    ``Berth.<value>`` (``error_name``)."""

    HOST_LOST = "HostLost"
    HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
    STAGING = "StagingFailed"
    SPOT_INTERRUPTION = "SpotInterruption"
    CAPACITY = "Capacity"
    THROTTLED = "Throttled"
    CLOUD_API = "CloudApiError"
    PREEMPTED = "Preempted"
    AGENT_ERROR = "AgentError"
    BAD_IMAGE = "BadImage"
    INVALID_SPEC = "InvalidSpec"
    TIMEOUT = "Timeout"
    NONZERO_EXIT = "NonZeroExit"
    OOM = "OutOfMemory"
    CANCELED = "Canceled"
    COST_LIMIT = "CostLimit"
    """The job's ``max_cost_usd`` would be exceeded: the scheduler stopped it (never retried)."""
    INVALID_BUNDLE = "InvalidBundle"
    """The job's code bundle is a broken archive (corrupt, truncated, not an archive, unsafe to
    unpack): the same on every host, so never retried."""
    GPU_FAILED = "GpuFailed"
    """A GPU of the attempt had a fatal fault (an XID, lost from the bus, new uncorrected ECC): the
    control plane stopped the attempt (``berth.domain.gpu_health``). The infrastructure's failure,
    not the job's: retried without using one of its attempts."""

    @property
    def error_name(self) -> str:
        return f"Berth.{self.value}"


class FailureClass(StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    CANCELED = "canceled"


#: The taxonomy (docs/workflow.md renders this table).
FAILURE_CLASS: dict[Failure, FailureClass] = {
    Failure.HOST_LOST: FailureClass.TRANSIENT,
    Failure.HEARTBEAT_TIMEOUT: FailureClass.TRANSIENT,
    Failure.STAGING: FailureClass.TRANSIENT,
    Failure.SPOT_INTERRUPTION: FailureClass.TRANSIENT,
    Failure.CAPACITY: FailureClass.TRANSIENT,
    Failure.THROTTLED: FailureClass.TRANSIENT,
    Failure.CLOUD_API: FailureClass.TRANSIENT,
    Failure.PREEMPTED: FailureClass.TRANSIENT,
    Failure.AGENT_ERROR: FailureClass.TRANSIENT,
    Failure.BAD_IMAGE: FailureClass.PERMANENT,
    Failure.INVALID_SPEC: FailureClass.PERMANENT,
    Failure.TIMEOUT: FailureClass.PERMANENT,
    Failure.NONZERO_EXIT: FailureClass.PERMANENT,
    Failure.OOM: FailureClass.PERMANENT,
    Failure.CANCELED: FailureClass.CANCELED,
    Failure.COST_LIMIT: FailureClass.PERMANENT,
    Failure.INVALID_BUNDLE: FailureClass.PERMANENT,
    Failure.GPU_FAILED: FailureClass.TRANSIENT,
}

#: Transient failures that are not the job's fault and do not use up one of its attempts.
NOT_COUNTED = frozenset(
    {Failure.PREEMPTED, Failure.SPOT_INTERRUPTION, Failure.CAPACITY, Failure.THROTTLED, Failure.GPU_FAILED}
)
#: A job's first this many ``CloudApiError`` failures (a region's API failing or refusing, an instance
#: that could not start the container) use up none of its attempts: they back off (by attempt
#: number, below) while the circuits open and steer the pass elsewhere; later ones count. Six: enough
#: for one job alone to open the circuits of the two regions a GPU type is typically offered in
#: (3 failures each, policy ``circuit``) before its attempts are touched; then it waits, queued.
FREE_CLOUD_API_FAILURES = 6
#: Failures that exclude the failed host (or region) from the next placement.
EXCLUDES_LOCATION = frozenset(
    {
        Failure.HOST_LOST,
        Failure.HEARTBEAT_TIMEOUT,
        Failure.STAGING,
        Failure.AGENT_ERROR,
        Failure.CAPACITY,
        Failure.CLOUD_API,
    }
)
#: Step Functions' own timeout errors (a heartbeat timeout is treated as either name).
STATES_TIMEOUTS = frozenset({"States.Timeout", "States.HeartbeatTimeout"})
#: How long past ``timeout_minutes`` the dispatch state waits before it declares the job timed out
#: (the agent enforces the limit itself and reports ``Timeout``; this catches a silent host).
TIMEOUT_GRACE_S = 120
#: A cloud attempt's dispatch state also allows for the wait for an instance and the image pull (the
#: scheduler's sweep fails an attempt waiting longer than ``runnable_timeout_s`` well before this).
CLOUD_START_GRACE_S = 1800


def failure_from_error(error: str | None, ran_s: float | None, timeout_s: float) -> Failure:
    """The failure an error name of the state machine stands for.

    ``Berth.<Kind>`` names itself. A states timeout is the job's own time limit when it has run that
    long, and a heartbeat timeout (the host went silent) otherwise. Anything else (a task Lambda that
    crashed, ``States.TaskFailed``) is an agent-side error: transient.
    """
    if error and error.startswith("Berth."):
        try:
            return Failure(error.removeprefix("Berth."))
        except ValueError:
            return Failure.AGENT_ERROR
    if error in STATES_TIMEOUTS:
        if ran_s is not None and ran_s >= timeout_s:
            return Failure.TIMEOUT
        return Failure.HEARTBEAT_TIMEOUT
    return Failure.AGENT_ERROR


def classify(failure: Failure, retry_on_nonzero: bool = False) -> FailureClass:
    if failure is Failure.NONZERO_EXIT and retry_on_nonzero:
        return FailureClass.TRANSIENT
    return FAILURE_CLASS[failure]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter, bounded: ``uniform(base, min(cap, base * 2**n))``."""

    base_s: float = 2.0
    cap_s: float = 300.0

    def delay(self, failures: int, rng: random.Random) -> int:
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, failures - 1)))
        return max(1, round(rng.uniform(min(self.base_s, ceiling), ceiling)))


class Action(StrEnum):
    RETRY = "retry"
    FAIL = "fail"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class RetryDecision:
    action: Action
    failure: Failure
    failure_class: FailureClass
    reason: str
    backoff_s: int = 0
    counted: bool = True


def retry_decision(
    failure: Failure,
    detail: str,
    counted_failures: int,
    max_attempts: int,
    canceling: bool,
    backoff: Backoff,
    rng: random.Random,
    *,
    attempt: int = 1,
    free_api_failures: int = 0,
) -> RetryDecision:
    """What the workflow does after attempt ``attempt`` failed: retry after a backoff, fail, or end
    canceled.

    ``counted_failures`` is how many earlier failures used up an attempt; ``free_api_failures`` how
    many earlier ``CloudApiError`` failures did not (``FREE_CLOUD_API_FAILURES``). The backoff grows
    with ``attempt`` (every attempt before this one failed too), so failures that do not count (spot
    interruptions, capacity, a region's API down) still back off rather than retry every 2 s. The
    reason names the attempt that comes next and the counted failures apart: a fifth attempt after
    four spot interruptions is ``attempt 5``, with ``0 of 3`` counted failures. A job being canceled
    ends canceled whatever stopped it.
    """
    klass = classify(failure)
    text = f"{failure.value} ({klass.value}): {detail}".rstrip(": ")
    if canceling or klass is FailureClass.CANCELED:
        return RetryDecision(
            Action.CANCEL, failure, FailureClass.CANCELED, f"canceled: {detail or 'stopped'}"
        )
    if klass is FailureClass.PERMANENT:
        return RetryDecision(Action.FAIL, failure, klass, text)
    counted = failure not in NOT_COUNTED and not (
        failure is Failure.CLOUD_API and free_api_failures < FREE_CLOUD_API_FAILURES
    )
    used = counted_failures + (1 if counted else 0)
    if used >= max_attempts:
        return RetryDecision(
            Action.FAIL,
            failure,
            klass,
            f"{text}; retries exhausted ({used} of {max_attempts} attempts failed) after attempt {attempt}",
            counted=counted,
        )
    delay = backoff.delay(max(1, attempt, used), rng)
    tally = f"{used} of {max_attempts} attempts failed" + ("" if counted else ", this one not counted")
    return RetryDecision(
        Action.RETRY,
        failure,
        klass,
        f"{text}; retrying in {delay} s as attempt {attempt + 1} ({tally})",
        backoff_s=delay,
        counted=counted,
    )


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AttemptLogStream(_Model):
    """Where one cloud attempt's output is: the stream AWS Batch's awslogs driver created in the
    tenant's log group (``<prefix>/default/<ECS task id>``), as DescribeJobs reported it. A gang (a
    multi-node parallel job) has one per node: ``rank`` is the node's index (0, the main node, is the
    one DescribeJobs of the job itself names)."""

    attempt: Annotated[int, Field(ge=1)]
    stream: Annotated[str, Field(min_length=1, max_length=512)]
    rank: Annotated[int, Field(ge=0)] = 0


class AttemptState(_Model):
    """The current attempt's part of the run state. Placing the job's next attempt replaces it
    whole (``AttemptState(fencing_token=...)``): nothing of an earlier attempt carries over."""

    fencing_token: str | None = None
    """The attempt's lease: a host must present it on every report; a new attempt changes it."""
    dispatch_token: str | None = None
    """The task token the execution waits on while the attempt runs."""
    claimed: tuple[str, ...] = ()
    started: tuple[str, ...] = ()
    succeeded: tuple[str, ...] = ()
    """Hosts (ranks) of the attempt that claimed it, started it, finished it successfully."""
    started_at: datetime | None = None
    stop: str | None = None
    """Why the scheduler stopped the attempt (preemption, repatriation): a stop directive."""
    stop_failure: Failure | None = None
    """The failure a ``stop`` stands for (None: a preemption or repatriation, ``Preempted``)."""
    cost_at: datetime | None = None
    """When the running attempt's cost was last stored on the job."""
    batch_job_id: str | None = None
    """The cloud attempt's AWS Batch job (set once, conditionally: a redelivered submit request
    finds it and submits nothing)."""
    submitted_at: datetime | None = None
    """When the cloud attempt's Batch job was submitted (its time waiting for an instance counts
    from here)."""


#: The attempt's fields, which jobs stored before ``AttemptState`` existed keep at the top level.
_ATTEMPT_FIELDS = frozenset(AttemptState.model_fields)


class RunState(_Model):
    """What the workflow keeps on the job between its states (never returned by the public API):
    the job's own part here, the current attempt's in ``attempt``."""

    execution: str | None = None
    """The Step Functions execution driving this job."""
    placement_token: str | None = None
    """The task token the execution waits on for a placement (set while QUEUED)."""
    counted_failures: int = 0
    free_api_failures: int = 0
    """``CloudApiError`` failures that used up no attempt (``FREE_CLOUD_API_FAILURES``)."""
    excluded_hosts: tuple[str, ...] = ()
    excluded_regions: tuple[str, ...] = ()
    last_failure: str | None = None
    cost_done_usd: float = 0.0
    """The cost of the job's attempts that ended (``berth.domain.cost``)."""
    checkpoint_at: datetime | None = None
    checkpoint_bytes: int | None = None
    checkpoint_attempt: int | None = None
    """The job's last synced checkpoint (any attempt; an on-prem agent says so in heartbeats and its
    final report, a cloud attempt's prefix is read when its Batch job ends): when, how many bytes,
    which attempt. Public as the job's ``checkpoint``."""
    log_streams: tuple[AttemptLogStream, ...] = ()
    """The CloudWatch Logs streams AWS Batch named for the job's cloud attempts (one per attempt,
    kept across attempts: ``GET /v1/jobs/{id}/logs?attempt=N`` reads an earlier one)."""
    attempt: AttemptState = AttemptState()
    """The current attempt's state (the last attempt's, once the job ended or waits to retry)."""

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_attempt_fields(cls, data: Any) -> Any:
        """Read the stored form of older versions, which kept the attempt's fields at the top level."""
        if not isinstance(data, dict) or _ATTEMPT_FIELDS.isdisjoint(data):
            return data
        flat = {k: v for k, v in data.items() if k in _ATTEMPT_FIELDS}
        rest = {k: v for k, v in data.items() if k not in _ATTEMPT_FIELDS}
        nested = rest.get("attempt") or {}
        if not isinstance(nested, dict):
            return data  # an AttemptState already: a mix of forms that validation refuses
        return {**rest, "attempt": {**flat, **nested}}

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """As pydantic's, but refusing a field this model does not have: an attempt's field given
        here (it lives in ``attempt``, ``with_attempt``) would otherwise be kept silently and lost."""
        unknown = set(update or ()) - set(type(self).model_fields)
        if unknown:
            raise TypeError(f"not fields of RunState: {sorted(unknown)} (attempt fields: with_attempt)")
        return super().model_copy(update=update, deep=deep)

    def with_attempt(self, **changes: Any) -> RunState:
        """This state with the current attempt's fields ``changes`` replaced."""
        unknown = changes.keys() - _ATTEMPT_FIELDS
        if unknown:  # model_copy would keep a misspelt field silently
            raise TypeError(f"not fields of AttemptState: {sorted(unknown)}")
        return self.model_copy(update={"attempt": self.attempt.model_copy(update=changes)})

    def with_checkpoint(self, attempt: int, ckpt: CheckpointInfo, now: datetime) -> RunState | None:
        """This state with ``attempt``'s checkpoint ``ckpt`` recorded, its time clamped to ``now``
        (the reporter's clock, an agent's or S3's, may run ahead of the control plane's); None when
        the stored one is as new or newer: a checkpoint reported again, or late, never replaces a
        later one. The one rule for every reporter (agents' heartbeats and reports, cloud attempts'
        ends)."""
        at = min(ckpt.at, now)
        if self.checkpoint_at is not None and at <= self.checkpoint_at:
            return None
        return self.model_copy(
            update={"checkpoint_at": at, "checkpoint_bytes": ckpt.size_bytes, "checkpoint_attempt": attempt}
        )

    def log_stream_of(self, attempt: int, rank: int = 0) -> str | None:
        """The stream Batch named for ``attempt`` (of a gang: for its node ``rank``), if learnt."""
        return next((s.stream for s in self.log_streams if s.attempt == attempt and s.rank == rank), None)

    def with_log_stream(self, attempt: int, stream: str, rank: int = 0) -> RunState:
        """This state with ``stream`` recorded for ``attempt`` and ``rank`` (an earlier record of
        them replaced)."""
        kept = tuple(s for s in self.log_streams if (s.attempt, s.rank) != (attempt, rank))
        entry = AttemptLogStream(attempt=attempt, stream=stream, rank=rank)
        return self.model_copy(update={"log_streams": (*kept, entry)})


# -- the dispatch protocol's messages (docs/agent-protocol.md) -------------------------------------


class AttemptRef(_Model):
    job_id: Annotated[str, Field(min_length=1, max_length=64)]
    attempt: Annotated[int, Field(ge=1, le=1000)]
    fencing_token: Annotated[str, Field(min_length=1, max_length=128)]


class ReportEvent(StrEnum):
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


#: What an agent may name as the cause of a failed attempt.
AGENT_FAILURES = frozenset(
    {
        Failure.NONZERO_EXIT,
        Failure.BAD_IMAGE,
        Failure.STAGING,
        Failure.TIMEOUT,
        Failure.OOM,
        Failure.AGENT_ERROR,
        Failure.INVALID_SPEC,
        Failure.PREEMPTED,
        Failure.INVALID_BUNDLE,
    }
)

_AGENT_FAILURE_NAMES = {
    "nonzero_exit": Failure.NONZERO_EXIT,
    "bad_image": Failure.BAD_IMAGE,
    "staging": Failure.STAGING,
    "timeout": Failure.TIMEOUT,
    "oom": Failure.OOM,
    "agent_error": Failure.AGENT_ERROR,
    "invalid_spec": Failure.INVALID_SPEC,
    "preempted": Failure.PREEMPTED,
    "invalid_bundle": Failure.INVALID_BUNDLE,
}

AgentFailureName = Literal[
    "nonzero_exit",
    "bad_image",
    "staging",
    "timeout",
    "oom",
    "agent_error",
    "invalid_spec",
    "preempted",
    "invalid_bundle",
]


def agent_failure(name: str | None) -> Failure:
    return _AGENT_FAILURE_NAMES.get(name or "", Failure.AGENT_ERROR)


class CheckpointInfo(_Model):
    """An attempt's last checkpoint synced to the job's prefix: when (the agent's clock; the control
    plane clamps it to its own) and the checkpoint directory's size."""

    at: datetime
    size_bytes: Annotated[int, Field(ge=0, le=2**53)]


class AttemptCheckpoint(AttemptRef, CheckpointInfo):
    """A running attempt's last checkpoint, in a heartbeat."""


class AttemptReport(AttemptRef):
    event: ReportEvent
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None
    failure: AgentFailureName | None = None
    message: Annotated[str, Field(max_length=2000)] = ""
    checkpoint: CheckpointInfo | None = None
    """Its last synced checkpoint (after the final sync), if it wrote any."""


class HeartbeatRequest(_Model):
    healthy: bool = True
    draining: bool = False
    attempts: Annotated[list[AttemptRef], Field(max_length=256)] = Field(default_factory=list)
    cached_datasets: Annotated[list[CachedDataset], Field(max_length=MAX_CACHED_DATASETS)] | None = None
    """What the host's object cache holds (data locality); None: unchanged since the last beat (an
    agent sends it when it changed, and on its first beat), so a beat costs no more write."""
    checkpoints: Annotated[list[AttemptCheckpoint], Field(max_length=256)] = Field(default_factory=list)
    """The last synced checkpoint of running attempts (those that wrote one)."""
    #: The host's GPU faults (``berth.domain.gpu_health``): its latched fatal ones and its warnings now.
    #: An agent sends the field only when it has some, so it still talks to a control plane without it.
    gpu_faults: Annotated[list[GpuFaultReport], Field(max_length=128)] = Field(default_factory=list)
