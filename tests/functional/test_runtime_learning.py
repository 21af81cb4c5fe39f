"""Issue 18 on moto, wired as the Lambdas are (``berth.handlers.runtime``): Finalize completes jobs
without touching the run-time history; the job-events stream's records of those completions, given
to the notifier as Lambda gives them, are published and learnt with one GetItem and one PutItem of
each tenant's ``RUNTIMES#`` item per batch; the next pass predicts from what was learnt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement
from berth.domain.status import JobStatus
from berth.logic.runtimes import predictor_for
from berth.scheduler.predictor import Source
from tests.functional.conftest import TABLES, Calls, FakeContext, cold_start

BUS = "berth-test-bus"


@pytest.fixture
def wired(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    url = boto3.client("sqs", region_name="us-east-1").create_queue(QueueName="trigger")["QueueUrl"]
    boto3.client("events", region_name="us-east-1").create_event_bus(Name=BUS)
    monkeypatch.setenv("BERTH_SCHEDULER_QUEUE_URL", url)
    monkeypatch.setenv("BERTH_EVENT_BUS_NAME", BUS)
    cold_start()


def _running(tenant: str, name: str, ran_s: float) -> Job:
    """A cloud job of ``tenant`` RUNNING for ``ran_s`` seconds, stored as the workflow stores it."""
    from berth.handlers.runtime import job_repository

    now = datetime.now(UTC) - timedelta(seconds=ran_s)
    spec = {
        "name": name,
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu_type": "A10G", "gpus": 1},
    }
    job, event = new_job(new_job_id(now), tenant, "alice", JobSpec.model_validate(spec), now)
    jobs = job_repository()
    jobs.create(job, event, max_active=100)
    placement = CloudPlacement(region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G")
    placed, event = job.transition(
        JobStatus.STARTING,
        "placed",
        now,
        site=placement.site,
        placement=placement,
        attempts=1,
        run=job.run.with_attempt(fencing_token="f"),
    )
    jobs.save(placed, event)
    running, event = placed.transition(
        JobStatus.RUNNING, "running", now, run=placed.run.with_attempt(started_at=now)
    )
    jobs.save(running, event)
    return running


def _stream_records(job_ids: list[str]) -> list[dict[str, Any]]:
    """The job-events table's stream (NEW_IMAGE) as Lambda passes it: one INSERT per row."""
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    records = []
    for job_id in job_ids:
        rows = ddb.query(
            TableName=TABLES["BERTH_JOB_EVENTS_TABLE"],
            KeyConditionExpression="job_id = :j",
            ExpressionAttributeValues={":j": {"S": job_id}},
        )["Items"]
        records += [
            {"eventName": "INSERT", "eventSource": "aws:dynamodb", "dynamodb": {"NewImage": r}} for r in rows
        ]
    return records


def test_finalize_leaves_learning_to_the_stream_which_updates_each_tenant_once_per_batch(
    wired: None, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.dal.workflow import EventBridgePublisher
    from berth.handlers import notifier
    from berth.handlers.runtime import runtime_history, workflow_service

    jobs = [_running("vision", "resnet", s) for s in (300.0, 330.0, 360.0)] + [_running("nlp", "bert", 60.0)]
    calls.clear()
    for job in jobs:
        assert workflow_service().finalize(job.id, 1) == {"status": "COMPLETED"}
    # Finalize: the job's transaction; no run-time history read or written, no pass asked for
    assert calls.ops()["SendMessage"] == 0
    assert not [k for k in calls.keys("GetItem") if k.startswith("RUNTIMES#")]
    assert calls.ops()["PutItem"] == 0
    assert runtime_history().read(["vision", "nlp"]) == {}

    published: list[dict[str, Any]] = []
    publish = EventBridgePublisher.publish

    def spy(self: EventBridgePublisher, details: list[dict[str, Any]]) -> None:
        published.extend(details)
        publish(self, details)

    monkeypatch.setattr(EventBridgePublisher, "publish", spy)
    records = _stream_records([j.id for j in jobs])
    assert len(records) == 4 * 4  # QUEUED, STARTING, RUNNING, COMPLETED
    calls.clear()
    out = notifier.lambda_handler({"Records": records}, FakeContext())  # type: ignore[arg-type]
    assert out == {"published": 16, "pass_requested": True, "learnt": 4}
    # one read-modify-write of each tenant's history for the whole batch
    assert calls.keys("GetItem") == ["RUNTIMES#vision", "RUNTIMES#nlp"]
    assert calls.ops()["PutItem"] == 2 and calls.ops()["PutEvents"] == 2
    # one pass asked for the whole batch (tests/functional/test_stream_triggers.py)
    assert calls.ops()["SendMessage"] == 1
    assert len(published) == 16 and not any("run_observation" in d for d in published)
    docs = runtime_history().read(["vision", "nlp"])
    assert docs["vision"]["observed"] == 3 and docs["nlp"]["observed"] == 1
    rt = predictor_for(runtime_history(), ["vision"]).predict("vision", "resnet", "A10G", 1, None, 86400.0)
    assert rt is not None and rt.source is Source.HISTORY
    assert 300.0 <= rt.quantile(0.5) <= 370.0
