"""``update_job`` (read, change, write if unchanged) against both job repositories: a lost race is
decided again on the fresh version, an endless one gives up with JobKeptChanging, a change that
declines or refuses writes nothing, a missing job is JobMissing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import Conflict, Forbidden, NotFound
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.status import JobStatus
from berth.logic.job_update import (
    TRIES,
    Decision,
    JobKeptChanging,
    JobMissing,
    Keep,
    Save,
    Update,
    update_job,
)
from tests.functional.contracts.conftest import Store

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = JobSpec.model_validate(
    {"name": "r", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "V100", "gpus": 1}}
)


def _new(store: Store) -> Job:
    job, ev = new_job(new_job_id(T0), "vision", "arn:aws:iam::123456789012:user/alice", SPEC, T0)
    store.jobs.create(job, ev, max_active=100)
    return job


def _race(store: Store, job: Job) -> None:
    """Another writer moves the job between the helper's read and its write."""
    store.jobs.update(job.updated(job.updated_at + timedelta(seconds=1), reason=f"moved at v{job.version}"))


def test_a_lost_race_is_decided_again_on_the_fresh_version(store: Store) -> None:
    job = _new(store)
    seen: list[int] = []

    def start(current: Job) -> Decision[str]:
        seen.append(current.version)
        if len(seen) == 1:
            _race(store, current)
        nxt, event = current.transition(JobStatus.STARTING, "placed", T0)
        return Save(nxt, event, "placed")

    done = update_job(store.jobs, job.id, start, doing="placing")
    assert seen == [1, 2]  # the second decision saw the racing writer's version
    assert done.written and done.outcome == "placed"
    assert done.before.version == 2 and done.before.reason == "moved at v1"
    assert done.after.version == 3 and done.after.status is JobStatus.STARTING
    assert done.event is not None and done.event.seq == 3
    assert store.jobs.get(job.id) == done.after
    assert [e.to for e in store.jobs.events(job.id)] == [JobStatus.QUEUED, JobStatus.STARTING]


def test_an_update_writes_no_event(store: Store) -> None:
    job = _new(store)

    def park(current: Job) -> Decision:
        run = current.run.model_copy(update={"placement_token": "tok"})
        return Update(current.updated(current.updated_at, run=run))

    done = update_job(store.jobs, job.id, park, doing="parking")
    assert done.written and done.event is None and done.outcome is None
    stored = store.jobs.get(job.id)
    assert stored is not None and stored.version == 2 and stored.run.placement_token == "tok"
    assert len(store.jobs.events(job.id)) == 1


def test_a_job_that_never_settles_gives_up_after_the_retry_limit(store: Store) -> None:
    job = _new(store)
    calls = 0

    def cancel(current: Job) -> Decision:
        nonlocal calls
        calls += 1
        _race(store, current)
        nxt, event = current.transition(JobStatus.CANCELED, "canceled", T0)
        return Save(nxt, event)

    with pytest.raises(JobKeptChanging, match="kept changing while canceling") as raised:
        update_job(store.jobs, job.id, cancel, doing="canceling")
    assert isinstance(raised.value, Conflict)  # the API answers 409
    assert calls == TRIES
    stored = store.jobs.get(job.id)
    assert stored is not None and stored.status is JobStatus.QUEUED and stored.version == 1 + TRIES
    assert len(store.jobs.events(job.id)) == 1


def test_a_change_that_declines_writes_nothing(store: Store) -> None:
    job = _new(store)
    done = update_job(store.jobs, job.id, lambda current: Keep(f"already {current.status}"), doing="x")
    assert not done.written and done.event is None
    assert done.outcome == "already QUEUED"
    assert done.before == done.after == job
    assert store.jobs.get(job.id) == job


def test_a_change_that_refuses_raises_its_error_and_writes_nothing(store: Store) -> None:
    job = _new(store)

    def refuse(current: Job) -> Decision:
        raise Forbidden("not yours")

    with pytest.raises(Forbidden, match="not yours"):
        update_job(store.jobs, job.id, refuse, doing="x")
    assert store.jobs.get(job.id) == job


def test_a_missing_job_is_not_found_and_the_change_never_runs(store: Store) -> None:
    def change(current: Job) -> Decision:
        raise AssertionError("called")

    with pytest.raises(JobMissing, match="'j-missing' not found") as raised:
        update_job(store.jobs, "j-missing", change, doing="x")
    assert isinstance(raised.value, NotFound)


def test_a_stale_current_version_only_costs_one_lost_race(store: Store) -> None:
    job = _new(store)
    _race(store, job)
    seen: list[int] = []

    def note(current: Job) -> Decision:
        seen.append(current.version)
        return Update(current.updated(current.updated_at, reason="noted"))

    done = update_job(store.jobs, job.id, note, doing="noting", current=job)
    assert seen == [1, 2]
    assert done.after.version == 3 and store.jobs.get(job.id) == done.after
