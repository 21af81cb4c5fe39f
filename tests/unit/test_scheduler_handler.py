"""The scheduler's Lambda asks for another pass when its expander left work or created tasks."""

from __future__ import annotations

from typing import Any

import pytest

from berth.handlers import scheduler
from berth.logic.scheduler_service import PassReport


class _Expander:
    def __init__(self, more: bool, created: int) -> None:
        self.more, self.stats, self.last_error = more, {"tasks_created": created} if created else {}, ""

    def run(self) -> bool:
        return self.more


class _Trigger:
    def __init__(self) -> None:
        self.requests: list[str] = []

    def request(self, reason: str, delay_s: int = 0) -> None:
        self.requests.append(reason)


class _Scheduler:
    def run_pass(self, time_left: Any = None) -> PassReport:
        return PassReport()


class _Context:
    function_name = "scheduler"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:scheduler"
    aws_request_id = "r"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@pytest.mark.parametrize(
    ("more", "created", "expected"),
    [
        (True, 100, ["array expansion continues"]),
        (False, 30, ["array tasks created"]),
        (False, 0, []),
    ],
)
def test_the_pass_is_asked_for_again_after_new_tasks(
    monkeypatch: pytest.MonkeyPatch, more: bool, created: int, expected: list[str]
) -> None:
    trigger = _Trigger()
    monkeypatch.setattr(scheduler, "array_expander", lambda: _Expander(more, created))
    monkeypatch.setattr(scheduler, "pass_trigger", lambda: trigger)
    monkeypatch.setattr(scheduler, "scheduler_service", lambda: _Scheduler())
    scheduler.lambda_handler({"Records": []}, _Context())  # type: ignore[arg-type]
    assert trigger.requests == expected
