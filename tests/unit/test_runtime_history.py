"""The service learns run times as ``berth sim`` models it: a completed run is observed into its
tenant's history, and the next pass's snapshot predicts from it (over the fakes, which pass the
same contract suite as DynamoDB). Finalize only completes the job: its COMPLETED event carries the
run (``observation_of``), which the job-events stream's consumer learns (``learn``;
tests/unit/test_runtime_learning.py, tests/functional/test_runtime_learning.py)."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import timedelta

from berth.domain.run_observation import RunObservation, completed_run, observation_of
from berth.domain.status import JobStatus
from berth.logic.runtimes import learn, observed
from berth.logic.workflow import WorkflowService
from berth.scheduler.predictor import Source
from tests.unit.fakes import FakeRuntimeHistory
from tests.unit.test_workflow_services import World


def world_with_history() -> tuple[World, FakeRuntimeHistory]:
    w = World(hosts=1, gpus=8)
    history = FakeRuntimeHistory()
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


def streamed(w: World, job_id: str) -> list[RunObservation]:
    """What the job-events stream's consumer reads of the job's rows (dal/job_stream.py): the run of
    its COMPLETED event, none of the others."""
    job = w.job(job_id)
    found = [observation_of(job, e) for e in w.jobs.events(job_id)]
    return [r for r in found if r is not None]


def test_finalize_does_not_learn_the_run_itself() -> None:
    # issue 18: no history read-modify-write per job in the workflow; the stream's consumer learns.
    assert "runtimes" not in {f.name for f in fields(WorkflowService)}


def test_a_completed_run_teaches_the_next_pass_its_run_time() -> None:
    w, history = world_with_history()
    empty = w.source.snapshot()[0].runtimes  # nothing learnt yet: the timeout is all it knows
    assert empty is not None
    first = empty.predict("vision", "resnet", "A100", 1, None, 86400.0)
    assert first is not None and first.source is Source.TIMEOUT
    runs = [r for seconds in (300.0, 330.0, 360.0) for r in streamed(w, run_for(w, seconds, name="resnet"))]
    assert [r.actual_s for r in runs] == [300.0, 330.0, 360.0]
    assert history.read(["vision"]) == {}  # finalize learnt nothing
    assert learn(history, runs).runs == 3  # the stream's consumer, one batch
    assert history.read(["vision"])["vision"]["observed"] == 3
    w.submit(name="resnet")  # the histories read are those of the tenants with jobs
    learnt = w.source.snapshot()[0].runtimes
    assert learnt is not None
    rt = learnt.predict("vision", "resnet", "A100", 1, None, 86400.0)
    assert rt is not None and rt.source is Source.HISTORY
    assert 300.0 <= rt.quantile(0.5) <= 360.0


def test_a_finalize_retried_after_the_completion_writes_no_second_completed_event() -> None:
    w, _ = world_with_history()
    job_id = run_for(w, 120.0, name="bert")
    w.workflow.finalize(job_id, 1)
    assert len(streamed(w, job_id)) == 1


def test_only_the_move_to_completed_carries_a_run() -> None:
    w, _ = world_with_history()
    job = w.submit(name="gpt")
    w.run_to_running(job)
    w.clock.now += timedelta(seconds=60)
    w.workflow.finalize(job.id, 1)
    events = w.jobs.events(job.id)
    done = w.job(job.id)
    carried = [e.to for e in events if observation_of(done, e) is not None]
    assert carried == [JobStatus.COMPLETED] and len(events) > 1
    w.register("h0", 8)  # the host's lease, renewed
    failed = w.submit(name="gpt")
    w.run_to_running(failed)
    w.workflow.classify_failure(failed.id, 1, "Berth.NonZeroExit", "exit 1")
    ended = w.job(failed.id)
    assert ended.status is not JobStatus.COMPLETED
    assert all(observation_of(ended, e) is None for e in w.jobs.events(failed.id))


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
