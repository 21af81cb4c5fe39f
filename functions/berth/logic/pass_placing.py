"""Applying a scheduling pass's placements (``SchedulerService.run_pass`` builds one per pass).

The decided placements' full items are read a window at a time (``HYDRATE_WINDOW``), each just
before the window is applied, and a window not reached by the deadline is deferred unread. Within a
window, placements run in a bounded pool (``berth.logic.pass_apply.run_bounded``): each is one
transaction (``PlacementWriter.place``: the hosts' GPU holds, the job QUEUED -> STARTING and its
event), or placements on one host close in decision order are one transaction together
(``place_many``; a group that loses a race is applied again one by one), and so are single cloud
jobs' placements close in decision order (each only its job and event). GPUs are picked from the
pass's snapshot, once each across the pass (``GpuPicker``), so no placement re-reads its hosts. Each
placed job's placement token is answered after its write; a cloud array group's tokens once every
placement of its window is in. A pass that dies between a write and its answer leaves a STARTING job
whose token the next pass answers again (``SchedulerService.reanswer_placements``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from berth.domain.cloud import form_batch_groups
from berth.domain.cost import CostRates
from berth.domain.errors import Conflict, StoreUnavailable
from berth.domain.fleet import HoldRequest, attempt_key
from berth.domain.job import Job
from berth.domain.placement import BatchGroup, HostGpus
from berth.domain.ports import HostRepository, PlacementWriter, TaskTokens
from berth.domain.status import JobStatus
from berth.logic.pass_apply import (
    APPLY_WORKERS,
    HYDRATE_WINDOW,
    MAX_GROUP,
    MIN_PLACEMENTS,
    Deadline,
    GpuPicker,
    HostLocks,
    Outcome,
    group_writes,
    placed_job,
    placement_groups,
    run_bounded,
)
from berth.logic.snapshot import SnapshotSource
from berth.logic.workflow import placement_output
from berth.scheduler.decisions import Assignment, OnPremAssignment

S = JobStatus


@dataclass(frozen=True)
class PlacementApplier:
    """Writes one pass's placements and answers their tokens (see the module's docstring)."""

    source: SnapshotSource
    hosts: HostRepository
    tokens: TaskTokens
    placements: PlacementWriter
    new_token: Callable[[], str]
    #: Test hook: called after each applied placement (a crash injected here leaves a half-applied pass).
    after_apply: Callable[[Job], None] | None = None
    apply_workers: int = APPLY_WORKERS
    max_group: int = MAX_GROUP
    min_placements: int = MIN_PLACEMENTS
    hydrate_window: int = HYDRATE_WINDOW

    def place_decided(
        self,
        decided: list[Assignment],
        records: Any,
        now: datetime,
        rates: CostRates,
        deadline: Deadline,
    ) -> tuple[list[Assignment], list[Outcome], int]:
        """Read the full items of the decided placements (the queue index holds what the core
        reads) a window at a time, each just before applying it; once the deadline has passed, the
        windows not reached are deferred unread. Returns the assignments applied or deferred, their
        outcomes in order, and how many were skipped unapplied: canceled or placed since the index
        was read."""
        picker = GpuPicker(records)  # one for the pass: GPUs picked in one window stay picked
        assignments: list[Assignment] = []
        outcomes: list[Outcome] = []
        skipped = 0
        window = max(1, self.hydrate_window)
        for start in range(0, len(decided), window):
            chunk = decided[start : start + window]
            if start and deadline.passed():
                assignments.extend(chunk)
                outcomes.extend([Outcome.DEFERRED] * len(chunk))
                continue
            full = self.source.hydrate(a.job_id for a in chunk)
            placeable: list[tuple[Job, Assignment]] = []
            for assignment in chunk:
                job = full.get(assignment.job_id)
                if job is None or job.status is not S.QUEUED:
                    skipped += 1
                    continue
                placeable.append((job, assignment))
            # the pass's first window starts its minimum whatever the deadline says, later ones none
            minimum = self.min_placements if start == 0 else 0
            assignments.extend(a for _, a in placeable)
            outcomes.extend(self.apply_placements(placeable, records, now, rates, deadline, picker, minimum))
        return assignments, outcomes, skipped

    def apply_placements(
        self,
        placements: list[tuple[Job, Assignment]],
        records: Any,
        now: datetime,
        rates: CostRates,
        deadline: Deadline | None = None,
        picker: GpuPicker | None = None,
        minimum: int | None = None,
    ) -> list[Outcome]:
        """Apply placements in the pool, with GPUs picked from the snapshot's host ``records``
        (disjoint across the pass: ``picker``, shared by the pass's windows); each one's outcome, in
        order. ``minimum``: placements started whatever the deadline (default ``min_placements``)."""
        picker = picker or GpuPicker(records)
        locks = HostLocks()
        groups = form_batch_groups(
            [(j, a.record()) for j, a in placements if not isinstance(a, OnPremAssignment)]
        )
        # A group's tokens are answered once every placement of the pass is in: the first of its
        # submits reads the group's tasks, and must find each one that will ever carry the group.
        later: list[tuple[str, dict[str, Any]]] = []
        picked: list[dict[str, tuple[str, ...] | None] | None] = []
        for _job, assignment in placements:
            gpu_ids = None
            if isinstance(assignment, OnPremAssignment):
                gpu_ids = {h: picker.take(h, gpus) for h, gpus in assignment.hosts}
            picked.append(gpu_ids)

        def one(i: int) -> Outcome:
            job, assignment = placements[i]
            placed = self.apply_placement(
                job,
                assignment,
                now,
                rates,
                gpu_ids=picked[i],
                locks=locks,
                group=groups.get(job.id),
                answers=None if groups.get(job.id) is None else later,
            )
            return Outcome.PLACED if placed else Outcome.SKIPPED

        def task(members: list[int]) -> list[Outcome]:
            if len(members) == 1:
                return [one(members[0])]
            placed = self.apply_group(
                [(placements[i][0], placements[i][1], picked[i]) for i in members], now, rates, locks
            )
            if placed is None:  # the group lost a race: each placement on its own, as it would have been
                return [one(i) for i in members]
            return [Outcome.PLACED if p else Outcome.SKIPPED for p in placed]

        units = placement_groups(
            [None if g is None else tuple(g) for g in picked],
            [_array_of(job) for job, _ in placements],
            self.max_group,
        )
        tasks: list[Callable[[], list[Outcome] | None]] = [partial(task, m) for m in units]
        results = run_bounded(
            tasks,
            self.apply_workers,
            deadline or Deadline(),
            None,
            minimum=self.min_placements if minimum is None else minimum,
        )
        outcomes = [Outcome.DEFERRED] * len(placements)
        for members, result in zip(units, results, strict=True):
            for i, outcome in zip(members, result or [Outcome.DEFERRED] * len(members), strict=True):
                outcomes[i] = outcome
        self._answer(later)
        return outcomes

    def apply_group(
        self,
        members: list[tuple[Job, Assignment, dict[str, tuple[str, ...] | None] | None]],
        now: datetime,
        rates: CostRates,
        locks: HostLocks,
    ) -> list[bool] | None:
        """Place ``members`` (job, assignment, the GPUs picked for it on each host; all on one host,
        or single cloud jobs) in one transaction, then answer their tokens; whether each one was
        placed, or None when the transaction lost a race (nothing written: the caller applies them
        one by one)."""
        writes = group_writes(members, now, rates, self.new_token)
        if writes is None:
            return None
        try:
            with locks.holding(h.host_id for w in writes for h in w.holds):
                self.placements.place_many(writes)
        except (Conflict, ValueError):
            return None
        except StoreUnavailable:
            return [False] * len(writes)  # the write may have happened: the next pass sees which
        for w in writes:
            if self.after_apply is not None:
                self.after_apply(w.job)
        for (job, _, _), w in zip(members, writes, strict=True):
            token = job.run.placement_token
            if token:
                with suppress(StoreUnavailable):  # a later pass answers it (reanswer_placements)
                    self.tokens.succeed(token, placement_output(w.job))
        return [True] * len(writes)

    def _answer(self, answers: list[tuple[str, dict[str, Any]]]) -> None:
        def answer(token: str, output: dict[str, Any]) -> bool:
            with suppress(StoreUnavailable):  # a later pass answers it (reanswer_placements)
                return self.tokens.succeed(token, output)
            return False

        calls = [lambda t=t, o=o: answer(t, o) for t, o in answers]
        run_bounded(calls, self.apply_workers, Deadline(), False, minimum=len(calls))

    def apply_placement(
        self,
        job: Job,
        assignment: Assignment,
        now: datetime,
        rates: CostRates | None = None,
        gpu_ids: dict[str, tuple[str, ...] | None] | None = None,
        locks: HostLocks | None = None,
        group: BatchGroup | None = None,
        answers: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> bool:
        """Place ``job`` as ``assignment`` says, in one transaction, and answer its placement token;
        False when the transaction lost a race (decided again next pass). ``gpu_ids``: the UUIDs to
        hold on each host (a pass picks them from its snapshot); None: read the hosts for them.
        ``answers``: where to leave the token's answer for the caller to send, instead of now."""
        rates = rates or CostRates()
        attempt = job.attempts + 1
        key = attempt_key(job.id, attempt)
        held: list[HostGpus] = []
        holds: list[HoldRequest] = []
        if isinstance(assignment, OnPremAssignment):
            for host_id, gpus in assignment.hosts:
                if gpu_ids is not None:
                    picked = gpu_ids.get(host_id)
                else:
                    rec = self.hosts.get(host_id)
                    picked = None if rec is None else rec.pick_free(gpus)
                if picked is None or len(picked) != gpus:
                    return False
                held.append(HostGpus(host_id=host_id, gpus=gpus, gpu_ids=picked))
                holds.append(HoldRequest(host_id, picked, assignment.cpu, assignment.memory_gib, now))
        nxt, event = placed_job(job, assignment, now, tuple(held), rates, self.new_token(), group)
        try:
            with locks.holding(h.host_id for h in held) if locks is not None else _nothing():
                self.placements.place(nxt, event, key, holds)
        except (Conflict, StoreUnavailable, ValueError):
            return False  # a StoreUnavailable write may have happened: the next pass sees which
        if self.after_apply is not None:
            self.after_apply(nxt)
        token = job.run.placement_token
        if token and answers is not None:
            answers.append((token, placement_output(nxt)))
        elif token:
            # Placed all the same when the answer fails: a later pass answers it (reanswer_placements).
            with suppress(StoreUnavailable):
                self.tokens.succeed(token, placement_output(nxt))
        return True


def _array_of(job: Job) -> str | None:
    task = job.spec.array_task
    return None if task is None else task.array_id


@contextmanager
def _nothing() -> Iterator[None]:
    yield
