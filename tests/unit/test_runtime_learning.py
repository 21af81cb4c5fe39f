"""Learning completed runs from the job-events stream (issue 18): the COMPLETED event's row carries
the run (dal/jobs.py, ``run_observation``), the stream's records are read into runs
(dal/job_stream.py), a batch is learnt with one history update per tenant (logic/runtimes.py
``learn``), and the notifier publishes whatever happens to the learning (handlers/notifier.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from berth.dal import job_stream
from berth.dal.jobs import DynamoJobRepository
from berth.domain.errors import Conflict, StoreUnavailable
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement
from berth.domain.run_observation import RunObservation
from berth.domain.status import JobStatus
from berth.logic.runtimes import learn, observed_all
from tests.unit.fakes import FakeRuntimeHistory

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
ROWS = DynamoJobRepository("jobs", "job-events", "tenants")  # builds rows only: no AWS call


def _completed(tenant: str, name: str, seconds: float, estimate_min: int | None = None) -> list[Any]:
    """The stream's records of one job's life, QUEUED to COMPLETED after ``seconds`` of running: the
    new images exactly as pynamodb writes the rows (``Model.serialize``)."""
    spec: dict[str, Any] = {
        "name": name,
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu_type": "A10G", "gpus": 2},
    }
    if estimate_min is not None:
        spec["expected_duration_minutes"] = estimate_min
    job, first = new_job(new_job_id(NOW), tenant, "alice", JobSpec.model_validate(spec), NOW)
    placement = CloudPlacement(region="us-east-1", queue="q", instance_type="g5.12xlarge", gpu_type="A10G")
    placed, to_starting = job.transition(
        JobStatus.STARTING,
        "placed",
        NOW,
        site=placement.site,
        placement=placement,
        attempts=1,
        run=job.run.with_attempt(fencing_token="f"),
    )
    running, to_running = placed.transition(
        JobStatus.RUNNING, "running", NOW, run=placed.run.with_attempt(started_at=NOW)
    )
    done, to_completed = running.transition(
        JobStatus.COMPLETED, "completed (attempt 1)", NOW + timedelta(seconds=seconds)
    )
    return [
        _insert(j, e)
        for j, e in ((job, first), (placed, to_starting), (running, to_running), (done, to_completed))
    ]


def _insert(job: Job, event: Any) -> dict[str, Any]:
    return {"eventName": "INSERT", "dynamodb": {"NewImage": ROWS.event_row_of(event, job).serialize()}}


def test_only_a_completed_row_carries_the_run_and_the_public_detail_stays_as_it_was() -> None:
    records = _completed("vision", "resnet", 300.0, estimate_min=10)
    images = job_stream.inserted(records)
    assert [i["to_status"] for i in images] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert [i.get("run_observation") is not None for i in images] == [False, False, False, True]
    assert job_stream.observations(images) == [RunObservation("vision", "resnet", "A10G", 2, 300.0, 600.0)]
    details = job_stream.details(images)
    assert [d["to"] for d in details] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert set(details[-1]) == {
        "tenant",
        "job_id",
        "seq",
        "at",
        "from",
        "to",
        "reason",
        "site",
        "placement",
        "attempt",
        "cost_usd",
    }


def test_rows_without_a_run_and_records_other_than_inserts_are_skipped() -> None:
    records = _completed("vision", "resnet", 300.0)
    completed = records[-1]
    old = json.loads(json.dumps(completed))
    del old["dynamodb"]["NewImage"]["run_observation"]  # a COMPLETED row written before issue 18
    broken = json.loads(json.dumps(completed))
    broken["dynamodb"]["NewImage"]["run_observation"] = {"S": '{"tenant": "vision"}'}
    modified = {**completed, "eventName": "MODIFY"}
    removed = {"eventName": "REMOVE", "dynamodb": {"OldImage": completed["dynamodb"]["NewImage"]}}
    images = job_stream.inserted([old, broken, modified, removed, completed])
    assert len(images) == 3  # the inserts only
    assert job_stream.observations(images) == [RunObservation("vision", "resnet", "A10G", 2, 300.0, None)]
    assert len(job_stream.details(images)) == 3


class CountingHistory(FakeRuntimeHistory):
    def __init__(self, failing: dict[str, Exception] | None = None) -> None:
        super().__init__()
        self.updates: list[str] = []
        self.failing = failing or {}

    def update(self, tenant: str, change: Any) -> None:
        self.updates.append(tenant)
        if tenant in self.failing:
            raise self.failing[tenant]
        super().update(tenant, change)


def _run(tenant: str, family: str, seconds: float) -> RunObservation:
    return RunObservation(tenant, family, "A10G", 1, seconds, None)


def test_a_batch_is_learnt_with_one_update_per_tenant_applying_all_its_runs_in_order() -> None:
    runs = [_run("vision", "resnet", 100.0), _run("nlp", "bert", 50.0), _run("vision", "vit", 200.0)]
    runs += [_run("vision", "resnet", 120.0)]
    history = CountingHistory()
    learnt = learn(history, runs)
    assert learnt.runs == 4 and learnt.failed == ()
    assert history.updates == ["vision", "nlp"]
    docs = history.read(["vision", "nlp"])
    assert docs["vision"]["observed"] == 3 and docs["nlp"]["observed"] == 1
    # the same document as learning the tenant's runs one at a time, in the batch's order
    assert docs["vision"] == observed_all(None, [r for r in runs if r.tenant == "vision"])


@pytest.mark.parametrize("error", [StoreUnavailable("down"), Conflict("kept changing")])
def test_a_tenant_whose_history_fails_is_skipped_and_the_others_are_learnt(error: Exception) -> None:
    history = CountingHistory(failing={"vision": error})
    learnt = learn(history, [_run("vision", "resnet", 100.0), _run("nlp", "bert", 50.0)])
    assert learnt.runs == 1 and learnt.failed == ("vision",)
    assert set(history.read(["vision", "nlp"])) == {"nlp"}


class Publisher:
    def __init__(self, fail: bool = False) -> None:
        self.published: list[dict[str, Any]] = []
        self.fail = fail

    def publish(self, details: list[dict[str, Any]]) -> None:
        if self.fail:
            raise StoreUnavailable("EventBridge refused 1 job events")
        self.published.extend(details)


class Context:
    function_name = "berth-notifier"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:berth-notifier"
    aws_request_id = "req-1"


class _NoTrigger:
    def request(self, reason: str, delay_s: int = 0) -> None:
        return None


def _notify(monkeypatch: pytest.MonkeyPatch, records: list[Any], publisher: Any, history: Any) -> Any:
    from berth.handlers import notifier

    monkeypatch.setattr(notifier, "event_publisher", lambda: publisher)
    monkeypatch.setattr(notifier, "runtime_history", lambda: history)
    monkeypatch.setattr(notifier, "pass_trigger", lambda: _NoTrigger())  # tests/unit/test_pass_triggers.py
    return notifier.lambda_handler({"Records": records}, Context())  # type: ignore[arg-type]


def test_the_notifier_publishes_every_change_then_learns_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    records = _completed("vision", "resnet", 300.0) + _completed("vision", "vit", 60.0)
    records += _completed("nlp", "bert", 90.0)
    publisher, history = Publisher(), CountingHistory()
    assert _notify(monkeypatch, records, publisher, history) == {
        "published": 12,
        "pass_requested": True,
        "learnt": 3,
    }
    assert len(publisher.published) == 12
    assert not any("run_observation" in d for d in publisher.published)
    assert history.updates == ["vision", "nlp"]
    assert history.read(["vision"])["vision"]["observed"] == 2


@pytest.mark.parametrize(
    "error", [StoreUnavailable("down"), Conflict("kept changing"), RuntimeError("a bug in learning")]
)
def test_a_learning_failure_does_not_stop_publishing(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    records = _completed("vision", "resnet", 300.0)
    publisher, history = Publisher(), CountingHistory(failing={"vision": error})
    assert _notify(monkeypatch, records, publisher, history) == {
        "published": 4,
        "pass_requested": True,
        "learnt": 0,
    }
    assert [d["to"] for d in publisher.published] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert history.updates == ["vision"]


def test_a_failure_to_publish_still_fails_the_batch_and_learns_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the batch is retried (bisected): learning only after publishing keeps a retry from learning twice
    history = CountingHistory()
    with pytest.raises(StoreUnavailable):
        _notify(monkeypatch, _completed("vision", "resnet", 300.0), Publisher(fail=True), history)
    assert history.updates == []
