"""One SQS batch of Batch state-change events (berth.logic.batch_events): read once, acted on once per
Batch job, each attempt's token answered once, by its outcome's event (the sweep only when that
event is missed); failed reads leave the events to read on their own."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from berth.domain.cloud import BatchStatus, CloudUnavailable
from berth.domain.errors import StoreUnavailable
from berth.domain.job import Job
from berth.domain.status import JobStatus
from berth.logic.batch_events import BatchEvent, EventBatch, parse_event, read_once
from tests.unit.test_cloud_dispatch import CloudWorld

S = JobStatus


def _submitted(w: CloudWorld, n: int) -> list[tuple[Job, str, str]]:
    out = []
    for _ in range(n):
        job = w.place()
        token = w.dispatch(job)
        w.deliver()
        out.append((w.job(job.id), token, w.batch_id(job.id)))
    return out


def _answers(w: CloudWorld, token: str) -> list[tuple[str, str, Any]]:
    return [c for c in w.tokens.calls if c[1] == token]


def _event(bid: str, job: Job, status: BatchStatus) -> BatchEvent:
    return BatchEvent(bid, f"{job.id}-a{job.attempts}", status)


def test_a_batch_reads_its_jobs_once_and_acts_once_per_batch_job() -> None:
    w = CloudWorld()
    placed = _submitted(w, 3)
    for _, _, bid in placed:
        w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0, started_at=w.clock(), stopped_at=w.clock())
    events = [
        e
        for job, _, bid in placed
        for e in (_event(bid, job, BatchStatus.RUNNING), _event(bid, job, BatchStatus.SUCCEEDED))
    ]
    w.jobs.reads.clear()
    w.batch.describes.clear()
    batch = EventBatch(w.cloud, events)
    outcomes = [batch.handle(e) for e in events]
    assert outcomes == ["duplicate", "succeeded"] * 3
    assert w.jobs.reads["get_many"] == 1 and w.jobs.reads["get"] == 0
    regions = {job.placement.region for job, _, _ in placed if job.placement is not None}
    assert len(w.batch.describes) == len(regions)  # one DescribeJobs per region for the whole batch
    for _, token, _ in placed:
        assert _answers(w, token) == [("succeed", token, {"result": "succeeded", "exit_code": 0})]


def test_an_early_event_read_after_the_outcome_moves_to_running_and_leaves_the_answer() -> None:
    w = CloudWorld()
    ((job, token, bid),) = _submitted(w, 1)
    w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0, started_at=w.clock(), stopped_at=w.clock())
    # The RUNNING event is handled after Batch says SUCCEEDED: the job shows it ran, nothing answered.
    assert EventBatch(w.cloud, [e := _event(bid, job, BatchStatus.RUNNING)]).handle(e) == "running"
    assert w.job(job.id).status is S.RUNNING and _answers(w, token) == []
    # The SUCCEEDED event answers, once; the sweep inside the grace leaves it alone.
    w.scheduler.run_pass()
    assert _answers(w, token) == []
    assert EventBatch(w.cloud, [e := _event(bid, job, BatchStatus.SUCCEEDED)]).handle(e) == "succeeded"
    assert len(_answers(w, token)) == 1


def test_a_job_that_never_started_waits_for_its_failed_event() -> None:
    w = CloudWorld()
    ((job, token, bid),) = _submitted(w, 1)
    w.batch.set(bid, BatchStatus.FAILED, reason="Berth: no capacity", stopped_at=w.clock())
    assert EventBatch(w.cloud, [e := _event(bid, job, BatchStatus.RUNNING)]).handle(e) == "waiting"
    assert _answers(w, token) == []
    assert EventBatch(w.cloud, [e := _event(bid, job, BatchStatus.FAILED)]).handle(e) == "failed"
    assert [c[0] for c in _answers(w, token)] == ["fail"]


def test_the_sweep_answers_an_outcome_only_once_its_event_is_overdue() -> None:
    w = CloudWorld()
    ((job, token, bid),) = _submitted(w, 1)
    w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0, started_at=w.clock(), stopped_at=w.clock())
    w.clock.now += timedelta(seconds=w.cloud.settings.event_grace_s - 1)
    w.scheduler.run_pass()
    assert _answers(w, token) == []
    w.clock.now += timedelta(seconds=2)  # the event was missed
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.reconciled == 1
    assert len(_answers(w, token)) == 1
    assert w.workflow.finalize(job.id, 1) == {"status": "COMPLETED"}
    # The late event finds the job finished: stale, not answered again.
    assert EventBatch(w.cloud, [e := _event(bid, job, BatchStatus.SUCCEEDED)]).handle(e) == "stale"
    assert len(_answers(w, token)) == 1


def test_a_failed_store_read_leaves_each_event_to_read_its_own() -> None:
    w = CloudWorld()
    placed = _submitted(w, 2)
    for _, _, bid in placed:
        w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0, stopped_at=w.clock())

    def down(_ids: Any) -> dict[str, Job]:
        raise StoreUnavailable("read jobs: throttled")

    w.jobs.get_many = down  # type: ignore[method-assign]
    events = [_event(bid, job, BatchStatus.SUCCEEDED) for job, _, bid in placed]
    batch = EventBatch(w.cloud, events)
    assert batch.reads.jobs == {} and batch.reads.states == {}
    assert [batch.handle(e) for e in events] == ["succeeded", "succeeded"]


def test_a_region_whose_describe_fails_fails_its_events_for_redelivery() -> None:
    w = CloudWorld()
    ((job, token, bid),) = _submitted(w, 1)
    w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0, stopped_at=w.clock())
    assert job.placement is not None
    w.batch.down.add(job.placement.region)
    event = _event(bid, job, BatchStatus.SUCCEEDED)
    reads = read_once(w.cloud, [event])
    assert job.id in reads.jobs and bid not in reads.states  # the jobs were read; Batch was not
    with pytest.raises(CloudUnavailable):
        EventBatch(w.cloud, [event]).handle(event)  # the record goes back to the queue
    assert _answers(w, token) == []
    w.batch.down.clear()
    assert EventBatch(w.cloud, [event]).handle(event) == "succeeded"  # the redelivery


def test_events_are_parsed_from_the_forwarded_body() -> None:
    body = {
        "detail-type": "Batch Job State Change",
        "detail": {"jobId": "b-1", "jobName": "j-x-a1", "status": "RUNNING"},
    }
    assert parse_event(json.dumps(body)) == BatchEvent("b-1", "j-x-a1", BatchStatus.RUNNING)
    body["detail"]["status"] = "SOMETHING_NEW"
    assert parse_event(json.dumps(body)) == BatchEvent("b-1", "j-x-a1", None)
    assert parse_event("not json") is None and parse_event(json.dumps({"detail": {}})) is None
