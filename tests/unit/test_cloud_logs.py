"""A cloud attempt's output where AWS Batch puts it: the awslogs names the local Batch uses, the stream
Batch reports (DescribeJobs ``container.logStreamName``) recorded on the job by the event handler and
the sweep, and the logs route reading it (an empty page with a reason until it is known)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from berth.dal.batch import _batch_job
from berth.domain.cloud import BatchStatus
from berth.domain.errors import NotFound
from berth.domain.observability import (
    STREAM_NEVER_REASON,
    STREAM_PENDING_REASON,
    attempt_log_source,
    is_log_stream_name,
)
from berth.domain.status import JobStatus
from berth.domain.workflow import RunState
from berth.logic.jobs import JobService
from berth.logic.observability import ObservabilityService
from berth_tools.cli.observe_cmd import log_pages
from berth_tools.localcloud.local_batch import DEFAULT_LOG_GROUP, awslogs_target
from tests.unit.fakes import FakeLogReader
from tests.unit.test_cloud_dispatch import CloudWorld, _submitted
from tests.unit.test_observability import ALICE, BOB

S = JobStatus
STREAM = "batch/default/0123456789abcdef0123456789abcdef"
GROUP = "/berth/jobs/vision"

# -- the names the awslogs driver uses (the local Batch runner) ----------------------------------------


def test_awslogs_names_come_from_the_definitions_log_configuration() -> None:
    props = {
        "image": "x",
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {
                "awslogs-group": GROUP,
                "awslogs-stream-prefix": "batch",
                "awslogs-region": "eu-west-1",
            },
        },
    }
    target = awslogs_target("berth-img-abc-vision", props, "t" * 32)
    assert (target.group, target.stream, target.region) == (GROUP, "batch/default/" + "t" * 32, "eu-west-1")


@pytest.mark.parametrize(
    ("props", "group"),
    [
        (None, DEFAULT_LOG_GROUP),
        ({"image": "x"}, DEFAULT_LOG_GROUP),
        ({"logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": GROUP}}}, GROUP),
        # another driver: Batch's own default names (nothing of the awslogs options applies)
        (
            {"logConfiguration": {"logDriver": "splunk", "options": {"awslogs-group": GROUP}}},
            DEFAULT_LOG_GROUP,
        ),
    ],
)
def test_without_a_prefix_the_stream_starts_with_the_definitions_name(
    props: dict[str, Any] | None, group: str
) -> None:
    target = awslogs_target("my-def", props, "abc")
    assert (target.group, target.stream, target.region) == (group, "my-def/default/abc", None)


def test_describe_jobs_container_log_stream_name_is_parsed() -> None:
    item = {"jobId": "b-1", "jobName": "j-a1", "status": "RUNNING", "container": {"logStreamName": STREAM}}
    assert _batch_job(item).log_stream == STREAM
    assert _batch_job({"jobId": "b-1", "jobName": "j-a1", "status": "RUNNABLE"}).log_stream is None
    assert _batch_job({**item, "container": {"logStreamName": ""}}).log_stream is None


def test_stream_names_are_checked_as_cloudwatch_does() -> None:
    assert is_log_stream_name(STREAM) and is_log_stream_name("j-1/1")
    for bad in (None, "", "a:b", "a*", "x" * 513):
        assert not is_log_stream_name(bad)


# -- which stream an attempt reads ---------------------------------------------------------------------


def test_an_onprem_attempt_reads_the_agents_stream() -> None:
    w = CloudWorld()
    job = w.submit()
    onprem = job.model_copy(update={"attempts": 2, "status": S.RUNNING})
    assert attempt_log_source(onprem, 2).stream == f"{job.id}/2"
    assert attempt_log_source(onprem, 1).stream == f"{job.id}/1"


def test_a_cloud_attempt_reads_the_stream_batch_named_and_none_before() -> None:
    w = CloudWorld()
    job = w.place()
    pending = attempt_log_source(job, 1)
    assert pending.stream is None and pending.reason == STREAM_PENDING_REASON.format(attempt=1)
    ended = job.model_copy(update={"status": S.FAILED})
    assert attempt_log_source(ended, 1).reason == STREAM_NEVER_REASON.format(attempt=1)
    known = job.model_copy(update={"run": job.run.with_log_stream(1, STREAM)})
    assert attempt_log_source(known, 1).stream == STREAM


def test_recorded_streams_survive_attempts_and_round_trip_as_json() -> None:
    run = RunState().with_log_stream(1, "a/default/1").with_log_stream(2, "a/default/2")
    run = run.with_log_stream(1, "a/default/1")  # recorded again: still one entry
    assert [s.attempt for s in run.log_streams] == [2, 1]
    assert (run.log_stream_of(1), run.log_stream_of(2), run.log_stream_of(3)) == (
        "a/default/1",
        "a/default/2",
        None,
    )
    stored = run.model_dump(mode="json", exclude_defaults=True)
    assert RunState.model_validate(stored) == run


# -- the control plane learns the stream ---------------------------------------------------------------


def test_the_running_event_records_the_stream_before_anything_else() -> None:
    w = CloudWorld()
    job, _, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.STARTING)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "waiting"
    assert w.job(job.id).run.log_streams == ()
    w.batch.set(bid, BatchStatus.RUNNING, log_stream=STREAM)
    before = w.job(job.id).version
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "running"
    running = w.job(job.id)
    assert running.status is S.RUNNING and running.run.log_stream_of(1) == STREAM
    assert running.version == before + 1  # the stream went in with the move to RUNNING: one write
    version = running.version
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "running"  # a duplicate writes nothing
    assert w.job(job.id).version == version
    w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "succeeded"
    assert w.workflow.finalize(job.id, 1) == {"status": "COMPLETED"}
    assert w.job(job.id).run.log_stream_of(1) == STREAM  # kept once the job ended


def test_a_job_that_only_reports_its_end_still_gets_its_stream() -> None:
    w = CloudWorld()
    job, _, bid = _submitted(w)
    reason = "Essential container in task exited"
    w.batch.set(bid, BatchStatus.FAILED, reason=reason, exit_code=3, log_stream=STREAM)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "failed"
    assert w.job(job.id).run.log_stream_of(1) == STREAM


def test_the_sweep_records_the_stream_of_a_missed_event() -> None:
    w = CloudWorld()
    job, _, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.RUNNING, log_stream=STREAM)
    w.cloud.on_event(bid, f"{job.id}-a1")  # RUNNING, but say the stream was not named yet
    stripped = w.job(job.id)
    w.jobs.update(
        stripped.updated(stripped.updated_at, run=stripped.run.model_copy(update={"log_streams": ()}))
    )
    w.scheduler.run_pass()
    assert w.job(job.id).run.log_stream_of(1) == STREAM


def test_a_stale_attempts_event_records_its_stream_for_that_attempt_only() -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.FAILED, reason="CAPACITY_UNAVAILABLE")
    w.cloud.on_event(bid, f"{job.id}-a1")
    w.classify(job, token)
    w.workflow.requeue(job.id)
    w.workflow.await_placement(job.id, "p2")
    w.scheduler.run_pass()
    w.dispatch(w.job(job.id))
    w.deliver()
    # attempt 1's Batch job reports a stream late (its RUNNING event was lost): it is attempt 1's
    w.batch.set(bid, BatchStatus.RUNNING, log_stream="batch/default/first")
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "stale"
    now = w.job(job.id)
    assert now.attempts == 2 and now.run.log_stream_of(1) == "batch/default/first"
    assert now.run.log_stream_of(2) is None


def test_a_foreign_or_malformed_stream_is_not_recorded() -> None:
    w = CloudWorld()
    job, _, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.RUNNING, log_stream="bad:name")
    w.cloud.on_event(bid, f"{job.id}-a1")
    assert w.job(job.id).run.log_streams == ()
    other = dataclasses.replace(w.batch.jobs[bid], name="j-other-a1", log_stream=STREAM)
    assert w.cloud.record_log_stream(w.job(job.id), other).run.log_streams == ()


def test_recording_retries_on_a_concurrent_write() -> None:
    w = CloudWorld()
    job, _, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.RUNNING, log_stream=STREAM)
    stale = w.job(job.id)
    fresh = stale.updated(stale.updated_at)
    w.jobs.update(fresh)  # someone else wrote meanwhile: the stale copy's write conflicts
    out = w.cloud.record_log_stream(stale, w.batch.jobs[bid])
    assert w.job(job.id).run.log_stream_of(1) == STREAM
    assert out.version == fresh.version + 1


# -- the logs route reads it ---------------------------------------------------------------------------


def _service(w: CloudWorld, logs: FakeLogReader) -> ObservabilityService:
    return ObservabilityService(JobService(w.jobs, w.tenants, clock=w.clock), logs, None)


def test_the_route_serves_a_cloud_attempt_from_its_batch_stream() -> None:
    w, logs = CloudWorld(), FakeLogReader()
    svc = _service(w, logs)
    job, _, bid = _submitted(w)
    waiting = svc.logs(ALICE, job.id)
    assert waiting["events"] == [] and waiting["next_token"] is None and waiting["status"] == "STARTING"
    assert waiting["reason"] == STREAM_PENDING_REASON.format(attempt=1)
    base = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
    logs.write(GROUP, STREAM, base, "hello from the cloud")
    logs.write(GROUP, f"{job.id}/1", base, "not where Batch writes")
    w.batch.set(bid, BatchStatus.RUNNING, log_stream=STREAM)
    w.cloud.on_event(bid, f"{job.id}-a1")
    page = svc.logs(ALICE, job.id)
    assert [e["message"] for e in page["events"]] == ["hello from the cloud"]
    assert page["reason"] is None and page["next_token"]
    with pytest.raises(NotFound):
        svc.logs(BOB, job.id)


def test_follow_keeps_polling_while_the_stream_is_unknown_then_reads_it() -> None:
    w, logs = CloudWorld(), FakeLogReader()
    svc = _service(w, logs)
    job, _, bid = _submitted(w)
    polls: list[float] = []

    class Api:
        def logs(self, job_id: str, **kw: Any) -> Any:
            kw.pop("limit", None)
            page = svc.logs(ALICE, job_id, kw.get("attempt"), None, 200, kw.get("next_token"))
            if len(polls) == 1:  # the container starts, prints, and the job completes
                logs.write(GROUP, STREAM, 1, "line")
                w.batch.set(bid, BatchStatus.RUNNING, log_stream=STREAM)
                w.cloud.on_event(bid, f"{job.id}-a1")
                w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0)
                w.cloud.on_event(bid, f"{job.id}-a1")
                w.workflow.finalize(job.id, 1)
            return page

    pages = list(log_pages(Api(), job.id, follow=True, poll_s=0.01, sleep=polls.append))
    assert [e["message"] for p in pages for e in p["events"]] == ["line"]
    assert pages[0]["reason"] and pages[-1]["status"] == "COMPLETED" and len(polls) >= 2


def test_an_earlier_cloud_attempt_is_read_from_its_own_stream() -> None:
    w, logs = CloudWorld(), FakeLogReader()
    svc = _service(w, logs)
    job = w.place()
    recorded = job.run.with_log_stream(1, "batch/default/first")
    second = job.model_copy(update={"attempts": 2, "run": recorded, "version": job.version})
    w.jobs.update(second.updated(second.updated_at + timedelta(seconds=1)))
    logs.write(GROUP, "batch/default/first", 1, "attempt 1 output")
    page = svc.logs(ALICE, job.id, attempt=1)
    assert [e["message"] for e in page["events"]] == ["attempt 1 output"]
    assert svc.logs(ALICE, job.id, attempt=2)["reason"] == STREAM_PENDING_REASON.format(attempt=2)


def test_the_cli_says_why_nothing_is_shown_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth_tools.cli import observe_cmd

    def page(status: str, messages: list[str], reason: str | None) -> dict[str, Any]:
        events = [{"at": "t", "message": m, "attempt": 1} for m in messages]
        return {"attempt": 1, "attempts": 1, "status": status, "events": events, "reason": reason}

    pages = [
        page("STARTING", [], "waits"),
        page("STARTING", [], "waits"),
        page("COMPLETED", ["done"], None),
        page("COMPLETED", [], None),
    ]

    class Client:
        def logs(self, *a: Any, **kw: Any) -> Any:
            return pages.pop(0)

    monkeypatch.setattr(observe_cmd, "client_for", lambda *_a: Client())
    observe_cmd.logs("j-1", follow=True, poll_s=0.2)
    out = capsys.readouterr()
    assert out.out == "done\n" and out.err == "(waits)\n"
    assert not pages
