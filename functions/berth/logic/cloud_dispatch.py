"""The cloud branch of the job workflow (AWS Batch): dispatch, submit, Batch outcomes, the sweep.

``DispatchCloud`` parks the attempt's task token on the job and puts a submit request on the submit
queue; its consumer submits the Batch job (throttled, idempotent: the Batch job id is kept on the
job's run state with a conditional write, and a redelivered request looks the job up by name before
submitting). Batch state changes (and the scheduler's sweep, which catches missed ones) are
reconciled from DescribeJobs and the stored job, never from the event: RUNNING moves the job to
RUNNING, SUCCEEDED answers the token (Finalize completes the job), FAILED fails it with the mapped
``Berth.*`` error. Capacity and API errors, and spot interruptions, feed the circuits the core reads.
Pure logic over ports (docs/workflow.md, "The cloud branch").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from berth.domain.arrays import task_id
from berth.domain.cloud import (
    REGION_WIDE,
    TERMINATED_BY_BERTH,
    BatchJob,
    BatchStatus,
    CloudError,
    CloudOutcomeUnknown,
    CloudRejected,
    CloudSettings,
    CloudThrottled,
    CloudUnavailable,
    SecretScopeError,
    SubmitRequest,
    batch_job_task,
    expected_batch_name,
    failed_outcome,
    group_child_id,
    group_submission,
    parse_node_job_id,
    submission,
)
from berth.domain.job import Job
from berth.domain.observability import is_log_stream_name
from berth.domain.placement import CloudPlacement
from berth.domain.ports import (
    BatchGateway,
    CheckpointStore,
    CircuitRepository,
    JobRepository,
    SubmitQueue,
    TaskTokens,
)
from berth.domain.status import JobStatus
from berth.domain.workflow import Failure
from berth.logic.cloud_checkpoints import note_cloud_checkpoint
from berth.logic.cloud_gangs import on_node_event
from berth.logic.job_update import Decision, JobKeptChanging, JobMissing, Keep, Save, Update, update_job

Clock = Callable[[], datetime]
S = JobStatus
#: Group array-job ids remembered per sandbox (a group's later requests skip the ListJobs).
PARENTS_KEPT = 1024
ACTIVE = (S.STARTING, S.RUNNING, S.CANCELING)


def cloud_attempt(job: Job) -> CloudPlacement | None:
    """The job's cloud placement while its current attempt holds it, else None."""
    if job.status in ACTIVE and isinstance(job.placement, CloudPlacement):
        return job.placement
    return None


@dataclass(frozen=True)
class EventReads:
    """What one SQS batch of Batch events read for all of them at once (``logic/batch_events.py``):
    the jobs they name by id (None: not stored), the Batch jobs by id in the job's region (None:
    Batch does not know it). An id absent from either is read on its own."""

    jobs: Mapping[str, Job | None] = field(default_factory=dict)
    states: Mapping[str, BatchJob | None] = field(default_factory=dict)


@dataclass(frozen=True)
class CloudDispatchService:
    jobs: JobRepository
    tokens: TaskTokens
    batch: BatchGateway
    submits: SubmitQueue
    circuits: CircuitRepository
    clock: Clock
    settings: CloudSettings = field(default_factory=CloudSettings)
    #: Where attempts' checkpoints are read when they end (None: not read; on-prem agents report theirs).
    checkpoints: CheckpointStore | None = None
    #: Group name -> its array job's id, as this sandbox submitted or found it (ids never change).
    _parents: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def _now(self) -> float:
        return self.clock().timestamp()

    # -- DispatchCloud ---------------------------------------------------------------------------
    def dispatch(self, job_id: str, attempt: int, token: str) -> None:
        """Keep the attempt's dispatch token on the job, then ask for the Batch submit. A retried
        task sends the request again: the submit is idempotent."""
        stale = (Failure.AGENT_ERROR.error_name, f"attempt {attempt} is not current")

        def park(job: Job) -> Decision[tuple[str, str] | None]:
            """Keep: the (error, cause) the dispatch token fails with instead."""
            if job.attempts != attempt or job.status.is_terminal:
                return Keep(stale)
            if job.status is S.CANCELING and job.run.attempt.batch_job_id is None:
                return Keep((Failure.CANCELED.error_name, "canceled before it was submitted"))
            if cloud_attempt(job) is None:
                return Keep((Failure.INVALID_SPEC.error_name, "the job has no cloud placement"))
            run = job.run.with_attempt(dispatch_token=token).model_copy(update={"placement_token": None})
            return Update(job.updated(job.updated_at, run=run))

        try:
            done = update_job(self.jobs, job_id, park, doing="dispatching")
        except JobMissing:
            self.tokens.fail(token, *stale)
            return
        if done.outcome is not None:
            self.tokens.fail(token, *done.outcome)
            return
        self.submits.send(submit_request(done.before), first=True)

    # -- the submit queue's consumer -------------------------------------------------------------
    def submit(self, request: SubmitRequest, first: bool = False) -> str:
        """Submit the attempt's Batch job once. Returns what happened: ``submitted``, ``exists``
        (submitted before: a redelivery), ``stale`` (the attempt is over), ``canceled``, ``failed``
        (the region's API refused or is down: the attempt fails as ``CloudApiError`` and is
        re-placed elsewhere), ``refused`` (the spec names a secret outside its tenant's prefix: the
        attempt fails as ``InvalidSpec``, nothing is submitted). Raises ``CloudThrottled`` or
        ``CloudOutcomeUnknown``: the request stays on the queue.

        ``first``: the first delivery of the dispatch's own request (``dispatch`` sends it with
        ``first``; the handler passes it only when SQS says it was never received before). No
        SubmitJob of this attempt can have been made then: every earlier request of the job is in
        the same FIFO message group, so it was done (the Batch job recorded, or the attempt over)
        before this one was delivered, and a retried dispatch's copy is dropped by SQS's
        deduplication. A single job's first try then submits without looking it up by name (one
        ListJobs less per job). A try after a lost race, and every redelivery, looks first."""
        look = not first

        def submit(job: Job) -> Decision[str]:
            nonlocal look
            placement = cloud_attempt(job)
            if placement is None or job.attempts != request.attempt:
                return Keep("stale")
            if job.run.attempt.batch_job_id:
                return Keep("exists")
            if job.status is S.CANCELING:
                return Keep("canceled")
            # Batch first, then its id on the job: a try that lost its race finds it by name.
            submitted = self._submit_batch(job, placement, look)
            look = True
            if isinstance(submitted, Keep):
                return submitted
            run = job.run.with_attempt(batch_job_id=submitted, submitted_at=self.clock())
            return Update(job.updated(job.updated_at, run=run), "submitted")

        try:
            done = update_job(self.jobs, request.job_id, submit, doing="submitting")
        except JobMissing:
            return "stale"
        if done.outcome == "canceled":
            self.cancel_unrecorded(done.before)
        return done.outcome

    def _submit_batch(self, job: Job, placement: CloudPlacement, look: bool = True) -> str | Keep[str]:
        """The attempt's Batch job id: found by name (an earlier try or delivery submitted it), else
        submitted now (``look`` False: a single job's first try, submitted without the lookup).
        ``Keep("refused")`` or ``Keep("failed")`` when it cannot be (the attempt's token failed).
        Raises ``CloudThrottled`` or ``CloudOutcomeUnknown``."""
        token = job.run.attempt.dispatch_token
        try:
            batch_request = submission(job, placement, self.settings)
        except SecretScopeError as exc:
            if token:
                self.tokens.fail(token, Failure.INVALID_SPEC.error_name, exc.message)
            return Keep("refused")
        called = True  # whether this request reached Batch (its success is the region's signal)
        try:
            if placement.group is not None:
                batch_id, called = self._group_child(job, placement)
            else:
                found = self.batch.find(placement.region, placement.queue, batch_request.name) if look else []
                batch_id = found[0].batch_job_id if found else self.batch.submit(batch_request)
        except (CloudThrottled, CloudOutcomeUnknown):
            # Still throttled after the adapter's backoff, or a SubmitJob that may or may not have
            # taken effect: part of the region's live signal, and the request stays on the queue
            # (redelivered later, never dropped; its redelivery looks the job up by name first).
            self.circuits.record_failure(placement.region, REGION_WIDE, self._now())
            raise
        except (CloudUnavailable, CloudRejected) as exc:
            self.circuits.record_failure(placement.region, REGION_WIDE, self._now())
            if token:
                self.tokens.fail(token, Failure.CLOUD_API.error_name, f"{placement.region}: {exc.message}")
            return Keep("failed")
        if called:
            self.circuits.record_success(placement.region, REGION_WIDE, self._now())
        return batch_id

    def _group_child(self, job: Job, placement: CloudPlacement) -> tuple[str, bool]:
        """The Batch job id of the attempt's child in its group's array job, which the first of the
        group's requests to get here submits (its requests share a FIFO message group, so one at a
        time): found by name (or remembered from this sandbox's earlier requests), else submitted
        with a row for every task still on this attempt. Child ``k`` runs task ``first + k``. Also
        whether Batch was called (a remembered id calls nothing)."""
        group, task = placement.group, job.spec.array_task
        assert group is not None and task is not None
        name = expected_batch_name(job)
        parent = self._parents.get(name)
        called = parent is None
        if parent is None:
            found = self.batch.find(placement.region, placement.queue, name)  # the parent, never a child
            if found:
                parent = found[0].batch_job_id
            else:
                ids = [task_id(task.array_id, group.first + k) for k in range(group.size)]
                stored = self.jobs.get_many(ids)
                members = [_on_group(stored.get(i), name) for i in ids]
                parent = self.batch.submit(group_submission(members, placement, self.settings))
            self._parents[name] = parent
            while len(self._parents) > PARENTS_KEPT:
                self._parents.pop(next(iter(self._parents)))
        return group_child_id(parent, task.index - group.first), called

    def cancel_unrecorded(self, job: Job) -> None:
        """End a canceled attempt that has no Batch job on record: a job of its name that a crashed
        submit left behind is terminated, then its token fails ``Canceled``."""
        placement = cloud_attempt(job)
        if placement is None:
            return
        name = expected_batch_name(job)
        reason = TERMINATED_BY_BERTH + "canceled"
        try:
            found = self.batch.find(placement.region, placement.queue, name)
            if placement.group is not None and job.spec.array_task is not None:
                # only this task's child: its neighbours in the group run on
                index = job.spec.array_task.index - placement.group.first
                children = [group_child_id(b.batch_job_id, index) for b in found]
                found = self.batch.describe(placement.region, children) if children else []
            for bj in found:
                if not bj.status.is_terminal:
                    self.batch.terminate(placement.region, bj.batch_job_id, reason, job.tenant)
        except CloudThrottled:
            raise
        except CloudError:
            return  # the next pass's sweep tries again
        if job.run.attempt.dispatch_token:
            self.tokens.fail(
                job.run.attempt.dispatch_token,
                Failure.CANCELED.error_name,
                "canceled before it was submitted",
            )

    # -- Batch Job State Change events -----------------------------------------------------------
    def on_event(
        self,
        batch_job_id: str,
        name: str,
        reported: BatchStatus | None = None,
        reads: EventReads | None = None,
    ) -> str:
        """Reconcile one Batch job that changed state. The event only names it: the job comes from
        the store, the state from DescribeJobs in the job's region (``reads``: what the event's SQS
        batch read for all its events at once). Events of an older attempt (or of a job Berth no
        longer runs) are ignored, and their Batch job terminated if still alive. An event that
        ``reported`` an earlier state than Batch's outcome moves the job to RUNNING at most: the
        outcome's own event answers the token (once), the sweep when that event is missed. The
        outcome's event first records the attempt's last checkpoint (``logic/cloud_checkpoints.py``;
        the sweep does not: a missed event leaves the job without it)."""
        parsed = batch_job_task(batch_job_id, name)
        if parsed is None:
            return "foreign"
        reads = reads or EventReads()
        job = reads.jobs[parsed[0]] if parsed[0] in reads.jobs else self.jobs.get(parsed[0])
        if job is None:
            return "unknown"
        placement = cloud_attempt(job)
        if parse_node_job_id(batch_job_id) is not None:  # a node of a gang (multi-node parallel job)
            if placement is None or job.attempts != parsed[1]:
                return "stale"
            return on_node_event(
                self.batch, job, placement, batch_job_id, reads.states, self.record_log_stream
            )
        stale = (
            placement is None
            or job.attempts != parsed[1]
            or expected_batch_name(job) != name
            or job.run.attempt.batch_job_id not in (None, batch_job_id)
        )
        if stale or placement is None:
            self._terminate_orphan(job, batch_job_id, reads)
            return "stale"
        bj = self._state(placement.region, batch_job_id, reads)
        if bj is None:
            return "unknown"
        if job.run.attempt.batch_job_id is None:
            job = self._adopt(job, batch_job_id)
            if job is None:
                return "stale"
        if reported is not None and not reported.is_terminal and bj.status.is_terminal:
            if bj.started_at is None:
                return "waiting"
            return self.reconcile(job, replace(bj, status=BatchStatus.RUNNING))
        if self.checkpoints is not None and bj.status.is_terminal:
            job = note_cloud_checkpoint(self.jobs, self.checkpoints, job, bj, self.clock)
        return self.reconcile(job, bj)

    def _state(self, region: str, batch_job_id: str, reads: EventReads) -> BatchJob | None:
        if batch_job_id in reads.states:
            return reads.states[batch_job_id]
        described = self.batch.describe(region, [batch_job_id])
        return described[0] if described else None

    def _adopt(self, job: Job, batch_job_id: str) -> Job | None:
        """An event that beat the submit's own write: record the Batch job now (conditionally)."""

        def adopt(current: Job) -> Decision[Job | None]:
            if cloud_attempt(current) is None or current.attempts != job.attempts:
                return Keep(None)
            if current.run.attempt.batch_job_id is not None:
                return Keep(current if current.run.attempt.batch_job_id == batch_job_id else None)
            run = current.run.with_attempt(batch_job_id=batch_job_id, submitted_at=self.clock())
            nxt = current.updated(current.updated_at, run=run)
            return Update(nxt, nxt)

        try:
            return update_job(self.jobs, job.id, adopt, doing="adopting its Batch job", current=job).outcome
        except (JobMissing, JobKeptChanging):
            return None  # the event is dropped as stale; the sweep reconciles the job

    def _terminate_orphan(self, job: Job, batch_job_id: str, reads: EventReads) -> None:
        region = region_of(job)
        if region is None:
            return
        try:
            bj = self._state(region, batch_job_id, reads)
            if bj is None:
                return
            self.record_log_stream(job, bj)  # an earlier attempt's output stays readable
            if not bj.status.is_terminal:
                self.batch.terminate(
                    region, batch_job_id, TERMINATED_BY_BERTH + "attempt no longer current", job.tenant
                )
        except CloudError:
            return  # the sweep of a later event tries again; an orphan costs money, not correctness

    def reconcile(self, job: Job, bj: BatchJob) -> str:
        """Move the job (and answer its token) to match what Batch says about its current attempt.
        The attempt's log stream, once Batch names it, is recorded first (before the job can end)."""
        placement = cloud_attempt(job)
        if placement is None:
            return "stale"
        if bj.status is BatchStatus.RUNNING:
            self.circuits.record_success(placement.region, placement.instance_type, self._now())
            return self._started(job, bj)  # the stream goes in with the move to RUNNING
        job = self.record_log_stream(job, bj)
        token = job.run.attempt.dispatch_token
        if bj.status is BatchStatus.SUCCEEDED:
            if token and self.tokens.succeed(token, {"result": "succeeded", "exit_code": 0}):
                self.circuits.record_success(placement.region, placement.instance_type, self._now())
                return "succeeded"
            return "answered"
        if bj.status is BatchStatus.FAILED:
            outcome = failed_outcome(bj, placement, launcher=not job.spec.image)
            if token and self.tokens.fail(token, outcome.failure.error_name, outcome.detail):
                if outcome.circuit is not None and job.status is not S.CANCELING and not job.run.attempt.stop:
                    self.circuits.record_failure(*outcome.circuit, self._now())
                return "failed"
            return "answered"
        return "waiting"

    def record_log_stream(self, job: Job, bj: BatchJob, rank: int = 0) -> Job:
        """Keep the stream Batch named for the attempt the Batch job ran (``container.logStreamName``;
        the attempt from its name) on the job, so ``GET /v1/jobs/{id}/logs`` reads it, also once the
        job has moved on; ``rank``: the node of a gang whose stream it is (``?rank=``). Idempotent;
        returns the job as stored afterwards when it is still on the same version line of that
        attempt, else the job as given."""
        named = _stream_to_record(job, bj)
        if named is None:
            return job
        attempt, stream = named

        def record(current: Job) -> Decision:
            if current.run.log_stream_of(attempt, rank) is not None:
                return Keep()  # recorded already (a stream, once named, does not change)
            return Update(
                current.updated(current.updated_at, run=current.run.with_log_stream(attempt, stream, rank))
            )

        try:
            current = update_job(
                self.jobs, job.id, record, doing="recording its log stream", current=job
            ).after
        except (JobMissing, JobKeptChanging):
            return job  # the next event or sweep of this Batch job records it
        same = (current.attempts, current.status, current.run.attempt.batch_job_id) == (
            job.attempts,
            job.status,
            job.run.attempt.batch_job_id,
        )
        return current if same else job

    def _started(self, job: Job, bj: BatchJob) -> str:
        """STARTING -> RUNNING, with the attempt's log stream if Batch names it, in one write."""

        def start(current: Job) -> Decision[str]:
            placement = cloud_attempt(current)
            if placement is None or current.attempts != job.attempts:
                return Keep("stale")
            if current.status is not S.STARTING:
                return Keep("running")
            now = self.clock()
            run = current.run.with_attempt(started_at=current.run.attempt.started_at or bj.started_at or now)
            named = _stream_to_record(current, bj)
            if named is not None and run.log_stream_of(named[0]) is None:
                run = run.with_log_stream(*named)
            nxt, event = current.transition(
                S.RUNNING, f"running in {placement.region} (Batch job {bj.batch_job_id})", now, run=run
            )
            return Save(nxt, event, "running")

        try:
            done = update_job(self.jobs, job.id, start, doing="starting", current=job)
        except JobMissing:
            return "stale"
        if not done.written and done.outcome == "running":
            self.record_log_stream(done.before, bj)
        return done.outcome


def _stream_to_record(job: Job, bj: BatchJob) -> tuple[int, str] | None:
    """``(attempt, stream)`` when ``bj`` names the log stream of one of the job's attempts (its
    current one only if ``bj`` is that attempt's recorded Batch job), else None."""
    parsed = batch_job_task(bj.batch_job_id, bj.name)
    if not is_log_stream_name(bj.log_stream) or parsed is None or parsed[0] != job.id:
        return None
    if parsed[1] == job.attempts and job.run.attempt.batch_job_id not in (None, bj.batch_job_id):
        return None  # not the current attempt's Batch job (an orphan of the same name)
    return parsed[1], str(bj.log_stream)


def submit_request(job: Job) -> SubmitRequest:
    """The submit queue's message for the job's current attempt (its group's, if it has one)."""
    group = None
    if isinstance(job.placement, CloudPlacement) and job.placement.group is not None:
        group = expected_batch_name(job)
    return SubmitRequest(job_id=job.id, attempt=job.attempts, group=group)


def _on_group(job: Job | None, name: str) -> Job | None:
    """The task, if its current attempt is still waiting for this group's array job, else None (its
    child runs nothing: it was canceled, moved on, or never placed here)."""
    if job is None or job.status is not S.STARTING or job.run.attempt.stop or cloud_attempt(job) is None:
        return None
    if job.run.attempt.batch_job_id is not None or expected_batch_name(job) != name:
        return None
    return job


def region_of(job: Job) -> str | None:
    return job.placement.region if isinstance(job.placement, CloudPlacement) else None


__all__ = [
    "TERMINATED_BY_BERTH",
    "CloudDispatchService",
    "EventReads",
    "cloud_attempt",
    "region_of",
    "submit_request",
]
