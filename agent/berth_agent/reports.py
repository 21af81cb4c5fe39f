"""An attempt's reports: ``started`` and what its answer means for the process, and the end.

Whatever the control plane answers, the process has started and stays supervised until it has
ended (its GPUs are freed only then). The answer decides only whether it may go on:

- 200: ``SENT``, it runs on;
- ``Fenced`` (409) or 404 (no such attempt on this host): ``NOT_OURS``, it is killed now and
  nothing more is reported (the control plane has moved on);
- ``Canceled`` (409): ``CANCELED``, it is stopped with the cancel grace and reported canceled;
- anything else (5xx or no answer after the client's retries, another 4xx, an exception):
  ``PENDING``, it runs on and the report is sent again every ``retry_s`` while it runs.

``report_end`` sends the final report (succeeded, failed, canceled); the run has ended by then, so
a failure is only logged (the control plane reconciles through the heartbeats' ``attempts``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

from berth_agent.client import AgentApiError, Canceled, Fenced
from berth_agent.executors.base import FailureKind, JobResult

log = logging.getLogger(__name__)


class ReportApi(Protocol):
    def report(
        self,
        job_id: str,
        attempt: int,
        fencing_token: str,
        event: str,
        *,
        exit_code: int | None = None,
        failure: str | None = None,
        message: str = "",
        checkpoint: dict[str, Any] | None = None,
    ) -> Any: ...


class Answer(StrEnum):
    SENT = "sent"
    PENDING = "pending"
    NOT_OURS = "not_ours"
    CANCELED = "canceled"


class StartedReport:
    def __init__(
        self,
        send: Callable[[], object],
        *,
        retry_s: float = 5.0,
        what: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send, self.retry_s, self._what, self._clock = send, retry_s, what, clock
        self.answer: Answer | None = None
        self._next = clock()

    @property
    def settled(self) -> bool:
        """Sent, or answered with something final (no more tries)."""
        return self.answer not in (None, Answer.PENDING)

    def send(self) -> Answer:
        self._next = self._clock() + self.retry_s
        try:
            self._send()
        except Fenced:
            self.answer = Answer.NOT_OURS
        except Canceled:
            self.answer = Answer.CANCELED
        except AgentApiError as exc:
            self.answer = Answer.NOT_OURS if exc.status == 404 else self._pending(exc)
        except Exception as exc:  # a bug or an unexpected error must not orphan the job
            self.answer = self._pending(exc)
        else:
            self.answer = Answer.SENT
        return self.answer

    def _pending(self, exc: Exception) -> Answer:
        log.warning("started report failed; job runs on", extra={"attempt": self._what, "error": f"{exc}"})
        return Answer.PENDING

    def retry_due(self) -> bool:
        return self.answer is Answer.PENDING and self._clock() >= self._next


def report_end(
    api: ReportApi,
    job_id: str,
    attempt: int,
    token: str,
    result: JobResult,
    checkpoint: dict[str, Any] | None = None,
) -> None:
    """The attempt's final report; ``checkpoint``: its last synced checkpoint ``{at, size_bytes}``."""
    event = (
        "succeeded"
        if result.succeeded
        else "canceled"
        if result.failure is FailureKind.CANCELED
        else "failed"
    )
    extra = {} if checkpoint is None else {"checkpoint": checkpoint}
    try:
        api.report(
            job_id,
            attempt,
            token,
            event,
            exit_code=result.exit_code,
            failure=None if result.failure in (None, FailureKind.CANCELED) else result.failure.value,
            message=result.message,
            **extra,
        )
    except Fenced:
        log.warning("final report fenced: the attempt is no longer ours", extra={"job_id": job_id})
    except Exception as exc:  # the job has ended either way; the control plane reconciles on heartbeats
        log.error("final report failed", extra={"job_id": job_id, "attempt": attempt, "error": str(exc)})
