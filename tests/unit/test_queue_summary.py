"""A pass keeps each team's queue (positions, estimated starts from the core's forecast) in one summary
item, rewritten only when it changed; the job API reads it for queued jobs (``with_queue``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from berth.domain.queue_summary import MAX_PLACES, QueuePlace, QueueSummary, summarize
from berth.domain.status import JobStatus
from berth.logic.queue_view import with_queue
from tests.unit.fakes import FakeQueueSummaries
from tests.unit.test_workflow_services import World


def world() -> tuple[World, FakeQueueSummaries]:
    w = World(hosts=1, gpus=8)
    summaries = FakeQueueSummaries()
    w.scheduler = replace(w.scheduler, queue_summaries=summaries)
    return w, summaries


def test_a_pass_records_positions_and_an_unchanged_queue_is_not_rewritten() -> None:
    w, summaries = world()
    running = w.submit(gpus=8, expected_duration_minutes=30)
    w.run_to_running(running)
    waiting = []
    for _ in range(3):
        w.clock.now += timedelta(seconds=1)
        waiting.append(w.submit(gpus=8))
    report = w.scheduler.run_pass()
    assert report.queue_summaries_written == 1 and summaries.writes == 1
    summary = summaries.get("vision")
    assert summary is not None and summary.waiting == 3
    assert [summary.places[j.id].position for j in waiting] == [1, 2, 3]
    first = summary.places[waiting[0].id]
    # the running job is predicted to end 30 minutes after it started
    assert first.basis == "onprem" and first.estimated_start is not None
    assert abs((first.estimated_start - (w.clock.now + timedelta(minutes=30))).total_seconds()) <= 60
    # the next pass sees the same queue: no write
    w.clock.now += timedelta(seconds=2)
    assert w.scheduler.run_pass().queue_summaries_written == 0 and summaries.writes == 1
    # the API answer of a queued job carries its place; another status carries none
    ids = (waiting[0].id, waiting[1].id, running.id)
    jobs = with_queue([w.job(i).public() for i in ids], summaries)
    assert jobs[0]["queue_position"] == 1 and jobs[0]["queue_length"] == 3
    assert jobs[0]["estimated_start"] is not None and jobs[0]["estimated_start_basis"] == "onprem"
    # the second needs the GPUs of a second job's end, and no other job runs: no estimate
    assert jobs[1]["queue_position"] == 2 and jobs[1]["estimated_start"] is None
    assert jobs[2]["status"] == str(JobStatus.RUNNING) and jobs[2]["queue_position"] is None


def test_a_queue_that_empties_is_written_empty_once() -> None:
    w, summaries = world()
    w.run_to_running(w.submit(gpus=8))
    job = w.submit(gpus=8)
    w.scheduler.run_pass()
    assert summaries.get("vision") is not None and summaries.get("vision").waiting == 1  # type: ignore[union-attr]
    w.jobs.save(*w.job(job.id).transition(JobStatus.CANCELED, "canceled", w.clock()))
    w.scheduler.run_pass()
    empty = summaries.get("vision")
    assert empty is not None and empty.waiting == 0 and not empty.places
    writes = summaries.writes
    w.scheduler.run_pass()
    assert summaries.writes == writes


def test_a_store_that_fails_leaves_the_pass_and_the_api_answer_intact() -> None:
    w, summaries = world()
    w.run_to_running(w.submit(gpus=8))
    job = w.submit(gpus=8)
    summaries.fail_writes = True
    report = w.scheduler.run_pass()
    assert report.queue_summaries_written == 0
    # not remembered as written: the next pass writes it once the store is back
    summaries.fail_writes = False
    assert w.scheduler.run_pass().queue_summaries_written == 1
    assert with_queue([w.job(job.id).public()], summaries)[0]["queue_position"] == 1
    # a job the last pass did not rank (submitted since) has the team's length but no place
    later = w.submit(gpus=8)
    view = with_queue([w.job(later.id).public()], summaries)[0]
    assert view["queue_position"] is None and view["queue_length"] == 1


def test_a_summary_keeps_the_head_estimates_to_the_minute_and_round_trips() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    rows = [(f"j-{i}", i + 1, now.timestamp() + 89.0, "onprem") for i in range(MAX_PLACES + 50)]
    summary = summarize("vision", rows, unread=7, now=now)
    assert len(summary.places) == MAX_PLACES and summary.waiting == MAX_PLACES + 57
    assert summary.places["j-0"] == QueuePlace(1, now + timedelta(seconds=60), "onprem")
    again = QueueSummary.from_item("vision", summary.to_item())
    assert again == summary and again.same_as(summary)
    assert not summarize("vision", rows[:3], 0, now).same_as(summary)
