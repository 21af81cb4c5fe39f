"""The agent API's use cases (docs/agent-protocol.md): hosts register, heartbeat, claim and report.

A host is identified by its own IAM identity (``HostCaller``), never by the body. Every call about an
attempt names it with its fencing token; the service checks that the attempt is the job's current
one, that this host is one of its placed hosts and that the token matches, so a host can never read
or report on another host's attempt, and a host that comes back after its attempt was re-placed is
refused (``Fenced``). Agents never write the store: this service does, conditionally.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from berth.domain.agent_wire import AttemptCredentials, ClaimAnswer, HeartbeatAnswer, RegisterAnswer
from berth.domain.errors import Conflict, DomainError, NotFound, StoreUnavailable, ValidationFailed
from berth.domain.fleet import HostInventory
from berth.domain.job import Job, iso
from berth.domain.job_access import MAX_CREDENTIAL_S
from berth.domain.observability import MAX_CLOCK_SKEW_S, METRICS_RETENTION_DAYS, MetricsBatch
from berth.domain.placement import OnPremPlacement
from berth.domain.ports import (
    HostRepository,
    JobRepository,
    MetricsRepository,
    PassTrigger,
    TaskTokens,
    UsageLedger,
    WorkQueues,
)
from berth.domain.reasons import attempt_failure_detail
from berth.domain.status import JobStatus
from berth.domain.workflow import (
    PROTOCOL_VERSION,
    AttemptRef,
    AttemptReport,
    CheckpointInfo,
    Directive,
    Failure,
    HeartbeatRequest,
    ReportEvent,
    RunState,
    agent_failure,
)
from berth.logic.credentials import CredentialService
from berth.logic.gpu_faults import GpuFaultService
from berth.logic.job_update import Change, Decision, JobMissing, JobUpdate, Keep, Save, Update, update_job
from berth.logic.workflow import WorkflowSettings, completion, hold_releases, release_holds

S = JobStatus
log = logging.getLogger(__name__)
MASTER_PORT = 29500


class Fenced(Conflict):
    """The attempt is not (or no longer) this host's current one."""

    code = "Fenced"


class AlreadyClaimed(Conflict):
    code = "AlreadyClaimed"


class AttemptCanceled(Conflict):
    code = "Canceled"


@dataclass(frozen=True, slots=True)
class HostCaller:
    """A verified host identity: the host id its IAM principal is registered as."""

    host_id: str
    principal: str


@dataclass(frozen=True)
class AgentService:
    jobs: JobRepository
    hosts: HostRepository
    tokens: TaskTokens
    queues: WorkQueues
    trigger: PassTrigger
    clock: Callable[[], datetime]
    settings: WorkflowSettings = field(default_factory=WorkflowSettings)
    #: Vends attempts' scoped STS credentials; None where the deployment names no job role.
    vendor: CredentialService | None = None
    #: Stores attempts' usage samples; None where the deployment keeps none.
    metric_store: MetricsRepository | None = None
    #: The usage ledger the job repository writes final records to (None: none kept), as the
    #: workflow's: the last rank's report completes the job with its attempt's final record.
    usage: UsageLedger | None = None
    metrics_retention: timedelta = timedelta(days=METRICS_RETENTION_DAYS)

    # -- hosts -----------------------------------------------------------------------------------
    def register(self, host: HostCaller, inventory: HostInventory) -> dict[str, Any]:
        if inventory.host_id != host.host_id:
            raise Fenced(
                f"this identity is host {host.host_id!r}; it cannot register as {inventory.host_id!r}",
                details={"host_id": host.host_id},
            )
        lease = self.clock() + timedelta(seconds=self.settings.lease_s)
        self.hosts.register(inventory, lease)
        queue_url = self.queues.ensure(host.host_id)
        self.trigger.request(f"host {host.host_id} registered")
        return RegisterAnswer(
            host_id=host.host_id,
            queue_url=queue_url,
            lease_expires_at=lease,
            lease_s=self.settings.lease_s,
            outage_tolerance_s=self.settings.outage_tolerance_s,
            heartbeat_s=self.settings.agent_heartbeat_s,
            protocol=PROTOCOL_VERSION,
        ).model_dump(mode="json")

    def heartbeat(self, host: HostCaller, request: HeartbeatRequest) -> dict[str, Any]:
        """Renew the host's lease and each running attempt's heartbeat; answer with directives."""
        rec = self.hosts.get(host.host_id)
        if rec is None:
            raise NotFound(f"host {host.host_id!r} is not registered; register first")
        now = self.clock()
        lost = not rec.healthy and rec.lease_expires_at is not None and rec.lease_expires_at <= now
        if lost:
            # Its lease expired and its attempts were failed: it must register again, and everything
            # it still runs belongs to nobody (fenced).
            stops = [
                Directive(job_id=a.job_id, attempt=a.attempt, action="stop", reason="host lease expired")
                for a in request.attempts
            ]
            return HeartbeatAnswer(reregister=True, directives=tuple(stops)).model_dump(mode="json")
        lease = now + timedelta(seconds=self.settings.lease_s)
        self.hosts.heartbeat(
            host.host_id,
            lease,
            healthy=request.healthy,
            draining=request.draining,
            cached_datasets=request.cached_datasets,
        )
        # Its GPU faults first: an attempt on a GPU that just failed gets its stop in this answer.
        directives = GpuFaultService(self.jobs, self.hosts, self.clock).on_heartbeat(rec, request.gpu_faults)
        if rec.drain_requested:
            # Level-triggered: every answer carries it while the drain is requested; the agent takes
            # no new work while it does and resumes once an answer comes without it.
            directives.append(Directive(action="drain", reason="an operator asked this host to drain"))
        checkpoints = {(c.job_id, c.attempt, c.fencing_token): c for c in request.checkpoints}
        for ref in request.attempts:
            job = self.jobs.get(ref.job_id)
            if job is None or not _is_current(job, host.host_id, ref):
                directives.append(
                    Directive(job_id=ref.job_id, attempt=ref.attempt, action="stop", reason="fenced")
                )
                continue
            ckpt = checkpoints.get((ref.job_id, ref.attempt, ref.fencing_token))
            if ckpt is not None:
                job = self._note_checkpoint(job, ref.attempt, ckpt)
            if job.run.attempt.dispatch_token:
                self.tokens.heartbeat(job.run.attempt.dispatch_token)
            if job.status is S.CANCELING:
                directives.append(
                    Directive(job_id=job.id, attempt=ref.attempt, action="cancel", reason=job.reason)
                )
            elif job.run.attempt.stop:
                directives.append(
                    Directive(job_id=job.id, attempt=ref.attempt, action="stop", reason=job.run.attempt.stop)
                )
        return HeartbeatAnswer(lease_expires_at=lease, directives=tuple(directives)).model_dump(mode="json")

    def request_drain(self, host_id: str, drain: bool = True) -> None:
        """The operator's drain of a host (no API route in protocol v1: an admin script or the local
        cloud calls it): the scheduler places nothing more there, and the host's next heartbeat
        answers ``drain``, so its agent stops taking work while its running attempts finish.
        ``drain=False`` undoes it. NotFound for an unknown host."""
        self.hosts.request_drain(host_id, drain)
        if not drain:
            self.trigger.request(f"host {host_id} undrained")

    # -- attempts --------------------------------------------------------------------------------
    def claim(self, host: HostCaller, ref: AttemptRef) -> dict[str, Any]:
        """Claim this host's rank of an attempt: once (a second claim, a duplicate delivery, loses)."""

        def claim(job: Job) -> Decision:
            """Keep: the job is being canceled (no claim)."""
            job = _current_attempt(job, host.host_id, ref)
            if host.host_id in job.run.attempt.claimed:
                raise AlreadyClaimed(
                    f"host {host.host_id} already claimed attempt {ref.attempt} of {ref.job_id}"
                )
            if job.status is S.CANCELING:
                return Keep()
            if job.status is not S.STARTING and job.status is not S.RUNNING:
                raise Fenced(f"job {job.id} is {job.status}; nothing to claim")
            run = job.run.with_attempt(claimed=(*job.run.attempt.claimed, host.host_id))
            return Update(job.updated(job.updated_at, run=run))

        done = self._update_attempt(host, ref, claim, "claiming")
        job = done.before
        if not done.written:
            if job.run.attempt.dispatch_token and not job.run.attempt.claimed:
                self.tokens.fail(
                    job.run.attempt.dispatch_token, Failure.CANCELED.error_name, "canceled before start"
                )
            raise AttemptCanceled(f"job {job.id} is being canceled")
        assert isinstance(job.placement, OnPremPlacement)
        hosts = job.placement.hosts
        rank = next(i for i, h in enumerate(hosts) if h.host_id == host.host_id)
        return ClaimAnswer(
            credentials=self._vended_with_claim(done.after, ref.attempt),
            job_id=job.id,
            attempt=job.attempts,
            tenant=job.tenant,
            spec=job.spec,
            gpu_ids=hosts[rank].gpu_ids,
            rank=rank,
            world_size=len(hosts),
            hosts=tuple(h.host_id for h in hosts),
            master_addr=hosts[0].host_id,
            master_port=MASTER_PORT,
            heartbeat_s=self.settings.agent_heartbeat_s,
        ).model_dump(mode="json", exclude_none=True)

    def report(self, host: HostCaller, report: AttemptReport) -> dict[str, Any]:
        if report.checkpoint is not None:
            current = self._current(host, report)
            if host.host_id in current.run.attempt.claimed:
                self._note_checkpoint(current, report.attempt, report.checkpoint)

        def record(job: Job) -> Decision:
            """Note this rank's start or success on the attempt (once); Keep: nothing new to note."""
            job = _current_attempt(job, host.host_id, report)
            if host.host_id not in job.run.attempt.claimed:
                raise Fenced(f"host {host.host_id} has not claimed attempt {report.attempt} of {job.id}")
            now = self.clock()
            if report.event is ReportEvent.STARTED and host.host_id not in job.run.attempt.started:
                run = job.run.with_attempt(
                    started=(*job.run.attempt.started, host.host_id),
                    started_at=job.run.attempt.started_at or now,
                )
                if job.status is S.STARTING:
                    nxt, event = job.transition(S.RUNNING, f"running on {host.host_id}", now, run=run)
                    return Save(nxt, event)
                return Update(job.updated(job.updated_at, run=run))
            if report.event is ReportEvent.SUCCEEDED and host.host_id not in job.run.attempt.succeeded:
                run = job.run.with_attempt(succeeded=(*job.run.attempt.succeeded, host.host_id))
                if _completes(job, run):
                    # The last rank: COMPLETED in this write, so the execution skips Finalize.
                    keep = self.usage is not None
                    return completion(job.model_copy(update={"run": run}), report.attempt, now, keep)
                return Update(job.updated(job.updated_at, run=run))
            return Keep()

        done = self._update_attempt(host, report, record, "reporting")
        token = done.before.run.attempt.dispatch_token
        # A start answers no token and sends no SendTaskHeartbeat of its own: the agent heartbeats
        # every attempt from its claim on (``heartbeat``), well inside the dispatch's HeartbeatSeconds.
        if report.event is ReportEvent.SUCCEEDED:
            placement = done.before.placement
            assert isinstance(placement, OnPremPlacement)
            completed = done.written and done.after.status is S.COMPLETED
            if completed and not hold_releases(done.before, report.attempt):
                self._release(done.before, report.attempt)  # GPUs given back in the write otherwise
            if done.written and token and len(done.after.run.attempt.succeeded) >= len(placement.hosts):
                # ``completed``: the workflow goes straight to its end (Finalize would find nothing
                # to do); otherwise Finalize completes the job (a start never reported).
                output = {"result": "succeeded", "exit_code": report.exit_code or 0, "completed": completed}
                self.tokens.succeed(token, output)
        elif report.event is not ReportEvent.STARTED and token:
            # FAILED or CANCELED: one rank failing fails the attempt on every host (the workflow
            # classifies it; the other ranks get a stop directive once the attempt is no longer current).
            failure = (
                Failure.CANCELED if report.event is ReportEvent.CANCELED else agent_failure(report.failure)
            )
            # Berth's own words: never the agent's text about a run (it could quote job output).
            detail = attempt_failure_detail(done.before.id, failure, report.exit_code, report.message)
            self.tokens.fail(token, failure.error_name, f"{host.host_id}: {detail}")
        return self._answer(done.after)

    def _release(self, job: Job, attempt: int) -> None:
        """Free the GPUs of the attempt the agent API completed (as Finalize does). A failure leaves
        them to the orphan reaper (``orphan_grace_s``): the job is COMPLETED either way."""
        try:
            release_holds(self.hosts, job, attempt)
        except StoreUnavailable as exc:
            log.warning(
                "GPUs of a completed attempt not released; the orphan reaper will",
                extra={"job_id": job.id, "attempt": attempt, "error": str(exc)},
            )

    def _update_attempt(self, host: HostCaller, ref: AttemptRef, change: Change, doing: str) -> JobUpdate:
        """``update_job`` on the attempt ``ref`` names; a missing job is answered like another host's."""
        try:
            return update_job(self.jobs, ref.job_id, change, doing=doing)
        except JobMissing:
            raise _not_this_hosts(ref) from None

    def credentials(self, host: HostCaller, ref: AttemptRef) -> dict[str, Any]:
        """The attempt's scoped credentials (session policy from the tenant record, SourceIdentity =
        job id, no longer than what is left of the attempt's time limit): only to the host that
        claimed this rank of the current attempt, with its fencing token. A claim's answer carries
        the first ones; an agent asks here to refresh them (and when the claim's came without)."""
        job = self._current(host, ref)
        if host.host_id not in job.run.attempt.claimed:
            raise Fenced(f"host {host.host_id} has not claimed attempt {ref.attempt} of {job.id}")
        return self._vend(job, ref.attempt).wire()

    def _vend(self, job: Job, attempt: int) -> AttemptCredentials:
        if self.vendor is None:
            raise NotFound("this deployment vends no job credentials")
        remaining = float(MAX_CREDENTIAL_S)
        if job.spec.timeout_minutes:
            started = job.run.attempt.started_at or self.clock()
            elapsed = (self.clock() - started).total_seconds()
            remaining = min(remaining, job.spec.timeout_minutes * 60 - elapsed)
        creds = self.vendor.for_attempt(job, attempt, remaining)
        return AttemptCredentials(
            access_key_id=creds.access_key_id,
            secret_access_key=creds.secret_access_key,
            session_token=creds.session_token,
            expiration=iso(creds.expiration),
        )

    def _vended_with_claim(self, job: Job, attempt: int) -> AttemptCredentials | None:
        """The claimed attempt's first credentials, or None: the claim is already written, so a
        vending failure (STS or the tenant record unavailable) must not fail its answer; the agent
        asks ``/v1/agent/credentials`` instead, with its own retries."""
        if self.vendor is None:
            return None
        try:
            return self._vend(job, attempt)
        except DomainError as exc:
            log.warning(
                "credentials not vended with the claim; the agent will ask for them",
                extra={"job_id": job.id, "attempt": attempt, "code": exc.code},
            )
            return None

    def metrics(self, host: HostCaller, batch: MetricsBatch) -> dict[str, Any]:
        """Store usage samples of this host's rank of the current attempt (fenced like a report).
        A sample dated before the job existed or ahead of the clock by more than the allowed skew
        refuses the whole batch (422): nothing of it is stored."""
        job = self._current(host, batch)
        if host.host_id not in job.run.attempt.claimed:
            raise Fenced(f"host {host.host_id} has not claimed attempt {batch.attempt} of {job.id}")
        if self.metric_store is None:
            raise NotFound("this deployment stores no job metrics")
        now = self.clock()
        skew = timedelta(seconds=MAX_CLOCK_SKEW_S)
        bad = [i for i, s in enumerate(batch.samples) if s.at > now + skew or s.at < job.created_at - skew]
        if bad:
            raise ValidationFailed(
                f"{len(bad)} sample(s) dated outside the job's lifetime (check the host's clock)",
                details={"samples": bad[:20]},
            )
        expires = int((now + self.metrics_retention).timestamp())
        self.metric_store.put(job.id, batch.attempt, host.host_id, list(batch.samples), expires)
        return {"stored": len(batch.samples), **self._answer(job)}

    def _current(self, host: HostCaller, ref: AttemptRef) -> Job:
        job = self.jobs.get(ref.job_id)
        if job is None:
            raise _not_this_hosts(ref)
        return _current_attempt(job, host.host_id, ref)

    def _note_checkpoint(self, job: Job, attempt: int, ckpt: CheckpointInfo) -> Job:
        """Keep the attempt's last checkpoint on the job's run state when it is newer than the one
        stored: one conditional write per new checkpoint (every 30 s at most per running job),
        best effort (a lost race leaves it to the next heartbeat). ``RunState.with_checkpoint`` rules."""
        run = job.run.with_checkpoint(attempt, ckpt, self.clock())
        if run is None:
            return job
        nxt = job.updated(job.updated_at, run=run)
        try:
            self.jobs.update(nxt)
        except Conflict:
            return job
        return nxt

    @staticmethod
    def _answer(job: Job) -> dict[str, Any]:
        directive = "cancel" if job.status is S.CANCELING else ("stop" if job.run.attempt.stop else None)
        return {"directive": directive, "status": str(job.status)}


def _completes(job: Job, run: RunState) -> bool:
    """Whether ``run`` (``job``'s with one more rank succeeded) completes the job in the report's own
    write: every rank succeeded, the job RUNNING (or CANCELING: one that finished first completes)
    and its dispatch token parked. A job whose start was never reported is left to Finalize, which
    writes its RUNNING event first."""
    placement = job.placement
    return (
        isinstance(placement, OnPremPlacement)
        and len(run.attempt.succeeded) >= len(placement.hosts)
        and job.status in (S.RUNNING, S.CANCELING)
        and job.run.attempt.dispatch_token is not None
    )


def _not_this_hosts(ref: AttemptRef) -> NotFound:
    return NotFound(f"attempt {ref.attempt} of job {ref.job_id!r} is not this host's")


def _current_attempt(job: Job, host_id: str, ref: AttemptRef) -> Job:
    """``job`` if ``ref`` names its current attempt on ``host_id``; else NotFound (another host's
    attempt is answered exactly like a missing one: nothing about it leaks) or Fenced."""
    if not _placed_on(job, host_id):
        raise _not_this_hosts(ref)
    if not _is_current(job, host_id, ref):
        raise Fenced(
            f"attempt {ref.attempt} of job {ref.job_id} is no longer this host's "
            f"(the job is at attempt {job.attempts}, {job.status})"
        )
    return job


def _placed_on(job: Job, host_id: str) -> bool:
    return isinstance(job.placement, OnPremPlacement) and any(
        h.host_id == host_id for h in job.placement.hosts
    )


def _is_current(job: Job, host_id: str, ref: AttemptRef) -> bool:
    return (
        job.status in (S.STARTING, S.RUNNING, S.CANCELING)
        and job.attempts == ref.attempt
        and job.run.attempt.fencing_token is not None
        and job.run.attempt.fencing_token == ref.fencing_token
        and _placed_on(job, host_id)
    )
