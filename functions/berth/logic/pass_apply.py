"""How a scheduling pass applies its decisions: concurrently, from the snapshot, before a deadline.

- **GPUs from the snapshot.** The core's placements of one pass never ask a host for more GPUs than
  the snapshot says are free there (it counts them down as it places). ``GpuPicker`` hands out the
  snapshot's free UUIDs in decision order, so the placements of one pass name disjoint GPUs and no
  placement re-reads its host: the transaction's condition (every named UUID still free) is what
  catches a change since the snapshot.
- **A bounded pool.** ``run_bounded`` runs the placements (and the reason writes) on ``workers``
  threads, each task in a copy of the caller's context (Powertools' logger and tracer keep their state
  in context variables). Placements that share a host take that host's lock (``HostLocks``, in sorted
  order) around their transaction, so they follow one another instead of cancelling each other with
  ``TransactionConflict``.
- **Placements on one host written together.** Placements of the pass on the same single host, close
  in decision order (within ``GROUP_WINDOW`` placements) and at most ``MAX_GROUP`` of them, one task
  per job array, are one transaction (``PlacementWriter.place_many``: the host updated once with every
  hold, each job and event): all or nothing, as one placement is. The core packs jobs onto hosts, so
  a host often gets several jobs in a row; one at a time they waited on the host's lock, one round
  trip each. A group that loses a race is applied again placement by placement, so only the
  placements whose condition failed are skipped. Gangs across hosts, cloud placements and array
  tasks of an array already in the group are written alone.
- **A deadline.** ``Deadline`` says when to stop starting work: ``time_left()`` (the Lambda context's
  remaining time) below ``reserve_s``. Work not started is left for the next pass, which decides it
  again from the store; work started finishes. A pass always starts its first ``MIN_PLACEMENTS``
  placements, so a pass whose load ate its time still places something (were it killed while at
  it, the store stays consistent: see the scheduler service).
- **Reads as it goes.** The jobs' full items are read a window (``HYDRATE_WINDOW``) at a time, just
  before the window is applied; once the deadline has passed, the windows not reached are deferred
  unread.
- **A crash** (the first exception a task raises) stops the pool from starting more and is raised to
  the caller once the tasks in flight have ended, as a pass that dies would leave it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from itertools import zip_longest
from typing import Any, TypeVar

from berth.domain.cost import CostRates, onprem_hourly_usd
from berth.domain.fleet import HoldRequest, HostRecord, attempt_key
from berth.domain.job import Job, JobEvent
from berth.domain.placement import BatchGroup, HostGpus
from berth.domain.ports import PlacementWrite
from berth.domain.queue import QueueEntry
from berth.domain.status import JobStatus
from berth.domain.workflow import AttemptState
from berth.scheduler.decisions import Assignment, OnPremAssignment

T = TypeVar("T")

#: Threads applying one pass's placements (and writing its reasons) at once.
APPLY_WORKERS = 16
#: Placements a pass starts whatever its deadline says (one round of the pool): tasks of the pool, a
#: group of placements on one host counting as one.
MIN_PLACEMENTS = APPLY_WORKERS
#: Placements on one host written in one transaction at most (an 8-GPU host holds at most 8 jobs).
MAX_GROUP = 8
#: A pass reads the full items of its decided placements this many at a time (10 BatchGetItems),
#: each window just before applying it, so that a pass stopped by its deadline has read only what it
#: applied (at 100,000 queued, 14,677 were decided and 47 applied).
HYDRATE_WINDOW = 1000
#: The key ``placement_groups`` groups single cloud jobs' placements under (no host is named "").
CLOUD_GROUP = ""
#: How far apart in decision order placements on one host may be and still be written together (a
#: group's members start when its first one does; this keeps the apply order near the decision order).
GROUP_WINDOW = 256
#: Reasons a pass writes at most (advisory: ``explain`` renders the live one). A first pass over a
#: deep fresh queue would otherwise spend most of its calls on them (7,000 UpdateItems beside 3,000
#: placements at 10,000 queued); the heads of every tenant's queue get theirs first, round-robin,
#: and the rest come in the next passes, since an unchanged reason is never rewritten.
MAX_REASON_WRITES = 500
#: Stop starting placements when less than this is left of the invocation (the Lambda timeout is
#: 60 s): what has started finishes, the reasons and cost writes after it get their time.
DEADLINE_RESERVE_S = 20.0


class Outcome(Enum):
    PLACED = "placed"
    SKIPPED = "skipped"
    """Lost to a race or a store failure: decided again next pass."""
    DEFERRED = "deferred"
    """Not started: the deadline had passed (or the pass was dying)."""


@dataclass(frozen=True)
class Deadline:
    """When a pass stops starting work: ``time_left()`` seconds remain, fewer than ``reserve_s``."""

    time_left: Callable[[], float] | None = None
    reserve_s: float = DEADLINE_RESERVE_S

    def passed(self) -> bool:
        return self.time_left is not None and self.time_left() < self.reserve_s


class GpuPicker:
    """The snapshot's free GPU UUIDs per host, handed out once each, in the order asked."""

    def __init__(self, records: Iterable[HostRecord]) -> None:
        self._free = {r.host_id: list(r.free_gpu_ids) for r in records}

    def take(self, host_id: str, gpus: int) -> tuple[str, ...] | None:
        """The host's next ``gpus`` free UUIDs (None, and nothing taken, if fewer are left)."""
        free = self._free.get(host_id, [])
        if gpus < 1 or len(free) < gpus:
            return None
        picked, self._free[host_id] = tuple(free[:gpus]), free[gpus:]
        return picked


class HostLocks:
    """One lock per host: a pass's placements on one host write one after the other."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def holding(self, host_ids: Iterable[str]) -> Iterator[None]:
        with self._guard:
            locks = [self._locks.setdefault(h, threading.Lock()) for h in sorted(set(host_ids))]
        for lock in locks:
            lock.acquire()
        try:
            yield
        finally:
            for lock in reversed(locks):
                lock.release()


def run_bounded(
    tasks: Sequence[Callable[[], T]], workers: int, deadline: Deadline, deferred: T, minimum: int = 0
) -> list[T]:
    """Run ``tasks`` on at most ``workers`` threads; a task not started before the deadline (or once a
    task has raised) gives ``deferred``, except the first ``minimum``, which start whatever the
    deadline says (so that a pass whose load ate its time still makes progress). Results in task
    order; the first exception is re-raised after the tasks in flight end."""
    stop = threading.Event()

    def guarded(index: int, task: Callable[[], T]) -> T:
        if stop.is_set() or (index >= minimum and deadline.passed()):
            return deferred
        try:
            return task()
        except BaseException:
            stop.set()
            raise

    if workers <= 1 or len(tasks) <= 1:
        return [guarded(i, t) for i, t in enumerate(tasks)]
    with ThreadPoolExecutor(max_workers=min(workers, len(tasks)), thread_name_prefix="berth-apply") as pool:
        futures = [pool.submit(contextvars.copy_context().run, guarded, i, t) for i, t in enumerate(tasks)]
        results: list[T] = []
        failure: BaseException | None = None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:  # the pass died: the rest of the pool stops starting work
                failure = failure or exc
                results.append(deferred)
    if failure is not None:
        raise failure
    return results


def placed_job(
    job: Job,
    assignment: Assignment,
    now: datetime,
    held: tuple[HostGpus, ...],
    rates: CostRates,
    fencing_token: str,
    group: BatchGroup | None = None,
) -> tuple[Job, JobEvent]:
    """The job as ``assignment`` places it (STARTING, attempt n+1, holding ``held``, with a new
    fencing token; a cloud attempt in ``group``, if the pass formed one) and its event."""
    if isinstance(assignment, OnPremAssignment):
        gpus = sum(h.gpus for h in held)
        placement: Any = assignment.record().model_copy(
            update={"hosts": held, "hourly_usd": onprem_hourly_usd(rates, gpus)}
        )
        where = f"on-prem pool {assignment.pool}: " + ", ".join(f"{h.host_id} ({h.gpus})" for h in held)
    else:
        placement = assignment.record().model_copy(update={"group": group})
        where = f"cloud {assignment.region} {assignment.instance_type}{' spot' if assignment.spot else ''}"
        if group is not None:
            where += f" (Batch array of tasks {group.first}-{group.first + group.size - 1})"
    attempt = job.attempts + 1
    run = job.run.model_copy(update={"attempt": AttemptState(fencing_token=fencing_token)})  # a fresh part
    return job.transition(
        JobStatus.STARTING,
        f"placed {where} (attempt {attempt})",
        now,
        site=placement.site,
        placement=placement,
        attempts=attempt,
        run=run,
    )


def group_writes(
    members: Sequence[tuple[Job, Assignment, dict[str, tuple[str, ...] | None] | None]],
    now: datetime,
    rates: CostRates,
    new_token: Callable[[], str],
) -> list[PlacementWrite] | None:
    """The writes placing ``members`` (job, assignment, the GPUs picked for it on each host)
    together; None when an on-prem one did not get its GPUs from the snapshot. A cloud member holds
    nothing (its write is the job and its event)."""
    writes: list[PlacementWrite] = []
    for job, assignment, gpu_ids in members:
        if not isinstance(assignment, OnPremAssignment):
            nxt, event = placed_job(job, assignment, now, (), rates, new_token())
            writes.append(PlacementWrite(nxt, event, attempt_key(job.id, job.attempts + 1), []))
            continue
        held: list[HostGpus] = []
        holds: list[HoldRequest] = []
        for host_id, gpus in assignment.hosts:
            ids = None if gpu_ids is None else gpu_ids.get(host_id)
            if ids is None or len(ids) != gpus:
                return None
            held.append(HostGpus(host_id=host_id, gpus=gpus, gpu_ids=ids))
            holds.append(HoldRequest(host_id, ids, assignment.cpu, assignment.memory_gib, now))
        nxt, event = placed_job(job, assignment, now, tuple(held), rates, new_token())
        writes.append(PlacementWrite(nxt, event, attempt_key(job.id, job.attempts + 1), holds))
    return writes


def heads_first(changes: list[tuple[QueueEntry, str]]) -> list[tuple[QueueEntry, str]]:
    """Each tenant's changes in queue order, interleaved: every tenant's first, then every second..."""
    by_tenant: dict[str, list[tuple[QueueEntry, str]]] = {}
    for change in sorted(changes, key=lambda c: c[0].sort_key):
        by_tenant.setdefault(change[0].tenant, []).append(change)
    rounds = zip_longest(*(by_tenant[t] for t in sorted(by_tenant)))
    return [c for round_ in rounds for c in round_ if c is not None]


def placement_groups(
    hosts: Sequence[tuple[str, ...] | None],
    arrays: Sequence[str | None],
    max_group: int = MAX_GROUP,
    window: int = GROUP_WINDOW,
) -> list[list[int]]:
    """The pass's placements (``hosts[i]``: the on-prem hosts placement ``i`` holds GPUs on, None for a
    cloud one; ``arrays[i]``: its job array, if any) as groups of indices written together, in the
    order of their first member: those on one single host, within ``window`` of the group's first,
    at most ``max_group``, one task per array; and cloud placements of single jobs (no array task:
    those may form Batch array groups, whose tokens wait for the pass), alike within ``window`` and
    ``max_group``: each is only its job and event, so several make one transaction rather than one
    each. Every other placement is a group of its own."""
    groups: list[list[int]] = []
    open_by_host: dict[str, int] = {}
    arrays_of: dict[int, set[str]] = {}
    for i, on in enumerate(hosts):
        where = (CLOUD_GROUP,) if on is None and arrays[i] is None else on
        if max_group > 1 and where is not None and len(where) == 1:
            g = open_by_host.get(where[0])
            if g is not None:
                members = groups[g]
                array = arrays[i]
                if (
                    len(members) < max_group
                    and i - members[0] < window
                    and (array is None or array not in arrays_of[g])
                ):
                    members.append(i)
                    if array is not None:
                        arrays_of[g].add(array)
                    continue
            open_by_host[where[0]] = len(groups)
            first = arrays[i]
            arrays_of[len(groups)] = set() if first is None else {first}
        groups.append([i])
    return groups
