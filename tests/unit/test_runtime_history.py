"""The service learns run times as ``berth sim`` models it: a completed run is observed into its
tenant's history, and the next pass's snapshot predicts from it (over the fakes, which pass the
same contract suite as DynamoDB)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from berth.domain.status import JobStatus
from berth.logic.runtimes import RunObservation, completed_run, observed
from berth.scheduler.predictor import Source
from tests.unit.fakes import FakeRuntimeHistory
from tests.unit.test_workflow_services import World, _host, _ref


def world_with_history() -> tuple[World, FakeRuntimeHistory]:
    w = World(hosts=1, gpus=8)
    history = FakeRuntimeHistory()
    w.workflow = replace(w.workflow, runtimes=history)
    w.source = replace(w.source, runtimes=history)
    w.scheduler = replace(w.scheduler, source=w.source)
    return w, history


def run_for(w: World, seconds: float, **spec: object) -> str:
    w.register("h0", 8)  # the host's lease, renewed (the clock jumps by whole runs here)
    job = w.submit(**spec)
    running, _ = w.run_to_running(job)
    w.clock.now += timedelta(seconds=seconds)
    w.workflow.finalize(job.id, running.attempts)
    assert w.job(job.id).status is JobStatus.COMPLETED
    return job.id


def test_a_completed_run_teaches_the_next_pass_its_run_time() -> None:
    w, history = world_with_history()
    empty = w.source.snapshot()[0].runtimes  # nothing learnt yet: the timeout is all it knows
    assert empty is not None
    first = empty.predict("vision", "resnet", "A100", 1, None, 86400.0)
    assert first is not None and first.source is Source.TIMEOUT
    for seconds in (300.0, 330.0, 360.0):
        run_for(w, seconds, name="resnet")
    assert history.read(["vision"])["vision"]["observed"] == 3
    w.submit(name="resnet")  # the histories read are those of the tenants with jobs
    learnt = w.source.snapshot()[0].runtimes
    assert learnt is not None
    rt = learnt.predict("vision", "resnet", "A100", 1, None, 86400.0)
    assert rt is not None and rt.source is Source.HISTORY
    assert 300.0 <= rt.quantile(0.5) <= 360.0


def test_a_finalize_retried_after_the_completion_learns_nothing_twice() -> None:
    w, history = world_with_history()
    job_id = run_for(w, 120.0, name="bert")
    w.workflow.finalize(job_id, 1)
    assert history.read(["vision"])["vision"]["observed"] == 1


def test_the_job_completes_even_when_the_history_cannot_be_written() -> None:
    w, history = world_with_history()
    history.fail_writes = True
    job = w.submit(name="gpt")
    running, host = w.run_to_running(job)
    assert host == _host(running) and _ref(running).attempt == 1
    w.clock.now += timedelta(seconds=60)
    w.workflow.finalize(job.id, 1)
    assert w.job(job.id).status is JobStatus.COMPLETED
    assert history.read(["vision"]) == {}


def test_what_a_run_teaches_is_its_spec_and_its_last_attempts_run() -> None:
    w, _ = world_with_history()
    job = w.submit(name="vit", expected_duration_minutes=10)
    assert completed_run(w.job(job.id), w.clock.now) is None  # never started
    running, _ = w.run_to_running(job)
    run = completed_run(running, w.clock.now + timedelta(seconds=90))
    assert run == RunObservation("vision", "vit", "A100", 1, 90.0, 600.0)


def test_the_history_stays_bounded_but_the_tenant_level_keeps_learning() -> None:
    doc = None
    for i in range(20):  # each new family adds two keys beside the tenant's own
        doc = observed(doc, RunObservation("vision", f"f{i}", "A100", 1, 100.0, None), max_levels=9)
    assert doc is not None and doc["observed"] == 20
    levels = dict((k, v) for k, v in doc["levels"])
    assert len(levels) == 9  # the tenant and four families
    assert levels["vision"][0] == 20  # LogStats.to_list: the count first
    assert "vision\x1ff3" in levels and "vision\x1ff4" not in levels
