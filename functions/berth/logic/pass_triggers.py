"""Which job state changes ask the scheduler for a pass (issue 18). Pure.

The job-events stream's consumer (the notifier) sees every state change, in batches; it asks for ONE
pass per batch whose changes can let the scheduler place something, instead of the workflow's tasks
asking for one per job (``await_placement``, ``classify_failure``, ``finalize``: about two SQS
SendMessage calls per job). A change can let a pass place something when:

- a job enters QUEUED: submitted, or requeued after a retry's backoff (an array task's creation
  excepted: the expander that created it asks for one pass per invocation that created tasks);
- a job leaves a state that holds capacity (STARTING, RUNNING, CANCELING: GPU holds on-prem, an
  instance or a slot of one in the cloud) for a terminal status or for RETRYING (its attempt ended,
  its holds released).

Nothing else frees capacity or adds work: a placement (QUEUED -> STARTING), a start, a cancel asked
of a placed job (its capacity is held until the attempt ends; a canceled cloud job's pass is asked by
``WorkflowHooks.canceled``), a job ending while it held nothing (canceled while queued or retrying).
The scheduler's timer is the backstop of a request that is lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from berth.domain.arrays import parse_task_id
from berth.domain.job import JobEvent
from berth.domain.status import JobStatus

S = JobStatus

#: The states whose jobs hold capacity (on-prem GPU holds, a cloud instance or a slot of one).
HOLDING: frozenset[JobStatus] = frozenset({S.STARTING, S.RUNNING, S.CANCELING})

#: The kinds of change that ask for a pass, in the order a request's reason names them.
KINDS = ("submitted", "requeued", "attempts ended", "jobs ended")


def pass_kind(event: JobEvent) -> str | None:
    """Why ``event`` may let a pass place a job (one of ``KINDS``), or None when it cannot."""
    if event.to is S.QUEUED:
        if event.from_ is None:
            # an array task's creation: the expander asks for the pass (logic/arrays.py)
            return None if parse_task_id(event.job_id) is not None else "submitted"
        return "requeued"
    if event.from_ in HOLDING:
        if event.to is S.RETRYING:
            return "attempts ended"
        if event.to.is_terminal:
            return "jobs ended"
    return None


def pass_reason(events: Iterable[JobEvent]) -> str | None:
    """The reason of the one pass a batch of changes asks for (its counts by kind), or None when
    none of them can let a pass place anything."""
    counts = Counter(kind for kind in map(pass_kind, events) if kind is not None)
    if not counts:
        return None
    return "job events: " + ", ".join(f"{counts[k]} {k}" for k in KINDS if counts[k])


__all__ = ["HOLDING", "KINDS", "pass_kind", "pass_reason"]
