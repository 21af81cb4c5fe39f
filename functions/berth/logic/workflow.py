"""The job workflow's steps, one method per task state of the state machine (docs/workflow.md).

Each method is idempotent: Step Functions may run a task twice, and a duplicate start of the
execution is refused by name. Writes are conditional on the job's version; a lost race is retried
against the fresh record. Pure logic over ports.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from berth.domain.cost import AttemptUsage, attempt_usage
from berth.domain.errors import StoreUnavailable
from berth.domain.fleet import HoldRelease, attempt_key
from berth.domain.job import Job
from berth.domain.placement import CloudPlacement, OnPremPlacement
from berth.domain.ports import (
    Executions,
    HostRepository,
    JobRepository,
    PassTrigger,
    TaskTokens,
    UsageLedger,
    WorkQueues,
)
from berth.domain.status import JobStatus
from berth.domain.workflow import (
    CLOUD_START_GRACE_S,
    EXCLUDES_LOCATION,
    TIMEOUT_GRACE_S,
    Action,
    Backoff,
    Failure,
    RunState,
    WorkMessage,
    failure_from_error,
    retry_decision,
)
from berth.logic.job_update import Decision, Keep, Save, Update, update_job

Clock = Callable[[], datetime]

S = JobStatus


@dataclass(frozen=True)
class WorkflowSettings:
    """Timings (seconds); shorter ones make a test deployment take seconds."""

    heartbeat_s: int = 60
    """Agents heartbeat at a third of it."""
    lease_s: int = 90
    """How long a host's lease lasts after each heartbeat; nothing new is placed on a host past it."""
    outage_tolerance_s: int = 300
    """How long past its lease a silent host keeps its attempts: its agent lets them run this long
    without reaching the control plane (a control-plane outage or a partition look alike to it), and
    stops them after (docs/agent.md, "When the control plane cannot be reached")."""
    fence_margin_s: int = 60
    """How much longer than the agent the control plane waits before it declares a silent host lost
    and places its attempts again: the agent's time to stop them (its cancel grace) and the request's
    delay, so an attempt never runs on a silent host and on its next host at once."""
    claim_s: int = 300
    """How long a work message may wait to be claimed."""
    backoff: Backoff = field(default_factory=Backoff)
    orphan_grace_s: int = 120
    """A GPU hold no job claims for this long (a pass that crashed between holding and writing the
    job) is released."""

    @property
    def agent_heartbeat_s(self) -> int:
        """How often agents heartbeat (the register and claim answers' ``heartbeat_s``)."""
        return max(1, self.heartbeat_s // 3)

    @property
    def host_silence_s(self) -> int:
        """How long after its lease expires a silent host is declared lost (its attempts fail as
        ``HostLost`` and are placed again)."""
        return self.outage_tolerance_s + self.fence_margin_s

    @property
    def dispatch_heartbeat_s(self) -> int:
        """The on-prem dispatch state's HeartbeatSeconds: the backstop behind the lease reaper, which
        declares a silent host lost first (``lease_s + host_silence_s`` after its last heartbeat)."""
        return self.lease_s + self.host_silence_s + self.heartbeat_s

    def execution_input(self, job_id: str) -> dict[str, Any]:
        """The input of a job's execution: the job and the timings its states read."""
        return {"job_id": job_id, "heartbeat_s": self.dispatch_heartbeat_s}


def placement_output(job: Job) -> dict[str, Any]:
    """What WaitForPlacement returns to the state machine."""
    if job.status in (S.STARTING, S.RUNNING) and job.placement is not None:
        grace = TIMEOUT_GRACE_S + (CLOUD_START_GRACE_S if isinstance(job.placement, CloudPlacement) else 0)
        return {
            "outcome": "placed",
            "site": str(job.placement.site),
            "attempt": job.attempts,
            "timeout_s": job.spec.timeout_minutes * 60 + grace,
        }
    return {"outcome": "canceled" if job.status in (S.CANCELING, S.CANCELED) else "ended", "site": "none"}


@dataclass(frozen=True)
class WorkflowHooks:
    """What the job API does for the workflow: start a submitted job's execution, and answer the
    placement wait of a job canceled while queued (so its execution ends at once)."""

    tokens: TaskTokens
    executions: Executions | None
    settings: WorkflowSettings = field(default_factory=WorkflowSettings)
    trigger: PassTrigger | None = None
    """Asks for a pass when a running cloud job is canceled: the pass's sweep terminates its Batch
    job now rather than at the next timer (None: the timer's pass does it). The job-events stream
    asks for none here: a move to CANCELING frees nothing until the attempt ends
    (``berth.logic.pass_triggers``)."""

    def submitted(self, job: Job) -> None:
        if self.executions is None:
            return
        try:
            self.executions.start(job.id, self.settings.execution_input(job.id))
        except StoreUnavailable:
            # The job is stored; the next scheduling pass starts its execution (repair_executions).
            return

    def canceled(self, before: Job, after: Job) -> None:
        token = before.run.placement_token
        if after.status is S.CANCELED and token:
            self.tokens.succeed(token, placement_output(after))
        if after.status is S.CANCELING and isinstance(after.placement, CloudPlacement) and self.trigger:
            try:
                self.trigger.request(f"job {after.id} canceling")
            except StoreUnavailable:
                return  # the timer's pass terminates it


def hold_releases(job: Job, attempt: int) -> tuple[HoldRelease, ...]:
    """The GPU holds of ``job``'s attempt ``attempt`` to give back with the write that ends it
    (``Save.releases``): those its placement names, when that attempt is the job's current one and
    every host's GPUs are known; else none (``release_holds`` then reads each host after the write)."""
    placement = job.placement
    if job.attempts != attempt or not isinstance(placement, OnPremPlacement):
        return ()
    if not all(h.gpu_ids for h in placement.hosts):
        return ()
    key = attempt_key(job.id, attempt)
    return tuple(HoldRelease(h.host_id, key, h.gpu_ids) for h in placement.hosts)


def release_holds(hosts: HostRepository, job: Job, attempt: int) -> None:
    if isinstance(job.placement, OnPremPlacement):
        current = job.attempts == attempt  # then the placement is the attempt's
        for h in job.placement.hosts:
            # its placement names the hold's GPUs: released without reading the host
            hosts.release(h.host_id, attempt_key(job.id, attempt), (h.gpu_ids or None) if current else None)


@dataclass(frozen=True)
class WorkflowService:
    jobs: JobRepository
    hosts: HostRepository
    tokens: TaskTokens
    queues: WorkQueues
    clock: Clock
    settings: WorkflowSettings = field(default_factory=WorkflowSettings)
    rng: random.Random = field(default_factory=random.Random)
    #: The usage ledger (None: ended attempts' usage is not recorded; the job's cost still is). An
    #: ended attempt's final record is stored with the job's own write (``Save.usage``), so the job
    #: repository must be wired to the same ledger.
    usage: UsageLedger | None = None

    # -- WaitForPlacement ------------------------------------------------------------------------
    def await_placement(self, job_id: str, token: str, execution: str | None = None) -> None:
        """Park the execution's placement token on the queued job. A job already placed (the pass won
        the race with this write) or ended answers the token at once. No pass is asked for here: the
        job's move to QUEUED (its submit, its requeue) asks for one through the job-events stream
        (``berth.logic.pass_triggers``), which may well run that pass before this write; a pass
        that places the job first leaves no token to answer, and this answers it (a pass that reads
        the job before this write loses its placement's race, and asks for another pass at once)."""

        def park(job: Job) -> Decision:
            if job.status is not S.QUEUED:
                return Keep()
            run = job.run.model_copy(update={"placement_token": token, "execution": execution})
            return Update(job.updated(job.updated_at, run=run))

        done = update_job(self.jobs, job_id, park, doing="waiting for placement")
        if not done.written:
            self.tokens.succeed(token, placement_output(done.before))

    # -- DispatchOnPrem --------------------------------------------------------------------------
    def dispatch_onprem(self, job_id: str, attempt: int, token: str) -> None:
        """Keep the attempt's dispatch token on the job and put one work message on each placed
        host's queue (rank = position in the placement). Sent again on a retried task: a host
        claims an attempt once."""

        def park(job: Job) -> Decision[tuple[str, str] | None]:
            """Keep: the (error, cause) the dispatch token fails with instead."""
            if job.attempts != attempt or job.status.is_terminal:
                return Keep((Failure.AGENT_ERROR.error_name, f"attempt {attempt} is not current"))
            if job.status is S.CANCELING and not job.run.attempt.claimed:
                return Keep((Failure.CANCELED.error_name, "canceled before any host claimed it"))
            if not isinstance(job.placement, OnPremPlacement) or job.run.attempt.fencing_token is None:
                return Keep((Failure.INVALID_SPEC.error_name, "the job has no on-prem placement"))
            run = job.run.with_attempt(dispatch_token=token).model_copy(update={"placement_token": None})
            return Update(job.updated(job.updated_at, run=run))

        done = update_job(self.jobs, job_id, park, doing="dispatching")
        if done.outcome is not None:
            self.tokens.fail(token, *done.outcome)
            return
        job, placement = done.before, done.before.placement
        assert isinstance(placement, OnPremPlacement) and job.run.attempt.fencing_token is not None
        claim_by = self.clock() + timedelta(seconds=self.settings.claim_s)
        for rank, h in enumerate(placement.hosts):
            message = WorkMessage(
                job_id=job.id,
                attempt=attempt,
                fencing_token=job.run.attempt.fencing_token,
                rank=rank,
                world_size=len(placement.hosts),
                gpu_ids=h.gpu_ids,
                claim_by=claim_by,
            )
            self.queues.send(h.host_id, message.model_dump_json())

    # -- ClassifyFailure -------------------------------------------------------------------------
    def classify_failure(
        self, job_id: str, attempt: int, error: str | None, cause: str | None
    ) -> dict[str, Any]:
        """Name the failure, free the attempt's GPUs and move the job: RETRYING (with the backoff to
        wait), FAILED, or CANCELED. Returns ``{"action", "backoff_s"}``, and ``failure`` (the cause's
        name) when this call classified it."""

        def classify(job: Job) -> Decision[dict[str, Any]]:
            if job.status in (S.QUEUED, S.RETRYING):
                # Classified already (this task is being retried): carry on with the retry.
                return Keep({"action": "retry", "backoff_s": 1})
            if job.status.is_terminal:
                # Ended already: by this task's earlier try, or COMPLETED by the agent API (whose token
                # answer was lost, so the dispatch timed out): the execution ends as the job did.
                action = {S.FAILED: "fail", S.COMPLETED: "done"}.get(job.status, "cancel")
                return Keep({"action": action, "backoff_s": 0})
            now = self.clock()
            ran = (
                None
                if job.run.attempt.started_at is None
                else (now - job.run.attempt.started_at).total_seconds()
            )
            failure = failure_from_error(error, ran, job.spec.timeout_minutes * 60)
            canceling = job.status is S.CANCELING
            if job.run.attempt.stop and failure in _STOPPED:
                # The scheduler stopped it: what the stop stands for (a preemption unless it says).
                failure = job.run.attempt.stop_failure or Failure.PREEMPTED
            elif failure is Failure.CANCELED and not canceling:
                failure = Failure.AGENT_ERROR
            stopped = failure in (Failure.PREEMPTED, Failure.COST_LIMIT, Failure.GPU_FAILED)
            detail = (job.run.attempt.stop or _short(cause)) if stopped else _short(cause)
            decision = retry_decision(
                failure,
                detail,
                job.run.counted_failures,
                job.spec.retry.max_attempts,
                canceling,
                self.settings.backoff,
                self.rng,
                attempt=job.attempts,
                free_api_failures=job.run.free_api_failures,
            )
            free_api = failure is Failure.CLOUD_API and not decision.counted
            cost, usage = self._end_attempt(job, now)  # its usage record goes with the job's write
            # The attempt's record stays (its hosts, its Batch job) until the next placement replaces it.
            ended = job.run.with_attempt(dispatch_token=None, stop=None, stop_failure=None, cost_at=None)
            run = ended.model_copy(
                update={
                    "placement_token": None,
                    "cost_done_usd": cost,
                    "last_failure": decision.reason,
                    "counted_failures": job.run.counted_failures + (1 if decision.counted else 0),
                    "free_api_failures": job.run.free_api_failures + (1 if free_api else 0),
                    "excluded_hosts": _excluded(job, failure),
                    "excluded_regions": _excluded_regions(job, failure),
                }
            )
            target = {Action.RETRY: S.RETRYING, Action.FAIL: S.FAILED, Action.CANCEL: S.CANCELED}[
                decision.action
            ]
            nxt, event = job.transition(target, decision.reason, now, run=run, cost_usd=cost)
            return Save(
                nxt,
                event,
                {"action": decision.action.value, "backoff_s": decision.backoff_s, "failure": failure.value},
                usage,
                hold_releases(job, attempt),  # the GPUs go back in the same write
            )

        done = update_job(self.jobs, job_id, classify, doing="classifying its failure")
        if done.written and not hold_releases(done.before, attempt):
            # GPUs its placement does not name (an older attempt's): read each host. The move out of
            # a state that held capacity asks for a pass through the job-events stream
            # (berth.logic.pass_triggers), after its batching windows.
            release_holds(self.hosts, done.before, attempt)
        return done.outcome

    # -- Requeue ---------------------------------------------------------------------------------
    def requeue(self, job_id: str) -> dict[str, Any]:
        """After the backoff: RETRYING -> QUEUED, unplaced, for the next pass."""

        def requeue(job: Job) -> Decision[dict[str, Any]]:
            if job.status is not S.RETRYING:
                return Keep({"outcome": "queued" if job.status is S.QUEUED else "ended"})
            nxt, event = job.transition(
                S.QUEUED,
                f"waiting for placement (attempt {job.attempts + 1})",
                self.clock(),
                placement=None,
                site=None,
            )
            return Save(nxt, event, {"outcome": "queued"})

        return update_job(self.jobs, job_id, requeue, doing="requeueing").outcome

    # -- Finalize --------------------------------------------------------------------------------
    def finalize(self, job_id: str, attempt: int) -> dict[str, Any]:
        """Every rank succeeded: COMPLETED (a job being canceled that finished first completes too).
        A job whose start was never reported moves to RUNNING first, with its own event. The run is
        learnt from the COMPLETED event's row by the job-events stream's consumer, not here
        (``berth.logic.runtimes``)."""

        def run(job: Job) -> Decision:
            if job.status is not S.STARTING:
                return Keep()
            nxt, event = job.transition(S.RUNNING, "running", self.clock())
            return Save(nxt, event)

        def complete(job: Job) -> Decision:
            if job.status.is_terminal:
                return Keep()
            return completion(job, attempt, self.clock(), keep_usage=self.usage is not None)

        running = update_job(self.jobs, job_id, run, doing="finalizing")
        done = update_job(self.jobs, job_id, complete, doing="finalizing", current=running.after)
        if done.written and not hold_releases(done.before, attempt):
            release_holds(self.hosts, done.before, attempt)  # the stream's consumer asks for a pass
        return {"status": str(done.after.status)}

    def _end_attempt(self, job: Job, now: datetime) -> tuple[float, AttemptUsage | None]:
        """The job's cost with its current attempt ended ``now``, and the attempt's final usage record
        to store in the same transaction as the job's write (``Save.usage``; None when there is none
        or no ledger): the ledger and the job move together, and a retried task rewrites the record
        (a final record never counts twice)."""
        return ended_attempt_cost(job, now, keep_usage=self.usage is not None)

    def new_fencing_token(self) -> str:
        return secrets.token_urlsafe(18)


def ended_attempt_cost(job: Job, now: datetime, keep_usage: bool) -> tuple[float, AttemptUsage | None]:
    """The job's cost with its current attempt ended ``now``, and that attempt's final usage record
    (None when there is none, or ``keep_usage`` is false: no ledger)."""
    usage = attempt_usage(job, now, final=True)
    if usage is None:
        return job.run.cost_done_usd, None
    return job.run.cost_done_usd + usage.cost_usd, usage if keep_usage else None


def completion(job: Job, attempt: int, now: datetime, keep_usage: bool) -> Save:
    """``job`` COMPLETED by its attempt ``attempt`` ending ``now``: its cost, the attempt's final
    usage record and its GPUs given back, all in the same write. Finalize writes it, and so does the
    agent API when the last rank's ``succeeded`` report comes (``AgentService.report``), so that
    Finalize is not run."""
    cost, usage = ended_attempt_cost(job, now, keep_usage)
    run = job.run.with_attempt(dispatch_token=None, cost_at=None).model_copy(update={"cost_done_usd": cost})
    nxt, event = job.transition(S.COMPLETED, f"completed (attempt {attempt})", now, run=run, cost_usd=cost)
    return Save(nxt, event, usage=usage, releases=hold_releases(job, attempt))


#: How an attempt the scheduler stopped reports its end (the agent's cancel, the process's exit).
_STOPPED = frozenset({Failure.CANCELED, Failure.NONZERO_EXIT, Failure.AGENT_ERROR, Failure.PREEMPTED})


def _short(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _excluded(job: Job, failure: Failure) -> tuple[str, ...]:
    """Hosts the next placement avoids: the failed attempt's, when the failure was the host's (only the
    last failure's, so a small fleet never shuts a job out for good)."""
    if failure in EXCLUDES_LOCATION and isinstance(job.placement, OnPremPlacement):
        return tuple(h.host_id for h in job.placement.hosts)
    return ()


def _excluded_regions(job: Job, failure: Failure) -> tuple[str, ...]:
    """The failed cloud attempt's region, when the failure was the region's (capacity, API errors):
    its re-placement goes to another region or on-prem. Only the last failure's, like hosts."""
    if failure in EXCLUDES_LOCATION and isinstance(job.placement, CloudPlacement):
        return (job.placement.region,)
    return ()


__all__ = ["RunState", "WorkflowService", "WorkflowSettings", "placement_output", "release_holds"]
