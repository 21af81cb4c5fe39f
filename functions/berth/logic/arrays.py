"""Job arrays: submit, read, list tasks, bulk cancel, and the expander that turns a stored array into
its tasks in the background. Pure logic over ports (docs/workflow.md, "Job arrays").

``submit`` stores one parent item (and its parameters in chunks) in one transaction that also counts
all ``N`` tasks against ``max_active_jobs``: the API answers at once, whatever N. The expander
(``ArrayExpander.run``, called by the scheduler's Lambda before each pass) creates the tasks in
chunks: it writes the chunk's missing tasks (BatchWriteItem), starts their workflow executions
(named after the task, so a repeated start is refused harmlessly), then advances the parent's cursor
with a write conditional on the cursor it read. A crash anywhere repeats at most one chunk, whose
existing tasks are found and not written again: no task is lost or created twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from berth.domain.arrays import (
    JobArray,
    array_parent_spec,
    counter_shard,
    counts_from_deltas,
    task_id,
    task_spec,
)
from berth.domain.errors import (
    AlreadySubmitted,
    Conflict,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    StoreUnavailable,
    ValidationFailed,
)
from berth.domain.idempotency import submit_claim
from berth.domain.job import Job, JobEvent, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.ports import Executions, PassTrigger, TenantRepository
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller, Quota, Role

Clock = Callable[[], datetime]
#: Tasks created per chunk (4 BatchWriteItem calls of tasks, 4 of events, 1 BatchGetItem).
CHUNK = 100
MAX_TASK_PAGE = 100


class ArrayRepository(Protocol):
    def create(
        self, array: JobArray, params: list[dict[str, Any]] | None, max_active: int, claim: Any = None
    ) -> None: ...
    def get(self, array_id: str) -> JobArray | None: ...
    def get_many(self, array_ids: list[str], consistent: bool = False) -> list[JobArray]: ...
    def pending(self) -> list[str]: ...
    def params(self, array: JobArray, start: int, stop: int) -> list[dict[str, Any]] | None: ...
    def existing(self, ids: list[str]) -> dict[str, tuple[str, int]]: ...
    def put_tasks(self, tasks: list[tuple[Job, JobEvent]], rows: Any) -> None: ...
    def advance(
        self, array: JobArray, expanded: int, canceled_at_creation: dict[int, int], now: datetime
    ) -> None: ...
    def request_cancel(self, array: JobArray, reason: str, now: datetime) -> None: ...
    def advance_cancel(self, array: JobArray, upto: int) -> None: ...
    def finish(self, array_id: str) -> None: ...
    def tasks(self, array_id: str, start: int, stop: int, job_of: Any) -> list[Job]: ...


@dataclass(frozen=True)
class ArrayService:
    arrays: ArrayRepository
    tenants: TenantRepository
    clock: Clock
    #: The job service: its feasibility and access checks apply to the task spec; it cancels tasks.
    jobs: Any
    trigger: PassTrigger | None = None
    idempotency_ttl: timedelta = timedelta(hours=24)

    def submit(self, caller: Caller, spec: JobSpec, idempotency_key: str | None = None) -> JobArray:
        """Store the array whole (or nothing): every task counts against ``max_active_jobs`` now."""
        assert spec.array is not None
        size = spec.array.count
        record = self.tenants.record(caller.tenant)  # one read: quota, access and feasibility
        quota = record.quota or Quota()
        if size > quota.max_active_jobs:
            raise ValidationFailed(
                f"an array of {size} tasks can never fit tenant {caller.tenant!r}'s max_active_jobs "
                f"({quota.max_active_jobs}); split it or ask an admin for a larger quota",
                details={"size": size, "max_active_jobs": quota.max_active_jobs},
            )
        first = spec.array.parameters[0] if spec.array.parameters else None
        sample = task_spec(spec, "j-" + "0" * 26, 0, size, first)
        if self.jobs.access is not None:
            self.jobs.access(sample, caller.tenant, record)
        if self.jobs.feasibility is not None:
            self.jobs.feasibility(sample, caller.tenant, record)
        now = self.clock()
        array = JobArray(
            id=new_job_id(now),
            tenant=caller.tenant,
            owner=caller.principal,
            actor=caller.actor or None,
            spec=array_parent_spec(spec),
            size=size,
            created_at=now,
            updated_at=now,
            counts=counts_from_deltas(size, {}),
        )
        claim = (
            None
            if idempotency_key is None
            else submit_claim(caller.tenant, idempotency_key, spec, now + self.idempotency_ttl)
        )
        try:
            self.arrays.create(array, spec.array.parameters, quota.max_active_jobs, claim)
        except AlreadySubmitted as exc:
            if claim is None or exc.fingerprint != claim.fingerprint:
                raise IdempotencyMismatch(
                    "this Idempotency-Key was already used with a different job spec; use a new key"
                ) from exc
            return self.get(caller, exc.job_id)
        except QuotaExceeded as exc:
            active = self.jobs.jobs.count_active(caller.tenant)
            raise QuotaExceeded(
                f"tenant {caller.tenant!r} has {active} active jobs; {size} more tasks would pass its "
                f"max_active_jobs ({quota.max_active_jobs}); wait for some to finish or cancel them",
                details={"max_active_jobs": quota.max_active_jobs, "active": active, "size": size},
            ) from exc
        self._poke(f"array {array.id} submitted")
        return array

    def _poke(self, reason: str) -> None:
        if self.trigger is None:
            return
        try:
            self.trigger.request(reason)
        except StoreUnavailable:
            return  # the timer's pass runs the expander anyway

    def find(self, caller: Caller, array_id: str) -> JobArray | None:
        array = self.arrays.get(array_id)
        if array is None or (array.tenant != caller.tenant and not caller.is_admin):
            return None
        return array

    def get(self, caller: Caller, array_id: str) -> JobArray:
        array = self.find(caller, array_id)
        if array is None:
            raise NotFound(f"job {array_id!r} not found")
        return array

    def tasks(
        self, caller: Caller, array_id: str, limit: int, next_token: str | None
    ) -> tuple[list[Job], str | None]:
        """The array's created tasks in index order; ``next_token`` is the next index."""
        array = self.get(caller, array_id)
        try:
            start = 0 if next_token is None else int(next_token)
        except ValueError:
            start = -1
        if not 0 <= start <= array.size:
            raise InvalidRequest("next_token is not valid for this array; start again without it")
        stop = min(array.size, start + min(limit, MAX_TASK_PAGE))
        jobs = self.arrays.tasks(array_id, start, stop, self.jobs.jobs.job_of)
        return jobs, (str(stop) if stop < array.size else None)

    def cancel(self, caller: Caller, array_id: str) -> JobArray:
        """Cancel every task not yet ended, created or not: recorded on the parent at once (202);
        the expander cancels created tasks and creates the rest CANCELED. Safe to repeat."""
        array = self.get(caller, array_id)
        if not array.cancel_requested:
            with contextlib.suppress(Conflict):  # another cancel got there first
                self.arrays.request_cancel(array, f"canceled by {caller.name}", self.clock())
            self._poke(f"array {array_id} canceled")
            array = self.get(caller, array_id)
        return array


#: The caller the expander cancels tasks as (an operator: it may reach every tenant's tasks).
SYSTEM = Caller(principal="berth:array-expander", tenant="berth", role=Role.ADMIN, actor="berth")


@dataclass
class ArrayExpander:
    arrays: ArrayRepository
    jobs: Any  # JobService: its repository writes rows, its cancel cancels tasks
    executions: Executions | None
    clock: Clock
    workflow_input: Callable[[str], dict[str, Any]]
    budget_s: float = 15.0
    workers: int = 8
    monotonic: Callable[[], float] = time.monotonic
    stats: dict[str, int] = field(default_factory=dict)
    last_error: str = ""

    def run(self) -> bool:
        """Work on every array with work left until the budget is spent; True when work remains."""
        self.stats.clear()
        deadline = self.monotonic() + self.budget_s
        for array_id in self.arrays.pending():
            while True:
                if self.monotonic() >= deadline:
                    return True
                try:
                    more = self.step(array_id)
                except Conflict:
                    continue  # the parent moved under us (a cancel): re-read it
                if not more:
                    break
        return False

    def step(self, array_id: str) -> bool:
        """One chunk of work on one array; False when it has none left (and it is off the list)."""
        array = self.arrays.get(array_id)
        if array is None or array.done:
            self.arrays.finish(array_id)
            return False
        if array.expanded < array.size:
            self._expand(array)
        else:
            self._cancel(array)
        return True

    def _expand(self, array: JobArray) -> None:
        start, stop = array.expanded, min(array.size, array.expanded + CHUNK)
        params = self.arrays.params(array, start, stop)
        now = self.clock()
        ids = [task_id(array.id, i) for i in range(start, stop)]
        have = self.arrays.existing(ids)
        canceled: dict[int, int] = {}
        new: list[tuple[Job, JobEvent]] = []
        for i, tid in zip(range(start, stop), ids, strict=True):
            if tid in have:
                # Written by a run that crashed before advancing: counted now only if it was created
                # CANCELED (version 1); a task canceled later moved its own counts when it did.
                if have[tid] == (str(JobStatus.CANCELED), 1):
                    canceled[counter_shard(i)] = canceled.get(counter_shard(i), 0) + 1
                continue
            if array.cancel_requested:
                canceled[counter_shard(i)] = canceled.get(counter_shard(i), 0) + 1
            spec = task_spec(
                array.spec, array.id, i, array.size, None if params is None else params[i - start]
            )
            job, event = new_job(tid, array.tenant, array.owner, spec, now, array.actor)
            if array.cancel_requested:
                reason = f"{array.cancel_reason} (before the task was created)"
                job = job.model_copy(update={"status": JobStatus.CANCELED, "reason": reason})
                event = event.model_copy(update={"to": JobStatus.CANCELED, "reason": reason})
            new.append((job, event))
        if new:
            self.arrays.put_tasks(new, self.jobs.jobs)
        if not array.cancel_requested and self.executions is not None:
            self._start(ids)
        self.arrays.advance(array, stop, canceled, now)
        self.stats["tasks_created"] = self.stats.get("tasks_created", 0) + len(new)

    def _start(self, ids: list[str]) -> None:
        executions = self.executions
        assert executions is not None

        def start(tid: str) -> None:
            try:
                executions.start(tid, self.workflow_input(tid))
            except StoreUnavailable as exc:
                # The task is stored QUEUED; the pass's repair_executions starts it later.
                self.stats["starts_failed"] = self.stats.get("starts_failed", 0) + 1
                self.last_error = str(exc)

        # The first start builds the client (botocore's client creation is not thread-safe).
        start(ids[0])
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(start, ids[1:]))

    def _cancel(self, array: JobArray) -> None:
        start, stop = array.canceled_upto, min(array.size, array.canceled_upto + CHUNK)
        for job in self.arrays.tasks(array.id, start, stop, self.jobs.jobs.job_of):
            if not job.status.is_terminal and job.status is not JobStatus.CANCELING:
                # Conflict (it kept changing) propagates: run() re-reads and repeats this chunk.
                self.jobs.cancel(SYSTEM, job.id, reason=array.cancel_reason)
                self.stats["tasks_canceled"] = self.stats.get("tasks_canceled", 0) + 1
        self.arrays.advance_cancel(array, stop)
