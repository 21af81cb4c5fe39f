"""JobRepository contract: conditional writes, the active-job counter, history, pages, isolation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import Conflict, InvalidRequest, QuotaExceeded
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement, HostGpus, OnPremPlacement, Site
from berth.domain.status import JobStatus
from tests.functional.contracts.conftest import Store

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = JobSpec.model_validate(
    {"name": "r", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "V100", "gpus": 2}}
)
ALICE = "arn:aws:iam::123456789012:user/alice"


def _new(store: Store, tenant: str = "vision", i: int = 0, max_active: int = 100) -> Job:
    now = T0 + timedelta(seconds=i)
    job, ev = new_job(new_job_id(now), tenant, ALICE, SPEC, now)
    store.jobs.create(job, ev, max_active=max_active)
    return job


def test_create_get_round_trip(store: Store) -> None:
    job = _new(store)
    assert store.jobs.get(job.id) == job
    assert store.jobs.get("j-missing") is None
    [ev] = store.jobs.events(job.id)
    assert ev.seq == 1 and ev.from_ is None and ev.to is JobStatus.QUEUED


def test_duplicate_create_is_a_conflict_and_counts_once(store: Store) -> None:
    job = _new(store)
    again, ev = new_job(job.id, "vision", ALICE, SPEC, T0)
    with pytest.raises(Conflict):
        store.jobs.create(again, ev, max_active=100)
    assert store.jobs.count_active("vision") == 1
    assert len(store.jobs.events(job.id)) == 1


def test_create_refuses_past_max_active_and_stores_nothing(store: Store) -> None:
    _new(store, i=0, max_active=2)
    _new(store, i=1, max_active=2)
    now = T0 + timedelta(seconds=2)
    job, ev = new_job(new_job_id(now), "vision", ALICE, SPEC, now)
    with pytest.raises(QuotaExceeded):
        store.jobs.create(job, ev, max_active=2)
    assert store.jobs.get(job.id) is None
    assert store.jobs.events(job.id) == []
    assert store.jobs.count_active("vision") == 2
    assert store.jobs.count_active("nlp") == 0


def test_save_moves_version_and_appends_history(store: Store) -> None:
    job = _new(store)
    placement = OnPremPlacement(pool="a", gpu_type="V100", hosts=(HostGpus(host_id="h1", gpus=2),))
    nxt, ev = job.transition(JobStatus.STARTING, "placed", T0, site=Site.ONPREM, placement=placement)
    store.jobs.save(nxt, ev)
    stored = store.jobs.get(job.id)
    assert stored == nxt and stored is not None and stored.placement == placement
    assert [e.to for e in store.jobs.events(job.id)] == [JobStatus.QUEUED, JobStatus.STARTING]


def test_cloud_placement_round_trips(store: Store) -> None:
    job = _new(store)
    placement = CloudPlacement(
        region="us-east-1", queue="q", instance_type="p3.8xlarge", gpu_type="V100", spot=True, hourly_usd=3.7
    )
    nxt, ev = job.transition(JobStatus.STARTING, "placed", T0, site=Site.CLOUD, placement=placement)
    store.jobs.save(nxt, ev)
    assert store.jobs.get(job.id) == nxt


def test_cloud_attempts_log_streams_round_trip_and_a_stale_copy_cannot_drop_them(store: Store) -> None:
    job = _new(store)
    placement = CloudPlacement(
        region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G", spot=False, hourly_usd=1.0
    )
    placed, ev = job.transition(
        JobStatus.STARTING, "placed", T0, site=Site.CLOUD, placement=placement, attempts=2
    )
    store.jobs.save(placed, ev)
    run = placed.run.with_log_stream(1, "batch/default/" + "a" * 32).with_log_stream(
        2, "batch/default/" + "b" * 32
    )
    recorded = placed.updated(T0, run=run)
    store.jobs.update(recorded)
    stored = store.jobs.get(job.id)
    assert stored == recorded and stored is not None
    assert stored.run.log_stream_of(1) == "batch/default/" + "a" * 32
    assert stored.run.log_stream_of(2) == "batch/default/" + "b" * 32
    with pytest.raises(Conflict):  # a copy read before the streams were recorded cannot write over them
        store.jobs.update(placed.updated(T0))
    assert store.jobs.get(job.id) == recorded


def test_stale_save_is_a_conflict_and_changes_nothing(store: Store) -> None:
    job = _new(store)
    first, ev1 = job.transition(JobStatus.STARTING, "placed", T0)
    store.jobs.save(first, ev1)
    stale, ev2 = job.transition(JobStatus.CANCELED, "late", T0)
    with pytest.raises(Conflict):
        store.jobs.save(stale, ev2)
    assert store.jobs.get(job.id) == first
    assert store.jobs.count_active("vision") == 1
    assert len(store.jobs.events(job.id)) == 2


def test_finishing_releases_the_active_count_once(store: Store) -> None:
    a, b = _new(store, i=0), _new(store, i=1)
    running, ev = a.transition(JobStatus.STARTING, "placed", T0)
    store.jobs.save(running, ev)
    done, ev = running.transition(JobStatus.FAILED, "x", T0)
    store.jobs.save(done, ev)
    assert store.jobs.count_active("vision") == 1
    canceled, ev = b.transition(JobStatus.CANCELED, "x", T0)
    store.jobs.save(canceled, ev)
    assert store.jobs.count_active("vision") == 0


def test_list_is_newest_first_paged_filtered_and_per_tenant(store: Store) -> None:
    ids = [_new(store, i=i).id for i in range(5)]
    other = _new(store, tenant="nlp", i=9)
    canceled, ev = store.jobs.get(ids[1]).transition(JobStatus.CANCELED, "x", T0)  # type: ignore[union-attr]
    store.jobs.save(canceled, ev)
    seen: list[str] = []
    token = None
    for _ in range(5):
        page = store.jobs.list_for_tenant("vision", None, 2, token)
        assert len(page.jobs) <= 2
        seen += [j.id for j in page.jobs]
        token = page.next_token
        if token is None:
            break
    assert seen == ids[::-1] and other.id not in seen
    queued = store.jobs.list_for_tenant("vision", JobStatus.QUEUED, 10, None)
    assert [j.id for j in queued.jobs] == [i for i in ids[::-1] if i != ids[1]]
    assert [j.id for j in store.jobs.list_for_tenant("nlp", None, 10, None).jobs] == [other.id]


def test_a_token_only_serves_its_own_query(store: Store) -> None:
    for i in range(3):
        _new(store, i=i)
        _new(store, tenant="nlp", i=i)
    token = store.jobs.list_for_tenant("vision", None, 1, None).next_token
    assert token is not None
    with pytest.raises(InvalidRequest):
        store.jobs.list_for_tenant("nlp", None, 1, token)
    with pytest.raises(InvalidRequest):
        store.jobs.list_for_tenant("vision", JobStatus.QUEUED, 1, token)
    with pytest.raises(InvalidRequest):
        store.jobs.list_for_tenant("vision", None, 1, "not-a-token")


def test_list_by_status_spans_tenants_oldest_first(store: Store) -> None:
    spec = JobSpec.model_validate({"name": "q", "image": "busybox", "command": ["true"]})
    base = datetime(2026, 12, 1, tzinfo=UTC)
    ids = []
    for i, tenant in enumerate(("vision", "nlp", "vision")):
        now = base + timedelta(seconds=i)
        job, ev = new_job(new_job_id(now), tenant, "arn:aws:iam::123456789012:user/x", spec, now)
        store.jobs.create(job, ev, max_active=10)
        ids.append(job.id)
    moved = store.jobs.get(ids[1])
    assert moved is not None
    nxt, ev = moved.transition(JobStatus.CANCELED, "canceled", base + timedelta(seconds=9))
    store.jobs.save(nxt, ev)
    assert [j.id for j in store.jobs.list_by_status(JobStatus.QUEUED, 10)] == [ids[0], ids[2]]
    assert [j.id for j in store.jobs.list_by_status(JobStatus.QUEUED, 1)] == [ids[0]]
    assert [j.id for j in store.jobs.list_by_status(JobStatus.CANCELED, 10)] == [ids[1]]
