"""The run state's two parts: the job's own and the current attempt's, which a new placement replaces
whole; and the stored form of older versions (the attempt's fields at the top level) still loads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.cost import CostRates
from berth.domain.job import new_job
from berth.domain.job_spec import JobSpec
from berth.domain.placement import HostGpus, OnPremPlacement
from berth.domain.status import JobStatus
from berth.domain.workflow import AttemptLogStream, AttemptState, Failure, RunState
from berth.logic.pass_apply import placed_job
from berth.scheduler.decisions import OnPremAssignment

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)

#: A run state as the code before AttemptState stored it (``model_dump(mode="json",
#: exclude_defaults=True)`` of the flat model), every field set.
OLD_FORM = {
    "execution": "arn:aws:states:us-east-1:123456789012:execution:berth:j-1",
    "placement_token": "ptok",
    "dispatch_token": "dtok",
    "fencing_token": "fence",
    "claimed": ["h1", "h2"],
    "started": ["h1"],
    "succeeded": [],
    "started_at": "2026-12-01T11:00:00Z",
    "stop": "preempted by a higher priority job",
    "stop_failure": "CostLimit",
    "counted_failures": 1,
    "free_api_failures": 2,
    "excluded_hosts": ["h9"],
    "excluded_regions": ["us-west-2"],
    "last_failure": "HostLost (transient): gone",
    "cost_done_usd": 1.25,
    "cost_at": "2026-12-01T11:30:00Z",
    "batch_job_id": "b-1",
    "submitted_at": "2026-12-01T10:59:00Z",
    "log_streams": [{"attempt": 1, "stream": "batch/default/abc"}],
}


def test_the_old_flat_form_loads_into_the_two_parts() -> None:
    run = RunState.model_validate(OLD_FORM)
    assert run.execution == OLD_FORM["execution"] and run.placement_token == "ptok"
    assert (run.counted_failures, run.free_api_failures, run.cost_done_usd) == (1, 2, 1.25)
    assert run.excluded_hosts == ("h9",) and run.excluded_regions == ("us-west-2",)
    assert run.last_failure == "HostLost (transient): gone"
    assert run.log_streams == (AttemptLogStream(attempt=1, stream="batch/default/abc"),)
    assert run.attempt == AttemptState(
        fencing_token="fence",
        dispatch_token="dtok",
        claimed=("h1", "h2"),
        started=("h1",),
        started_at=datetime(2026, 12, 1, 11, tzinfo=UTC),
        stop="preempted by a higher priority job",
        stop_failure=Failure.COST_LIMIT,
        cost_at=datetime(2026, 12, 1, 11, 30, tzinfo=UTC),
        batch_job_id="b-1",
        submitted_at=datetime(2026, 12, 1, 10, 59, tzinfo=UTC),
    )
    # Written back in the new form, it reads the same.
    stored = run.model_dump(mode="json", exclude_defaults=True)
    assert "fencing_token" not in stored and stored["attempt"]["fencing_token"] == "fence"
    assert RunState.model_validate(stored) == run


def test_an_old_form_with_only_job_level_fields_needs_no_attempt() -> None:
    run = RunState.model_validate({"placement_token": "ptok", "counted_failures": 2})
    assert run.attempt == AttemptState() and run.counted_failures == 2


def test_a_fresh_run_state_is_stored_as_nothing() -> None:
    assert RunState().model_dump(mode="json", exclude_defaults=True) == {}
    assert RunState.model_validate({}) == RunState()


def test_unknown_fields_are_still_refused() -> None:
    with pytest.raises(ValueError, match="nonsense"):
        RunState.model_validate({"nonsense": 1})
    with pytest.raises(ValueError, match="nonsense"):
        RunState.model_validate({"attempt": {"nonsense": 1}})


def test_with_attempt_changes_the_attempt_and_refuses_a_misspelt_field() -> None:
    run = RunState(placement_token="p").with_attempt(stop="why", stop_failure=Failure.PREEMPTED)
    assert run.attempt.stop == "why" and run.placement_token == "p"
    with pytest.raises(TypeError, match="placement_token"):
        run.with_attempt(placement_token=None)  # the job's own field, not the attempt's


def test_placing_the_next_attempt_starts_from_a_fresh_attempt_state() -> None:
    spec = JobSpec.model_validate(
        {"name": "r", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "V100", "gpus": 1}}
    )
    job, _ = new_job("j-1", "vision", "alice", spec, NOW)
    ended = RunState.model_validate(OLD_FORM)
    retrying = job.model_copy(update={"status": JobStatus.QUEUED, "attempts": 1, "run": ended})
    assignment = OnPremAssignment("j-1", "vision", "a", "V100", (("h1", 1),), 4.0, 16.0)
    held = (HostGpus(host_id="h1", gpus=1, gpu_ids=("GPU-0",)),)
    placed, event = placed_job(retrying, assignment, NOW, held, CostRates(), "fence-2")
    assert placed.attempts == 2 and event.to is JobStatus.STARTING
    assert placed.run.attempt == AttemptState(fencing_token="fence-2")
    # The job's own part carries over.
    assert placed.run.model_copy(update={"attempt": ended.attempt}) == ended
    assert isinstance(placed.placement, OnPremPlacement)


def test_an_attempt_field_given_to_the_job_part_is_refused_not_lost() -> None:
    run = RunState()
    with pytest.raises(TypeError, match="with_attempt"):
        run.model_copy(update={"batch_job_id": "b-1"})
    assert run.model_copy(update={"counted_failures": 1}).counted_failures == 1
    assert run.with_attempt(batch_job_id="b-1").attempt.batch_job_id == "b-1"


def test_a_job_s_events_never_go_back_in_time() -> None:
    """A pass whose clock was read before the job was submitted (or a function whose clock is a
    little behind) stamps its move no earlier than the job's last change."""
    spec = {
        "name": "r",
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu_type": "V100", "gpus": 1},
    }
    job, queued = new_job("j-1", "vision", "alice", JobSpec.model_validate(spec), NOW)
    earlier = NOW - timedelta(milliseconds=32)
    starting, event = job.transition(JobStatus.STARTING, "placed", earlier)
    assert event.at == queued.at == starting.updated_at == NOW
    later = NOW + timedelta(seconds=1)
    running, event = starting.transition(JobStatus.RUNNING, "running", later)
    assert event.at == running.updated_at == later
    _, noted = running.noted("still here", NOW)
    assert noted.at == later
