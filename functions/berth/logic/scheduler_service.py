"""The scheduler service: one pass = reap lost hosts, load the snapshot, call the pure core, apply.

Applying a placement is one transaction (``PlacementWriter.place``): each host's GPUs held for the
attempt (the UUIDs, picked from the snapshot, must all still be free, so no GPU is ever given to two
attempts and free GPUs never go negative) and the job moved QUEUED -> STARTING with its placement
(conditional on its version, so a job is placed once) and its event, all or nothing. A racing pass
loses the whole transaction and skips that job. After the write, the execution's placement token is
answered; a pass that dies in between leaves a STARTING job whose token the next pass answers again
(``reanswer_placements``). Placements on one host are written together, as one such transaction
(``PlacementWriter.place_many``; a group that loses a race is applied again one placement at a time).
Placements are applied concurrently and stop at a deadline (``berth.logic.pass_apply``); whatever a pass
did not apply, the next one decides again from the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from berth.domain.cost import CostRates, accrual_due, attempt_usage, cost_limit
from berth.domain.errors import Conflict, StoreUnavailable
from berth.domain.fleet import attempt_key
from berth.domain.job import Job
from berth.domain.placement import OnPremPlacement, Site
from berth.domain.ports import (
    Executions,
    HostRepository,
    JobRepository,
    PassTrigger,
    PlacementWriter,
    QueueSummaries,
    TaskTokens,
    UsageLedger,
)
from berth.domain.queue import QueueEntry
from berth.domain.queue_summary import QueueSummary, summarize
from berth.domain.status import JobStatus
from berth.domain.workflow import Failure
from berth.logic.cloud_sweep import CloudSweep, SweepReport
from berth.logic.pass_apply import (
    APPLY_WORKERS,
    DEADLINE_RESERVE_S,
    HYDRATE_WINDOW,
    MAX_GROUP,
    MAX_REASON_WRITES,
    MIN_PLACEMENTS,
    Deadline,
    Outcome,
    heads_first,
    run_bounded,
)
from berth.logic.pass_figures import PassFigures, pass_figures
from berth.logic.pass_placing import PlacementApplier
from berth.logic.snapshot import SnapshotSource
from berth.logic.workflow import WorkflowSettings, placement_output
from berth.scheduler.circuit import CircuitBoard, CircuitState
from berth.scheduler.core import schedule
from berth.scheduler.decisions import OnPremAssignment

S = JobStatus
#: The longest a pass asks to be woken later for (an SQS delay is at most 15 minutes).
MAX_WAKE_S = 900
#: A job due to reach its ``max_cost_usd`` within this many seconds gets a pass asked for at that
#: time (later ones are caught by the timer's passes).
COST_WAKE_WITHIN_S = 120


@dataclass
class PassReport:
    """What one pass did, with the time each phase took (``berth bench pass`` prints it)."""

    pending: int = 0
    """Queued jobs the pass read (the heads of the tenants' queues)."""
    not_considered: int = 0
    """Queued (or retrying) jobs the pass did not read: deeper than its read budget, or of tenants
    it did not reach (round-robin); the next passes read them as the heads drain."""
    running: int = 0
    hosts: int = 0
    placed: int = 0
    placed_by_site: dict[str, int] = field(default_factory=dict)
    """``placed`` per site (``onprem``, ``cloud``)."""
    skipped: int = 0
    """Placements lost to a race (GPUs or job taken meanwhile): decided again next pass."""
    deferred: int = 0
    """Placements not applied because the pass reached its deadline: decided again next pass (one is
    asked for at once)."""
    reasons_deferred: int = 0
    """Changed reasons left for the next pass by the deadline."""
    preempted: int = 0
    reasons_written: int = 0
    queue_summaries_written: int = 0
    """Tenants whose queue summary (positions, estimated starts) changed and was rewritten."""
    lost_hosts: list[str] = field(default_factory=list)
    orphans_released: int = 0
    executions_restarted: int = 0
    placements_reanswered: int = 0
    costs_accrued: int = 0
    """Running jobs whose cost so far was written."""
    cost_limited: int = 0
    """Running jobs stopped because they would exceed their ``max_cost_usd``."""
    wake_in_s: float | None = None
    cloud: SweepReport | None = None
    load_s: float = 0.0
    decide_s: float = 0.0
    apply_s: float = 0.0
    figures: PassFigures = field(default_factory=PassFigures)
    """The queue per team and GPU type, and budget burn (published as metrics, not logged)."""

    def as_dict(self) -> dict[str, Any]:
        out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        out["cloud"] = None if self.cloud is None else dict(self.cloud.__dict__)
        del out["figures"]
        return out


@dataclass(frozen=True)
class SchedulerService:
    source: SnapshotSource
    jobs: JobRepository
    hosts: HostRepository
    tokens: TaskTokens
    trigger: PassTrigger
    clock: Callable[[], datetime]
    new_token: Callable[[], str]
    settings: WorkflowSettings = field(default_factory=WorkflowSettings)
    executions: Executions | None = None
    """Restarts the execution of a queued job that has none waiting (a start lost after the submit)."""
    execution_repair_s: int = 30
    cloud: CloudSweep | None = None
    """Watches placed cloud attempts through Batch (None: no cloud dispatcher deployed)."""
    #: Test hook: called after each applied placement (a crash injected here leaves a half-applied pass).
    after_apply: Callable[[Job], None] | None = None
    #: Where running attempts' usage so far is recorded (None: only the jobs' cost is written).
    usage: UsageLedger | None = None
    #: Writes each placement as one transaction (host holds, job, event).
    placements: PlacementWriter | None = field(default=None, kw_only=True)
    apply_workers: int = APPLY_WORKERS
    deadline_reserve_s: float = DEADLINE_RESERVE_S
    #: Placements a pass starts even past its deadline (progress when the load ate the time).
    min_placements: int = MIN_PLACEMENTS
    #: Decided placements whose full items are read at a time, each window just before it is applied.
    hydrate_window: int = HYDRATE_WINDOW
    #: Placements on one host written in one transaction at most (1: each placement on its own).
    max_group: int = MAX_GROUP
    #: Changed reasons a pass writes at most, heads of the tenants' queues first.
    max_reason_writes: int = MAX_REASON_WRITES
    #: Where each tenant's queue as this pass saw it is kept (None: positions are not recorded).
    queue_summaries: QueueSummaries | None = None
    #: The summaries this warm process last wrote, per tenant (one is rewritten only when it changed).
    _summaries_written: dict[str, QueueSummary] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.placements is None:
            raise TypeError("SchedulerService needs placements (a PlacementWriter)")

    def run_pass(self, time_left: Callable[[], float] | None = None) -> PassReport:
        """One pass. ``time_left()``: seconds left of the invocation (Lambda's remaining time; None:
        no deadline); the pass stops starting placements when fewer than ``deadline_reserve_s`` are."""
        report = PassReport()
        deadline = Deadline(time_left, self.deadline_reserve_s)
        t0 = time.perf_counter()
        now = self.clock()
        report.lost_hosts = self.reap_lost_hosts(now)
        inputs = self.source.pass_inputs()
        report.pending, report.running = len(inputs.pending), len(inputs.running_jobs)
        report.not_considered = sum(inputs.snapshot.unread.values())
        report.hosts = len(inputs.fleet.records)
        report.figures = pass_figures(inputs.pending, inputs.snapshot.tenants, now)
        report.orphans_released = self.release_orphans(inputs.fleet.records, inputs.running_jobs, now)
        report.executions_restarted = self.repair_executions(inputs.pending, now, inputs.running_jobs)
        report.placements_reanswered = self.reanswer_placements(inputs.running_jobs, now)
        if self.cloud is not None:
            board = CircuitBoard(inputs.fleet.circuits, now.timestamp(), inputs.fleet.policy.circuit)
            report.cloud = self.cloud.run(
                inputs.running_jobs, now, lambda r: board.state(r, "*") is CircuitState.OPEN
            )
        t1 = time.perf_counter()
        decisions = schedule(
            inputs.snapshot, inputs.fleet.policy, now.timestamp(), forecast=self.queue_summaries is not None
        )
        t2 = time.perf_counter()
        by_id = {e.job_id: e for e in inputs.pending}
        rates = inputs.fleet.policy.accounting
        decided = [a for a in decisions.placements if a.job_id in by_id]
        assignments, outcomes, report.skipped = self.applier().place_decided(
            decided, inputs.fleet.records, now, rates, deadline
        )
        report.placed = outcomes.count(Outcome.PLACED)
        for assignment, outcome in zip(assignments, outcomes, strict=True):
            if outcome is Outcome.PLACED:
                site = Site.ONPREM if isinstance(assignment, OnPremAssignment) else Site.CLOUD
                report.placed_by_site[site.value] = report.placed_by_site.get(site.value, 0) + 1
        report.skipped += outcomes.count(Outcome.SKIPPED)
        report.deferred = outcomes.count(Outcome.DEFERRED)
        running = {j.id: j for j in inputs.running_jobs}
        for preemption in decisions.preemptions:
            victim = running.get(preemption.job_id)
            if victim is not None and self.stop_attempt(
                victim, f"preempted for job {preemption.for_job} ({preemption.rule})"
            ):
                report.preempted += 1
        for repatriation in decisions.repatriations:
            victim = running.get(repatriation.job_id)
            if victim is not None:
                self.stop_attempt(victim, f"repatriated on-prem (saves ${repatriation.saving_usd:.2f})")
        report.costs_accrued, report.cost_limited, cost_wake = self.accrue_costs(
            inputs.running_jobs, rates, now
        )
        report.reasons_written, report.reasons_deferred = self.write_reasons(by_id, decisions, deadline)
        report.queue_summaries_written = self.write_queue_summaries(decisions, inputs.snapshot.unread, now)
        if report.deferred:
            self.trigger.request("deferred placements")
        elif Outcome.SKIPPED in outcomes:
            # Lost a race (a job or host changed since the read): decided again in a pass soon,
            # not at the timer's (an array's tasks racing their own executions' first writes).
            self.trigger.request("placements lost a race", delay_s=1)
        if decisions.wake_at is not None:
            wait = max(1.0, decisions.wake_at - now.timestamp())
            report.wake_in_s = wait
            self.trigger.request("wake_at", delay_s=int(min(MAX_WAKE_S, wait)))
        if cost_wake is not None and (report.wake_in_s is None or cost_wake < report.wake_in_s):
            self.trigger.request("cost limit", delay_s=max(1, int(cost_wake)))
        t3 = time.perf_counter()
        report.load_s, report.decide_s, report.apply_s = t1 - t0, t2 - t1, t3 - t2
        return report

    def applier(self) -> PlacementApplier:
        """What applies this pass's placements, with the pool's settings as they are now."""
        assert self.placements is not None
        return PlacementApplier(
            source=self.source,
            hosts=self.hosts,
            tokens=self.tokens,
            placements=self.placements,
            new_token=self.new_token,
            after_apply=self.after_apply,
            apply_workers=self.apply_workers,
            max_group=self.max_group,
            min_placements=self.min_placements,
            hydrate_window=self.hydrate_window,
        )

    # -- leases ----------------------------------------------------------------------------------
    def reap_lost_hosts(self, now: datetime) -> list[str]:
        """Hosts silent for ``host_silence_s`` past their lease are marked lost; their attempts fail as
        ``HostLost`` (transient). Between the lease and that point nothing new is placed there, and
        its agent, which cannot tell a control-plane outage from its own partition, keeps running
        what it has (``outage_tolerance_s``) and has stopped it before this declares the host lost."""
        lost: list[str] = []
        cutoff = now - timedelta(seconds=self.settings.host_silence_s)
        for rec in self.hosts.list_hosts():
            expired = rec.healthy and rec.lease_expires_at is not None and rec.lease_expires_at < cutoff
            if expired and self.hosts.mark_lost(rec.host_id, cutoff):
                lost.append(rec.host_id)
        if not lost:
            return lost
        for status in (S.STARTING, S.RUNNING, S.CANCELING):
            for job in self.jobs.list_placed(status):
                p = job.placement
                if isinstance(p, OnPremPlacement) and any(h.host_id in lost for h in p.hosts):
                    token = job.run.attempt.dispatch_token
                    gone = ", ".join(h.host_id for h in p.hosts if h.host_id in lost)
                    if token:
                        self.tokens.fail(token, Failure.HOST_LOST.error_name, f"host {gone} lost its lease")
        return lost

    def release_orphans(self, records: Any, running_jobs: list[Job], now: datetime) -> int:
        """Release holds that no placed job names, once older than the grace period."""
        owned: set[tuple[str, str]] = set()
        for job in running_jobs:
            if isinstance(job.placement, OnPremPlacement):
                for h in job.placement.hosts:
                    owned.add((h.host_id, attempt_key(job.id, job.attempts)))
        released = 0
        for rec in records:
            for key, hold in rec.holds.items():
                if (rec.host_id, key) in owned:
                    continue
                age = None if hold.at is None else (now - hold.at).total_seconds()
                if age is None or age >= self.settings.orphan_grace_s:
                    # A job that placed this hold after the snapshot was read would be in "owned"
                    # next pass; the grace period covers that window.
                    holder = self.jobs.get(key.split("#", 1)[0])
                    if holder is not None and _holds(holder, rec.host_id, key):
                        continue
                    released += int(self.hosts.release(rec.host_id, key))
        return released

    def repair_executions(self, pending: list[QueueEntry], now: datetime, running: Sequence[Job] = ()) -> int:
        """Queued jobs whose execution never parked a placement token (its start was lost) get one;
        a start for a job that has an execution is refused by name, so this is always safe. So do
        STARTING jobs that a pass placed before any execution parked a token (a pass asked for by
        the job's submit, through the job-events stream, may come first) and that no execution has
        dispatched for the orphan grace: their start was lost too, and the new execution's
        WaitForPlacement answers itself at once."""
        if self.executions is None:
            return 0
        restarted = 0
        for entry in pending:
            if (
                entry.awaiting_execution
                and (now - entry.updated_at).total_seconds() >= self.execution_repair_s
            ):
                self.executions.start(entry.job_id, self.settings.execution_input(entry.job_id))
                restarted += 1
        for job in running:
            if (
                job.status is S.STARTING
                and job.run.placement_token is None
                and job.run.attempt.dispatch_token is None
                and (now - job.updated_at).total_seconds() >= self.settings.orphan_grace_s
            ):
                self.executions.start(job.id, self.settings.execution_input(job.id))
                restarted += 1
        return restarted

    def reanswer_placements(self, running: list[Job], now: datetime) -> int:
        """A pass that died between placing a job and answering its execution's token leaves the job
        STARTING with no dispatch: answer the token again (an answered one is refused, harmlessly)."""
        answered = 0
        for job in running:
            token = job.run.placement_token
            stale = (now - job.updated_at).total_seconds() >= self.settings.orphan_grace_s
            if job.status is S.STARTING and token and job.run.attempt.dispatch_token is None and stale:
                answered += int(self.tokens.succeed(token, placement_output(job)))
        return answered

    def stop_attempt(self, job: Job, reason: str, failure: Failure | None = None) -> bool:
        """Ask the running attempt's hosts to stop (a ``stop`` directive); the workflow requeues it,
        or, when ``failure`` says what the stop stands for, classifies it as that."""
        if job.status is not S.RUNNING or job.run.attempt.stop:
            return False
        run = job.run.with_attempt(stop=reason, stop_failure=failure)
        try:
            self.jobs.update(job.updated(job.updated_at, run=run))
        except Conflict:
            return False
        return True

    # -- cost --------------------------------------------------------------------------------------
    def accrue_costs(
        self, running: list[Job], rates: CostRates, now: datetime
    ) -> tuple[int, int, float | None]:
        """Write running jobs' cost so far (bounded: ``CostRates.accrual_step_usd`` and
        ``accrual_interval_s``) with their usage record, and stop those about to exceed their
        ``max_cost_usd`` (they end FAILED with ``CostLimit``). Returns (written, stopped, seconds
        until the next job must be stopped when that is soon)."""
        written = stopped = 0
        wake: float | None = None
        margin = self.cost_stop_margin_s
        for job in running:
            if job.status is not S.RUNNING:
                continue
            limit = cost_limit(job, now, margin)
            if limit is not None and limit.stop_in_s <= 0:
                if not job.run.attempt.stop:
                    stopped += int(self.stop_attempt(job, limit.reason, Failure.COST_LIMIT))
                continue  # its final cost is written when the attempt ends
            if limit is not None and limit.stop_in_s < COST_WAKE_WITHIN_S:
                wake = limit.stop_in_s if wake is None else min(wake, limit.stop_in_s)
            cost = accrual_due(job, now, rates)
            if cost is None:
                continue
            run = job.run.with_attempt(cost_at=now)
            try:
                self.jobs.update(job.updated(job.updated_at, cost_usd=cost, run=run))
            except Conflict:
                continue
            written += 1
            usage = attempt_usage(job, now)
            if self.usage is not None and usage is not None:
                try:
                    self.usage.record(usage)
                except StoreUnavailable:
                    continue  # the next accrual, or the attempt's final record, writes it
        return written, stopped, wake

    @property
    def cost_stop_margin_s(self) -> float:
        """How long a stop takes to end an attempt: the directive waits for the host's next
        heartbeat (a third of ``heartbeat_s``), then the host stops it and reports."""
        return self.settings.heartbeat_s / 3 + 5.0

    def write_reasons(
        self, pending: dict[str, QueueEntry], decisions: Any, deadline: Deadline | None = None
    ) -> tuple[int, int]:
        """Store each pending job's reason (no event: the status did not change) when the rules that
        keep it waiting changed, as a write of the reason alone, in the pool, until the deadline.
        The detail (free GPU counts, waits) moves every pass; ``explain`` renders it live, so
        rewriting thousands of items per pass for it would buy nothing. Returns (written, deferred)."""
        changes: list[tuple[QueueEntry, str]] = []
        for job_id, text in decisions.reasons.items():
            entry = pending.get(job_id)
            if entry is None:
                continue
            rules = ", ".join(dict.fromkeys(str(r) for r in decisions.outcomes[job_id].rules))
            prefix = f"waiting for placement ({rules})"
            if not entry.reason.startswith(prefix + ":"):
                changes.append((entry, f"{prefix}: {text}"))
        if not changes:
            return 0, 0
        ordered = heads_first(changes)
        now, later = ordered[: self.max_reason_writes], len(ordered) - self.max_reason_writes
        tasks = [lambda e=e, reason=reason: self._set_reason(e, reason) for e, reason in now]
        results = run_bounded(tasks, self.apply_workers, deadline or Deadline(), None)
        return results.count(True), results.count(None) + max(0, later)

    def write_queue_summaries(self, decisions: Any, unread: Mapping[str, int], now: datetime) -> int:
        """Each tenant's queue as this pass saw it (positions and estimated starts from the core's
        ``Decisions.queue``), one item per tenant, written only when it says something else than
        what this process last wrote (a tenant whose queue emptied gets an empty one). Advisory: a
        store that is down leaves it for the next pass. Returns how many were written."""
        if self.queue_summaries is None:
            return 0
        rows: dict[str, list[tuple[str, int, float | None, str | None]]] = {}
        for job_id, f in decisions.queue.items():
            rows.setdefault(f.tenant, []).append((job_id, f.position, f.estimated_start, f.basis))
        tenants = set(rows) | {t for t, n in unread.items() if n > 0} | set(self._summaries_written)
        written = 0
        for tenant in sorted(tenants):
            summary = summarize(tenant, rows.get(tenant, []), unread.get(tenant, 0), now)
            if summary.same_as(self._summaries_written.get(tenant)):
                continue
            try:
                self.queue_summaries.put(summary)
            except StoreUnavailable:
                continue
            written += 1
            if summary.waiting:
                self._summaries_written[tenant] = summary
            else:
                self._summaries_written.pop(tenant, None)
        return written

    def _set_reason(self, entry: QueueEntry, reason: str) -> bool:
        """The reason alone (no new version, no event): the queue entry's copy is the only index
        write (docs/scheduling.md). Advisory: a job that moved, or a store that is down, is left to
        the next pass."""
        try:
            self.jobs.set_reason(entry, reason)
        except (Conflict, StoreUnavailable):
            return False
        return True


def _holds(job: Job, host_id: str, key: str) -> bool:
    return (
        job.status in (S.STARTING, S.RUNNING, S.CANCELING)
        and isinstance(job.placement, OnPremPlacement)
        and attempt_key(job.id, job.attempts) == key
        and any(h.host_id == host_id for h in job.placement.hosts)
    )


def utcnow() -> datetime:
    return datetime.now(UTC)
