"""JobRepository contract: conditional writes, the active-job counter, history, pages, isolation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.cost import AttemptUsage
from berth.domain.errors import Conflict, InvalidRequest, QuotaExceeded
from berth.domain.fleet import HoldRelease
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement, HostGpus, OnPremPlacement, Site
from berth.domain.queue import queue_entry
from berth.domain.status import JobStatus
from tests.functional.conftest import Calls
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


def test_since_is_part_of_the_query(store: Store) -> None:
    ids = [_new(store, i=i).id for i in range(5)]
    page = store.jobs.list_for_tenant("vision", None, 10, None, since=T0 + timedelta(seconds=3))
    assert [j.id for j in page.jobs] == [ids[4], ids[3]] and page.next_token is None
    queued = store.jobs.list_for_tenant("vision", JobStatus.QUEUED, 1, None, since=T0 + timedelta(seconds=3))
    assert [j.id for j in queued.jobs] == [ids[4]]


def test_all_tenants_merges_newest_first_across_tenants_page_by_page(store: Store) -> None:
    made = [_new(store, tenant=("vision", "nlp", "audio")[i % 3], i=i) for i in range(7)]
    seen: list[str] = []
    token = None
    for _ in range(10):
        page = store.jobs.list_all_tenants(None, 2, token)
        assert len(page.jobs) <= 2
        seen += [j.id for j in page.jobs]
        token = page.next_token
        if token is None:
            break
    assert seen == [j.id for j in made[::-1]]
    recent = store.jobs.list_all_tenants(None, 10, None, since=T0 + timedelta(seconds=5))
    assert [j.id for j in recent.jobs] == [made[6].id, made[5].id]
    paged = store.jobs.list_all_tenants(None, 1, None, since=T0 + timedelta(seconds=5))
    rest = store.jobs.list_all_tenants(None, 5, paged.next_token, since=T0 + timedelta(seconds=5))
    assert [j.id for j in paged.jobs + rest.jobs] == [made[6].id, made[5].id]
    canceled, ev = made[2].transition(JobStatus.CANCELED, "x", T0)
    store.jobs.save(canceled, ev)
    assert [j.id for j in store.jobs.list_all_tenants(JobStatus.CANCELED, 10, None).jobs] == [made[2].id]


def test_an_all_tenants_token_only_serves_its_own_query(store: Store) -> None:
    for i in range(3):
        _new(store, i=i)
    token = store.jobs.list_all_tenants(None, 1, None).next_token
    assert token is not None
    with pytest.raises(InvalidRequest):
        store.jobs.list_for_tenant("vision", None, 1, token)
    with pytest.raises(InvalidRequest):
        store.jobs.list_all_tenants(JobStatus.QUEUED, 1, token)
    one = store.jobs.list_for_tenant("vision", None, 1, None).next_token
    with pytest.raises(InvalidRequest):
        store.jobs.list_all_tenants(None, 1, one)


def _queue(store: Store, tenants: tuple[str, ...], spec: JobSpec = SPEC) -> list[str]:
    ids = []
    for i, tenant in enumerate(tenants):
        now = T0 + timedelta(seconds=i)
        job, ev = new_job(new_job_id(now), tenant, ALICE, spec, now)
        store.jobs.create(job, ev, max_active=1000)
        ids.append(job.id)
    return ids


def _move(store: Store, job_id: str, to: JobStatus, **changes: object) -> Job:
    job = store.jobs.get(job_id)
    assert job is not None
    nxt, ev = job.transition(to, str(to).lower(), job.updated_at + timedelta(seconds=1), **changes)  # type: ignore[arg-type]
    store.jobs.save(nxt, ev)
    return nxt


def test_queue_index_holds_queued_jobs_only_in_queue_order(store: Store) -> None:
    ids = _queue(store, ("vision", "nlp", "vision", "vision"))
    high = JobSpec.model_validate(
        {**SPEC.model_dump(mode="json", exclude_none=True), "constraints": {"priority": "high"}}
    )
    [urgent] = _queue(store, ("vision",), high)
    _move(store, ids[2], JobStatus.CANCELED)  # leaves the index in the job's own write
    head = store.jobs.queue_head("vision", 10)
    assert [e.job_id for e in head.entries] == [urgent, ids[0], ids[3]] and head.more is False
    first = store.jobs.queue_head("vision", 2)
    assert [e.job_id for e in first.entries] == [urgent, ids[0]] and first.more is True
    assert [e.job_id for e in store.jobs.queue_head("nlp", 10).entries] == [ids[1]]
    assert store.jobs.queue_head("other", 10).entries == []
    # the entry is what the core reads of the job, and its version and reason
    job = store.jobs.get(ids[0])
    assert job is not None
    assert head.entries[1] == queue_entry(job)


def test_queue_index_entry_follows_the_job_and_leaves_when_placed(store: Store) -> None:
    [job_id] = _queue(store, ("vision",))
    job = store.jobs.get(job_id)
    assert job is not None
    parked = job.updated(job.updated_at, run=job.run.model_copy(update={"placement_token": "tok"}))
    store.jobs.update(parked)
    [entry] = store.jobs.queue_head("vision", 5).entries
    assert entry.awaiting_execution is False and entry.version == parked.version
    where = OnPremPlacement(pool="p", gpu_type="V100", hosts=(HostGpus(host_id="h1", gpus=2),))
    _move(store, job_id, JobStatus.STARTING, site=Site.ONPREM, placement=where)
    assert store.jobs.queue_head("vision", 5).entries == []
    assert [j.id for j in store.jobs.list_placed(JobStatus.STARTING)] == [job_id]
    _move(store, job_id, JobStatus.RUNNING)
    assert store.jobs.list_placed(JobStatus.STARTING) == []
    assert [j.id for j in store.jobs.list_placed(JobStatus.RUNNING)] == [job_id]
    with pytest.raises(ValueError):
        store.jobs.list_placed(JobStatus.QUEUED)


def test_set_reason_writes_the_reason_alone_under_the_entry_version(store: Store) -> None:
    [job_id] = _queue(store, ("vision",))
    [entry] = store.jobs.queue_head("vision", 5).entries
    store.jobs.set_reason(entry, "waiting for placement (capacity): on-prem full")
    job = store.jobs.get(job_id)
    assert job is not None and job.reason.startswith("waiting for placement (capacity)")
    assert job.version == entry.version  # no new version: no other writer loses its update
    assert store.jobs.queue_head("vision", 5).entries[0].reason == job.reason
    _move(store, job_id, JobStatus.CANCELED)
    with pytest.raises(Conflict):
        store.jobs.set_reason(entry, "stale")
    ended = store.jobs.get(job_id)
    assert ended is not None and ended.reason == "canceled"


def test_queued_tenants_are_those_with_active_jobs(store: Store) -> None:
    ids = _queue(store, ("vision", "nlp", "vision"))
    assert store.jobs.queued_tenants() == {"nlp": 1, "vision": 2}
    _move(store, ids[1], JobStatus.CANCELED)
    assert store.jobs.queued_tenants() == {"vision": 2}


def test_get_many_reads_full_jobs_in_batches_of_100(store: Store) -> None:
    ids = _queue(store, ("vision",) * 130)
    found = store.jobs.get_many([*ids, "j-missing", ids[0]])
    assert set(found) == set(ids)
    assert found[ids[5]] == store.jobs.get(ids[5])
    assert store.jobs.get_many([]) == {}


# -- an ended attempt's usage record in the job's own write (issue 18) -----------------------------------
def _usage(job: Job, seconds: float) -> AttemptUsage:
    return AttemptUsage(
        tenant=job.tenant,
        month="2026-12",
        job_id=job.id,
        attempt=1,
        site=Site.CLOUD,
        location="us-east-1",
        gpus=2,
        seconds=seconds,
        hourly_usd=7.2,
        final=True,
    )


def test_save_stores_the_attempts_usage_with_the_job(store: Store) -> None:
    job = _new(store)
    running, ev = job.transition(JobStatus.STARTING, "placed", T0)
    store.jobs.save(running, ev)
    done, ev = running.transition(JobStatus.FAILED, "failed", T0)
    store.jobs.save(done, ev, _usage(done, 1800))
    assert store.jobs.get(job.id) == done and store.jobs.count_active("vision") == 0
    [record] = store.usage.month("vision", "2026-12")
    assert record.seconds == 1800 and record.final


def test_a_stored_record_of_more_run_time_stays_and_the_job_is_saved(store: Store) -> None:
    """The ledger's rule in the job's write: a final record of more run time is kept (a retried write
    of an earlier clock never lowers it), and the job's change is stored all the same."""
    job = _new(store)
    running, ev = job.transition(JobStatus.STARTING, "placed", T0)
    store.jobs.save(running, ev)
    assert store.usage.record(_usage(job, 2000))
    done, ev = running.transition(JobStatus.FAILED, "x", T0)
    store.jobs.save(done, ev, _usage(done, 1800))
    assert store.jobs.get(job.id) == done and len(store.jobs.events(job.id)) == 3
    [record] = store.usage.month("vision", "2026-12")
    assert record.seconds == 2000


def test_save_with_usage_is_one_transaction(store: Store, calls: Calls) -> None:
    if not hasattr(store.jobs, "_conn"):
        pytest.skip("only DynamoDB's calls are counted")
    job = _new(store)
    running, ev = job.transition(JobStatus.STARTING, "placed", T0)
    store.jobs.save(running, ev)
    calls.clear()
    done, ev = running.transition(JobStatus.FAILED, "failed", T0)
    store.jobs.save(done, ev, _usage(done, 1800))
    assert calls.operations() == ["TransactWriteItems"]


# -- an ended attempt's GPU holds, given back in the job's own write ---------------------------------
def _held(store: Store, job: Job) -> tuple[Job, HoldRelease]:
    from berth.domain.fleet import HostInventory, attempt_key

    inventory = HostInventory.model_validate(
        {"host_id": "h1", "pool": "default", "gpu_type": "V100", "gpu_ids": ["G0", "G1", "G2"], "cpu": 64,
         "memory_gib": 256}
    )  # fmt: skip
    store.hosts.register(inventory, T0 + timedelta(hours=1))
    key = attempt_key(job.id, 1)
    store.hosts.hold("h1", key, ("G0", "G1"), 8, 64)
    running, ev = job.transition(JobStatus.STARTING, "placed", T0)
    store.jobs.save(running, ev)
    return running, HoldRelease("h1", key, ("G0", "G1"))


def _free(store: Store) -> set[str]:
    rec = store.hosts.get("h1")
    assert rec is not None
    return set(rec.free_gpu_ids)


def test_save_gives_the_attempts_gpus_back_in_the_same_write(store: Store) -> None:
    running, release = _held(store, _new(store))
    assert _free(store) == {"G2"}
    done, ev = running.transition(JobStatus.FAILED, "failed", T0)
    store.jobs.save(done, ev, _usage(done, 60), (release,))
    rec = store.hosts.get("h1")
    assert rec is not None and release.attempt not in rec.holds and _free(store) == {"G0", "G1", "G2"}
    assert store.jobs.get(done.id) == done and store.jobs.count_active("vision") == 0


def test_a_hold_released_meanwhile_is_left_and_the_job_is_saved(store: Store) -> None:
    """The reaper (or a retried task) gave the GPUs back first, and one went to another attempt: the
    job's write neither fails nor frees that GPU again."""
    running, release = _held(store, _new(store))
    assert store.hosts.release("h1", release.attempt, release.gpu_ids)
    store.hosts.hold("h1", "j-other#1", ("G0",), 4, 32)
    done, ev = running.transition(JobStatus.FAILED, "failed", T0)
    store.jobs.save(done, ev, None, (release,))
    assert store.jobs.get(done.id) == done
    rec = store.hosts.get("h1")
    assert rec is not None and rec.holds["j-other#1"].gpu_ids == ("G0",) and _free(store) == {"G1", "G2"}


def test_a_save_that_loses_on_the_version_gives_nothing_back(store: Store) -> None:
    running, release = _held(store, _new(store))
    done, ev = running.transition(JobStatus.FAILED, "failed", T0)
    store.jobs.save(done, ev)
    again, ev2 = running.transition(JobStatus.RETRYING, "retrying", T0)  # from the same version
    with pytest.raises(Conflict):
        store.jobs.save(again, ev2, None, (release,))
    assert _free(store) == {"G2"} and store.jobs.get(done.id) == done


def test_save_with_usage_and_releases_is_one_transaction(store: Store, calls: Calls) -> None:
    if not hasattr(store.jobs, "_conn"):
        pytest.skip("only DynamoDB's calls are counted")
    running, release = _held(store, _new(store))
    calls.clear()
    done, ev = running.transition(JobStatus.FAILED, "failed", T0)
    store.jobs.save(done, ev, _usage(done, 60), (release,))
    assert calls.operations() == ["TransactWriteItems"]
