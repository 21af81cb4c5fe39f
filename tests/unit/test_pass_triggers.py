"""Per-job pass requests moved to the job-events stream (issue 18): which changes ask for a pass
(``berth.logic.pass_triggers``), read from the stream's records as pynamodb writes the rows
(``berth.dal.job_stream.events``), and the notifier asking for one pass per batch, whatever happens to
that request once the batch is published (``berth.handlers.notifier``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from berth.dal import job_stream
from berth.dal.jobs import DynamoJobRepository
from berth.domain.arrays import task_id
from berth.domain.errors import StoreUnavailable
from berth.domain.job import Job, JobEvent, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement
from berth.domain.status import TRANSITIONS, JobStatus
from berth.logic.pass_triggers import pass_kind, pass_reason
from tests.unit.test_runtime_learning import Context, CountingHistory, Publisher

S = JobStatus
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
ROWS = DynamoJobRepository("jobs", "job-events", "tenants")  # builds rows only: no AWS call
SPEC = JobSpec.model_validate(
    {"name": "t", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "A10G", "gpus": 1}}
)


def _event(src: JobStatus | None, dst: JobStatus, job_id: str = "j-1") -> JobEvent:
    return JobEvent(job_id=job_id, seq=2, at=NOW, from_=src, to=dst, reason="r")


# -- the decision --------------------------------------------------------------------------------------


def test_a_submit_or_a_requeue_asks_for_a_pass() -> None:
    assert pass_kind(_event(None, S.QUEUED)) == "submitted"
    assert pass_kind(_event(S.RETRYING, S.QUEUED)) == "requeued"
    assert pass_reason([_event(None, S.QUEUED)]) == "job events: 1 submitted"


@pytest.mark.parametrize("src", [S.STARTING, S.RUNNING, S.CANCELING])
def test_a_job_leaving_a_state_that_holds_capacity_asks_for_a_pass(src: JobStatus) -> None:
    for dst in TRANSITIONS[src]:
        if dst.is_terminal:
            assert pass_kind(_event(src, dst)) == "jobs ended"
        elif dst is S.RETRYING:
            assert pass_kind(_event(src, dst)) == "attempts ended"
    assert pass_reason([_event(S.RUNNING, S.COMPLETED)]) == "job events: 1 jobs ended"


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (S.QUEUED, S.STARTING),  # a placement: the pass's own write
        (S.STARTING, S.RUNNING),
        (S.STARTING, S.CANCELING),  # still holding until its attempt ends
        (S.RUNNING, S.CANCELING),
        (S.QUEUED, S.CANCELED),  # held nothing
        (S.QUEUED, S.FAILED),
        (S.RETRYING, S.CANCELED),  # its holds went with the attempt's end
        (S.RETRYING, S.FAILED),
    ],
)
def test_a_change_that_frees_nothing_and_queues_nothing_asks_for_none(src: JobStatus, dst: JobStatus) -> None:
    assert pass_kind(_event(src, dst)) is None
    assert pass_reason([_event(src, dst)]) is None


def test_an_array_tasks_creation_asks_for_none_its_retry_does() -> None:
    task = task_id(new_job_id(NOW), 7)
    assert pass_kind(_event(None, S.QUEUED, task)) is None  # the expander asks, once per invocation
    assert pass_kind(_event(S.RETRYING, S.QUEUED, task)) == "requeued"
    assert pass_kind(_event(S.RUNNING, S.COMPLETED, task)) == "jobs ended"


def test_a_batch_of_fifty_changes_is_one_request_counting_them_by_kind() -> None:
    batch = [_event(None, S.QUEUED, f"j-{i}") for i in range(20)]
    batch += [_event(S.STARTING, S.RUNNING, f"j-{i}") for i in range(10)]
    batch += [_event(S.RUNNING, S.COMPLETED, f"j-{i}") for i in range(12)]
    batch += [_event(S.RUNNING, S.RETRYING, f"j-{i}") for i in range(5)]
    batch += [_event(S.RETRYING, S.QUEUED, f"j-{i}") for i in range(3)]
    assert len(batch) == 50
    assert pass_reason(batch) == "job events: 20 submitted, 3 requeued, 5 attempts ended, 12 jobs ended"
    assert pass_reason(e for e in batch if e.to is S.RUNNING) is None


# -- the stream's records --------------------------------------------------------------------------------


def _lifecycle(job_id: str | None = None, end: JobStatus = S.COMPLETED) -> list[dict[str, Any]]:
    """The stream's records of one job's life, QUEUED to ``end``: the new images exactly as pynamodb
    writes the rows (``Model.serialize``)."""
    job, first = new_job(job_id or new_job_id(NOW), "vision", "alice", SPEC, NOW)
    placement = CloudPlacement(region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G")
    placed, to_starting = job.transition(
        S.STARTING,
        "placed",
        NOW,
        site=placement.site,
        placement=placement,
        attempts=1,
        run=job.run.with_attempt(fencing_token="f"),
    )
    running, to_running = placed.transition(
        S.RUNNING, "running", NOW, run=placed.run.with_attempt(started_at=NOW)
    )
    done, to_end = running.transition(end, "ended", NOW + timedelta(seconds=60))
    return [
        _insert(j, e) for j, e in ((job, first), (placed, to_starting), (running, to_running), (done, to_end))
    ]


def _insert(job: Job, event: JobEvent) -> dict[str, Any]:
    return {"eventName": "INSERT", "dynamodb": {"NewImage": ROWS.event_row_of(event, job).serialize()}}


def test_the_streams_rows_are_read_back_into_the_changes_they_record() -> None:
    images = job_stream.inserted(_lifecycle())
    events = job_stream.events(images)
    assert [(e.from_, e.to) for e in events] == [
        (None, S.QUEUED),
        (S.QUEUED, S.STARTING),
        (S.STARTING, S.RUNNING),
        (S.RUNNING, S.COMPLETED),
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[-1].at == NOW + timedelta(seconds=60)
    broken = dict(images[0], to_status="NOT_A_STATUS")
    assert job_stream.events([broken, images[1]]) == events[1:2]  # a row that does not parse is skipped


# -- the notifier ------------------------------------------------------------------------------------


class Trigger:
    def __init__(self, fail: Exception | None = None) -> None:
        self.requests: list[tuple[str, int]] = []
        self.fail = fail

    def request(self, reason: str, delay_s: int = 0) -> None:
        self.requests.append((reason, delay_s))
        if self.fail is not None:
            raise self.fail


def _notify(monkeypatch: pytest.MonkeyPatch, records: list[Any], publisher: Any, trigger: Trigger) -> Any:
    from berth.handlers import notifier

    monkeypatch.setattr(notifier, "event_publisher", lambda: publisher)
    monkeypatch.setattr(notifier, "runtime_history", lambda: CountingHistory())
    monkeypatch.setattr(notifier, "pass_trigger", lambda: trigger)
    return notifier.lambda_handler({"Records": records}, Context())  # type: ignore[arg-type]


def test_the_notifier_asks_for_one_pass_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [r for _ in range(5) for r in _lifecycle()]  # 5 submits, 5 completions, 10 others
    publisher, trigger = Publisher(), Trigger()
    out = _notify(monkeypatch, records, publisher, trigger)
    assert out == {"published": 20, "pass_requested": True, "learnt": 5}
    assert trigger.requests == [("job events: 5 submitted, 5 jobs ended", 0)]


def test_a_batch_with_nothing_to_place_asks_for_no_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    records = _lifecycle()[1:3]  # placed, started
    publisher, trigger = Publisher(), Trigger()
    assert _notify(monkeypatch, records, publisher, trigger)["pass_requested"] is False
    assert trigger.requests == [] and len(publisher.published) == 2


@pytest.mark.parametrize(
    "error", [StoreUnavailable("could not request a scheduling pass"), RuntimeError("a bug")]
)
def test_a_failed_pass_request_still_publishes_and_succeeds(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # the timer's pass is the backstop; failing the batch would publish its notifications again
    publisher, trigger = Publisher(), Trigger(fail=error)
    out = _notify(monkeypatch, _lifecycle(), publisher, trigger)
    assert out == {"published": 4, "pass_requested": False, "learnt": 1}
    assert [d["to"] for d in publisher.published] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert len(trigger.requests) == 1


def test_a_failure_to_publish_fails_the_batch_before_any_pass_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trigger = Trigger()
    with pytest.raises(StoreUnavailable):
        _notify(monkeypatch, _lifecycle(), Publisher(fail=True), trigger)
    assert trigger.requests == []  # the retried batch asks once
