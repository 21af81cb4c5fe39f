"""The job status machine: an explicit transition table. Pure."""

from __future__ import annotations

from enum import StrEnum

from berth.domain.errors import IllegalTransition


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_active(self) -> bool:
        return not self.is_terminal


S = JobStatus

TERMINAL: frozenset[JobStatus] = frozenset({S.COMPLETED, S.FAILED, S.CANCELED})

#: Every legal move. Anything not listed here is refused.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    # Waiting for placement. Cancel before placement needs nobody's confirmation.
    S.QUEUED: frozenset({S.STARTING, S.FAILED, S.CANCELED}),
    # Placed, being dispatched/provisioned/staged.
    S.STARTING: frozenset({S.RUNNING, S.RETRYING, S.FAILED, S.CANCELING}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.RETRYING, S.CANCELING}),
    # Transient failure: backing off, then re-placed (back to QUEUED) or given up.
    S.RETRYING: frozenset({S.QUEUED, S.FAILED, S.CANCELED}),
    # Cancel asked of a placed job; the executor confirms. It may still finish first.
    S.CANCELING: frozenset({S.CANCELED, S.COMPLETED, S.FAILED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
}


def can_transition(src: JobStatus, dst: JobStatus) -> bool:
    return dst in TRANSITIONS[src]


def check_transition(src: JobStatus, dst: JobStatus) -> None:
    """Raise :class:`IllegalTransition` unless ``src -> dst`` is in the table."""
    if not can_transition(src, dst):
        allowed = ", ".join(sorted(TRANSITIONS[src])) or "none (terminal)"
        raise IllegalTransition(
            f"a {src} job cannot become {dst}; allowed from {src}: {allowed}",
            details={"from": str(src), "to": str(dst)},
        )


def cancel_target(src: JobStatus) -> JobStatus:
    """Where a cancel request takes a job in ``src``: straight to CANCELED when nothing runs yet."""
    if src in (S.QUEUED, S.RETRYING):
        return S.CANCELED
    if src in (S.STARTING, S.RUNNING):
        return S.CANCELING
    raise IllegalTransition(
        f"a {src} job cannot be canceled", details={"from": str(src), "to": str(S.CANCELED)}
    )
