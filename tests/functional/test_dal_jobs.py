"""The DynamoDB job repository on moto: conditional writes, atomic history, races."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from berth.dal.jobs import DynamoJobRepository
from berth.domain.errors import Conflict
from berth.domain.job import new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.status import JobStatus
from tests.functional.conftest import TABLES

T0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
SPEC = JobSpec.model_validate({"name": "r", "image": "busybox", "command": ["true"]})


@pytest.fixture
def serializable() -> Iterator[None]:
    """DynamoDB applies each transaction atomically and in isolation; moto does not (concurrent
    TransactWriteItems interleave). The local cloud restores that guarantee; so do these racing
    tests, so that they check our conditions rather than moto's missing lock."""
    from berth_tools.localcloud import dynamodb_isolation

    undo = dynamodb_isolation.install()
    yield
    undo()


@pytest.fixture
def repo(aws: None) -> DynamoJobRepository:
    return DynamoJobRepository(
        TABLES["BERTH_JOBS_TABLE"], TABLES["BERTH_JOB_EVENTS_TABLE"], TABLES["BERTH_TENANTS_TABLE"]
    )


def test_racing_updates_one_wins_history_stays_consistent(repo: DynamoJobRepository) -> None:
    job, ev = new_job(new_job_id(T0), "vision", "alice", SPEC, T0)
    repo.create(job, ev, max_active=100)
    # Two writers read version 1 and both try to move the job.
    placed, placed_ev = job.transition(JobStatus.STARTING, "placed on host-1", T0 + timedelta(seconds=1))
    canceled, canceled_ev = job.transition(JobStatus.CANCELED, "canceled", T0 + timedelta(seconds=1))
    repo.save(placed, placed_ev)
    with pytest.raises(Conflict):
        repo.save(canceled, canceled_ev)
    stored = repo.get(job.id)
    assert stored is not None and stored.status is JobStatus.STARTING and stored.version == 2
    assert [e.to for e in repo.events(job.id)] == [JobStatus.QUEUED, JobStatus.STARTING]


def test_concurrent_writers_exactly_one_succeeds(repo: DynamoJobRepository, serializable: None) -> None:
    job, ev = new_job(new_job_id(T0), "vision", "alice", SPEC, T0)
    repo.create(job, ev, max_active=100)
    wins: list[str] = []
    losses: list[str] = []
    barrier = threading.Barrier(6)

    def writer(i: int) -> None:
        nxt, e = job.transition(JobStatus.STARTING, f"placed by scheduler {i}", T0)
        barrier.wait()
        try:
            repo.save(nxt, e)
            wins.append(str(i))
        except Conflict:
            losses.append(str(i))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 5
    events = repo.events(job.id)
    assert len(events) == 2 and events[1].reason == f"placed by scheduler {wins[0]}"


def test_duplicate_create_is_a_conflict(repo: DynamoJobRepository) -> None:
    job, ev = new_job(new_job_id(T0), "vision", "alice", SPEC, T0)
    repo.create(job, ev, max_active=100)
    with pytest.raises(Conflict):
        repo.create(job, ev, max_active=100)


def test_count_active_and_round_trip(repo: DynamoJobRepository) -> None:
    for i in range(3):
        job, ev = new_job(
            new_job_id(T0 + timedelta(seconds=i)), "vision", "alice", SPEC, T0 + timedelta(seconds=i)
        )
        repo.create(job, ev, max_active=100)
    done, done_ev = job.transition(JobStatus.CANCELED, "x", T0)
    repo.save(done, done_ev)
    assert repo.count_active("vision") == 2
    assert repo.count_active("nlp") == 0
    assert repo.get(job.id) == done


def test_active_job_quota_holds_under_concurrent_submits(
    repo: DynamoJobRepository, serializable: None
) -> None:
    from berth.domain.errors import QuotaExceeded

    ok: list[str] = []
    refused: list[str] = []
    barrier = threading.Barrier(8)

    def submit(i: int) -> None:
        now = T0 + timedelta(milliseconds=i)
        job, ev = new_job(new_job_id(now), "vision", "alice", SPEC, now)
        barrier.wait()
        try:
            repo.create(job, ev, max_active=3)
            ok.append(job.id)
        except QuotaExceeded:
            refused.append(job.id)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 3 and len(refused) == 5
    assert repo.count_active("vision") == len(ok)
    stored = [j.id for j in repo.list_for_tenant("vision", None, 100, None).jobs]
    assert sorted(stored) == sorted(ok)


def test_a_job_stored_with_the_old_flat_run_state_loads_and_is_rewritten_nested(
    repo: DynamoJobRepository,
) -> None:
    """Items written before the run state had an ``attempt`` part keep loading (docs/workflow.md)."""
    job, ev = new_job(new_job_id(T0), "vision", "alice", SPEC, T0)
    repo.create(job, ev, max_active=100)
    row = repo.row_of(job)
    row.run = {"placement_token": "ptok", "fencing_token": "fence", "claimed": ["h1"], "counted_failures": 1}
    row.save()  # as the older code stored it
    loaded = repo.get(job.id)
    assert loaded is not None
    assert loaded.run.placement_token == "ptok" and loaded.run.counted_failures == 1
    assert loaded.run.attempt.fencing_token == "fence" and loaded.run.attempt.claimed == ("h1",)
    repo.update(loaded.updated(T0, run=loaded.run.with_attempt(stop="preempted")))
    stored = type(row).get(job.id).run  # the raw attribute, as written now
    assert stored == {
        "placement_token": "ptok",
        "counted_failures": 1,
        "attempt": {"fencing_token": "fence", "claimed": ["h1"], "stop": "preempted"},
    }
