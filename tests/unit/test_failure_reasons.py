"""A failed attempt's reason is Berth's own words: the exit code and where the log is, never what the
job printed, whatever the agent sends (finding 5 of issue 20: a secret printed by the job was in the
job, its events, the bus event and the Step Functions history)."""

from __future__ import annotations

import json

import pytest

from berth.domain.reasons import MAX_AGENT_TEXT, agent_text, attempt_failure_detail, exit_words
from berth.domain.workflow import AttemptReport, Failure, ReportEvent
from berth.logic.agent import HostCaller
from tests.unit.test_workflow_services import World, _host, _ref

SECRET = "hunter2-5f3e9a"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (3, "exited with code 3"),
        (-9, "killed by signal 9 (SIGKILL)"),
        (137, "exited with code 137 (128 + SIGKILL)"),
        (255, "exited with code 255"),
        (None, "ended without an exit code"),
    ],
)
def test_exit_words(code: int | None, words: str) -> None:
    assert exit_words(code) == words


@pytest.mark.parametrize(
    ("failure", "code", "detail"),
    [
        (Failure.NONZERO_EXIT, 3, "exited with code 3; see `berth logs j-1`"),
        (Failure.OOM, -9, "out of memory (killed by signal 9 (SIGKILL)); see `berth logs j-1`"),
        (
            Failure.TIMEOUT,
            -15,
            "stopped at its timeout_minutes limit (killed by signal 15 (SIGTERM)); see `berth logs j-1`",
        ),
        (
            Failure.BAD_IMAGE,
            125,
            "the image could not be pulled (exited with code 125); see `berth logs j-1`",
        ),
        (Failure.CANCELED, -15, "stopped on cancel (killed by signal 15 (SIGTERM))"),
    ],
)
def test_an_attempt_that_ran_is_described_by_its_exit_never_by_the_agents_text(
    failure: Failure, code: int, detail: str
) -> None:
    message = f"exited with {code}: Error: TOKEN={SECRET} was rejected"  # what agents sent until now
    assert attempt_failure_detail("j-1", failure, code, message) == detail


def test_an_attempt_that_never_ran_keeps_the_agents_words_flattened_and_cut() -> None:
    said = "secret berth/vision/hf could not be read: AccessDenied"
    assert attempt_failure_detail("j-1", Failure.STAGING, None, said) == said
    assert attempt_failure_detail("j-1", Failure.AGENT_ERROR, None, "") == "AgentError"
    assert agent_text("a\x1b]52;c;eA==\x07b\r\nc") == "a ]52;c;eA== b c"
    assert len(agent_text("x" * 5000)) == MAX_AGENT_TEXT


def test_a_secret_in_an_agents_report_reaches_no_cause_reason_event_or_notification() -> None:
    w = World(hosts=1)
    job, _ = w.run_to_running(w.submit())
    ref = _ref(job)
    report = AttemptReport(
        **ref.model_dump(),
        event=ReportEvent.FAILED,
        exit_code=3,
        failure="nonzero_exit",
        message=f"exited with 3: Traceback ... ValueError: bad token {SECRET}",
    )
    w.agent.report(HostCaller(_host(job), ""), report)
    token = job.run.attempt.dispatch_token
    assert token is not None
    cause = w.tokens.causes[token]  # what SendTaskFailure puts in the execution's history
    assert cause == f"{_host(job)}: exited with code 3; see `berth logs {job.id}`"
    w.workflow.classify_failure(job.id, 1, "Berth.NonZeroExit", cause)
    failed = w.job(job.id)
    stored = [failed.reason, failed.run.last_failure, *(e.reason for e in w.jobs.events(job.id))]
    notifications = [failed.notification(e) for e in w.jobs.events(job.id)]
    assert SECRET not in json.dumps([stored, notifications], default=str)
    assert failed.reason.startswith("NonZeroExit (permanent): ") and f"berth logs {job.id}" in failed.reason
