"""One way to change a stored job: read it, decide, write it only if it is still that version.

Every writer of a job (the job API's cancel, the workflow's task states, the agent API, the cloud
branch) goes through ``update_job``: it reads the job (or starts from the version the caller already
holds), asks ``change`` what to do with it, and writes the answer conditionally on the version read.
A lost race (``Conflict``) re-reads and asks again; after ``TRIES`` lost races it gives up with
``JobKeptChanging``. ``change`` answers with one of:

- ``Save(job, event)``: a status change, stored with its event in one transaction
  (``JobRepository.save``; ``Job.transition`` or ``Job.noted`` build both; ``usage``: an ended
  attempt's usage record, in the same transaction);
- ``Update(job)``: the same status, new run state or cost, no event (``JobRepository.update``);
- ``Keep(outcome)``: nothing to write (already done, or the change does not apply to this version).

Each carries an ``outcome`` the caller gets back with the result, so what happens after the write
(answer a task token, send work, release GPUs) is decided once, from the version the write was
based on. ``change`` may raise a domain error (``Fenced``, ``NotFound``): it propagates unchanged,
nothing is written. ``change`` must not write the store itself; a side effect it must make before the
job's write (an idempotent usage record) is repeated on each try.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic

from typing_extensions import TypeVar

from berth.domain.cost import AttemptUsage
from berth.domain.errors import Conflict, NotFound
from berth.domain.fleet import HoldRelease
from berth.domain.job import Job, JobEvent
from berth.domain.ports import JobRepository

#: How many conditional writes one update tries before it gives up (each after a fresh read).
TRIES = 8

#: What ``change`` tells its caller (None when it has nothing to tell).
T = TypeVar("T", default=None)


class JobKeptChanging(Conflict):
    """Every try lost its race: other writers kept moving the job (409 through the API)."""


class JobMissing(NotFound):
    """The job is not stored (``update_job`` read nothing)."""


@dataclass(frozen=True, slots=True)
class Save(Generic[T]):
    """Store ``job`` (the read version + 1) and its ``event`` in one transaction."""

    job: Job
    event: JobEvent
    outcome: T = None  # type: ignore[assignment]  # T defaults to None (PEP 696)
    usage: AttemptUsage | None = None
    """The ended attempt's usage record, stored in the same write (``JobRepository.save``)."""
    releases: tuple[HoldRelease, ...] = ()
    """The ended attempt's GPU holds, given back in the same write (``JobRepository.save``)."""


@dataclass(frozen=True, slots=True)
class Update(Generic[T]):
    """Store ``job`` (the read version + 1) without an event: no status change."""

    job: Job
    outcome: T = None  # type: ignore[assignment]  # T defaults to None (PEP 696)


@dataclass(frozen=True, slots=True)
class Keep(Generic[T]):
    """Write nothing; ``outcome`` says why."""

    outcome: T = None  # type: ignore[assignment]  # T defaults to None (PEP 696)


Decision = Save[T] | Update[T] | Keep[T]
Change = Callable[[Job], Decision[T]]


@dataclass(frozen=True, slots=True)
class JobUpdate(Generic[T]):
    """What ``update_job`` did: ``before`` is the version ``change`` decided on, ``after`` the job as
    stored now (``before`` itself when nothing was written), ``event`` the event written with it."""

    before: Job
    after: Job
    written: bool
    event: JobEvent | None
    outcome: T


def update_job(
    jobs: JobRepository,
    job_id: str,
    change: Change[T],
    *,
    doing: str,
    current: Job | None = None,
) -> JobUpdate[T]:
    """Apply ``change`` to job ``job_id`` with a conditional write, re-reading after each lost race.

    ``current``: the version the caller already read (saves the first read; a stale one only costs a
    lost race). ``doing`` names the work in ``JobKeptChanging``'s message. Raises ``JobMissing`` when
    the job is not stored, ``JobKeptChanging`` after ``TRIES`` lost races, and whatever ``change``
    raises."""
    job = current
    for _ in range(TRIES):
        if job is None:
            job = jobs.get(job_id)
            if job is None:
                raise JobMissing(f"job {job_id!r} not found")
        decision = change(job)
        if isinstance(decision, Keep):
            return JobUpdate(job, job, False, None, decision.outcome)
        event = decision.event if isinstance(decision, Save) else None
        try:
            if isinstance(decision, Save):
                jobs.save(decision.job, decision.event, decision.usage, decision.releases)
            else:
                jobs.update(decision.job)
        except Conflict:
            job = None  # another writer moved it: decide again on the fresh version
            continue
        return JobUpdate(job, decision.job, True, event, decision.outcome)
    raise JobKeptChanging(f"job {job_id!r} kept changing while {doing}; try again")


__all__ = [
    "TRIES",
    "Change",
    "Decision",
    "JobKeptChanging",
    "JobMissing",
    "JobUpdate",
    "Keep",
    "Save",
    "Update",
    "update_job",
]
