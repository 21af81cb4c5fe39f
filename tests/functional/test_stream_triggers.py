"""Issue 18 on moto, wired as the Lambdas are (``berth.handlers.runtime``): the workflow's tasks ask
for no pass; the job-events stream's records, given to the notifier as Lambda gives them, ask for
exactly one pass per batch on the scheduler's trigger queue (``berth.logic.pass_triggers``)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from tests.functional.conftest import Calls, FakeContext, cold_start
from tests.functional.test_runtime_learning import _running, _stream_records


@pytest.fixture
def wired(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    url = boto3.client("sqs", region_name="us-east-1").create_queue(QueueName="trigger")["QueueUrl"]
    boto3.client("events", region_name="us-east-1").create_event_bus(Name="berth-test-bus")
    monkeypatch.setenv("BERTH_SCHEDULER_QUEUE_URL", url)
    monkeypatch.setenv("BERTH_EVENT_BUS_NAME", "berth-test-bus")
    cold_start()


def _messages() -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.get_queue_url(QueueName="trigger")["QueueUrl"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in got]


def test_a_batch_of_state_changes_is_one_send_message_to_the_trigger_queue(
    wired: None,
    calls: Calls,
) -> None:
    from berth.handlers import notifier
    from berth.handlers.runtime import workflow_service

    jobs = [_running("vision", f"train-{i}", 60.0) for i in range(6)]
    calls.clear()
    for job in jobs[:4]:
        assert workflow_service().finalize(job.id, 1) == {"status": "COMPLETED"}
    for job in jobs[4:]:
        assert (
            workflow_service().classify_failure(job.id, 1, "Berth.HostLost", "lease lost")["action"]
            == "retry"
        )
        assert workflow_service().requeue(job.id) == {"outcome": "queued"}
    assert calls.ops()["SendMessage"] == 0  # the workflow's tasks ask for no pass
    records = _stream_records([j.id for j in jobs])
    # QUEUED, STARTING, RUNNING and COMPLETED, or RETRYING and QUEUED again
    assert len(records) == 4 * 4 + 2 * 5
    calls.clear()
    out = notifier.lambda_handler({"Records": records}, FakeContext())  # type: ignore[arg-type]
    assert out["published"] == 26 and out["pass_requested"] is True
    assert calls.ops()["SendMessage"] == 1
    assert _messages() == [{"reason": "job events: 6 submitted, 2 requeued, 2 attempts ended, 4 jobs ended"}]


def test_a_batch_that_frees_and_queues_nothing_sends_nothing(
    wired: None,
    calls: Calls,
) -> None:
    from berth.handlers import notifier

    job = _running("vision", "train", 60.0)
    started = [
        r for r in _stream_records([job.id]) if r["dynamodb"]["NewImage"]["to_status"]["S"] != "QUEUED"
    ]
    calls.clear()
    out = notifier.lambda_handler({"Records": started}, FakeContext())  # type: ignore[arg-type]
    assert out == {"published": 2, "pass_requested": False, "learnt": 0}
    assert calls.ops()["SendMessage"] == 0 and _messages() == []


def test_a_lost_pass_request_still_publishes_the_batch(
    wired: None, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.handlers import notifier

    job = _running("vision", "train", 60.0)
    # no such queue: SendMessage fails; the timer's pass is the backstop, the batch still succeeds
    monkeypatch.setenv(
        "BERTH_SCHEDULER_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/missing"
    )
    cold_start()
    calls.clear()
    out = notifier.lambda_handler({"Records": _stream_records([job.id])}, FakeContext())  # type: ignore[arg-type]
    assert out == {"published": 3, "pass_requested": False, "learnt": 0}
    assert calls.ops()["PutEvents"] == 1 and calls.ops()["SendMessage"] == 1
