"""PlacementWriter contract: a placement's holds, job and event are written all together or not at all,
and no GPU is given out twice, however placements race. Run on the fakes and on DynamoDB (moto)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import Conflict
from berth.domain.fleet import HoldRequest, HostInventory, attempt_key
from berth.domain.job import Job, JobEvent, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import HostGpus, OnPremPlacement
from berth.domain.ports import PlacementWrite
from berth.domain.status import JobStatus
from tests.functional.contracts.conftest import Store

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _host(store: Store, host_id: str, gpus: int = 4) -> tuple[str, ...]:
    ids = tuple(f"GPU-{host_id}-{g}" for g in range(gpus))
    store.hosts.register(
        HostInventory(host_id=host_id, pool="p", gpu_type="A100", gpu_ids=ids, cpu=64, memory_gib=512),
        T0 + timedelta(hours=1),
    )
    return ids


def _queued(store: Store, i: int = 0) -> Job:
    spec = JobSpec.model_validate(
        {"name": "t", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "A100", "gpus": 2}}
    )
    job, event = new_job(new_job_id(T0 + timedelta(milliseconds=i)), "vision", "alice", spec, T0)
    store.jobs.create(job, event, max_active=1000)
    return job


def _placed(job: Job, holds: list[HoldRequest]) -> tuple[Job, JobEvent]:
    placement = OnPremPlacement(
        pool="p",
        gpu_type="A100",
        hosts=tuple(HostGpus(host_id=h.host_id, gpus=len(h.gpu_ids), gpu_ids=h.gpu_ids) for h in holds),
    )
    return job.transition(
        JobStatus.STARTING, "placed", T0, site=placement.site, placement=placement, attempts=1
    )


def _held(store: Store) -> dict[str, list[str]]:
    return {
        h.host_id: sorted(g for x in h.holds.values() for g in x.gpu_ids) for h in store.hosts.list_hosts()
    }


def test_a_placement_writes_holds_job_and_event_together(store: Store) -> None:
    a, b = _host(store, "h1"), _host(store, "h2")
    job = _queued(store)
    holds = [HoldRequest("h1", a[:2], 4, 32, T0), HoldRequest("h2", b[1:3], 4, 32, T0)]
    nxt, event = _placed(job, holds)
    store.placements.place(nxt, event, attempt_key(job.id, 1), holds)
    stored = store.jobs.get(job.id)
    assert stored is not None and stored.status is JobStatus.STARTING and stored.version == nxt.version
    assert [e.to for e in store.jobs.events(job.id)] == [JobStatus.QUEUED, JobStatus.STARTING]
    h1, h2 = store.hosts.get("h1"), store.hosts.get("h2")
    assert h1 is not None and h2 is not None
    assert h1.holds[f"{job.id}#1"].gpu_ids == a[:2] and h1.free_gpu_ids == a[2:]
    assert h2.holds[f"{job.id}#1"].gpu_ids == b[1:3] and h2.free_gpu_ids == (b[0], b[3])
    assert h1.holds[f"{job.id}#1"].cpu == 4 and h1.holds[f"{job.id}#1"].at == T0


@pytest.mark.parametrize("fault", ["gpu-taken", "job-moved", "unknown-host", "attempt-holds", "not-its-gpu"])
def test_a_placement_that_fails_a_condition_writes_nothing(store: Store, fault: str) -> None:
    a, b = _host(store, "h1"), _host(store, "h2")
    job = _queued(store)
    key = attempt_key(job.id, 1)
    second = ("h3", ("GPU-h3-0",)) if fault == "unknown-host" else ("h2", b[:2])
    if fault == "not-its-gpu":
        second = ("h2", ("GPU-h1-3", b[0]))
    holds = [HoldRequest("h1", a[:2], 1, 1), HoldRequest(second[0], second[1], 1, 1)]
    if fault == "gpu-taken":
        store.hosts.hold("h2", "j-other#1", b[1:2], 1, 1)
    if fault == "attempt-holds":
        store.hosts.hold("h2", key, b[3:], 1, 1)
    if fault == "job-moved":
        store.jobs.update(job.updated(T0, reason="someone else wrote it"))
    before = _held(store)
    nxt, event = _placed(job, holds)
    with pytest.raises(Conflict):
        store.placements.place(nxt, event, key, holds)
    assert _held(store) == before  # not even the first host's hold
    stored = store.jobs.get(job.id)
    assert stored is not None and stored.status is JobStatus.QUEUED
    assert [e.to for e in store.jobs.events(job.id)] == [JobStatus.QUEUED]


def test_a_placement_naming_a_host_twice_is_refused(store: Store) -> None:
    a = _host(store, "h1")
    job = _queued(store)
    holds = [HoldRequest("h1", a[:1], 1, 1), HoldRequest("h1", a[1:2], 1, 1)]
    nxt, event = _placed(job, holds)
    with pytest.raises(ValueError):
        store.placements.place(nxt, event, attempt_key(job.id, 1), holds)
    assert _held(store) == {"h1": []}


def test_placements_written_together_share_each_host_update(store: Store) -> None:
    a, b = _host(store, "h1"), _host(store, "h2")
    jobs = [_queued(store, i) for i in range(3)]
    holds = [
        [HoldRequest("h1", a[:2], 2, 16, T0)],
        [HoldRequest("h1", a[2:], 2, 16, T0)],
        [HoldRequest("h2", b[:2], 2, 16, T0)],
    ]
    writes = [
        PlacementWrite(*_placed(j, h), attempt_key(j.id, 1), h) for j, h in zip(jobs, holds, strict=True)
    ]
    version = store.hosts.get("h1").version  # type: ignore[union-attr]
    store.placements.place_many(writes)
    h1, h2 = store.hosts.get("h1"), store.hosts.get("h2")
    assert h1 is not None and h2 is not None
    assert h1.holds[f"{jobs[0].id}#1"].gpu_ids == a[:2] and h1.holds[f"{jobs[1].id}#1"].gpu_ids == a[2:]
    assert h1.free_gpu_ids == () and h2.free_gpu_ids == b[2:]
    assert h1.version == version + 1  # one update of the host for both holds
    for job in jobs:
        stored = store.jobs.get(job.id)
        assert stored is not None and stored.status is JobStatus.STARTING
        assert [e.to for e in store.jobs.events(job.id)] == [JobStatus.QUEUED, JobStatus.STARTING]


@pytest.mark.parametrize("fault", ["gpu-taken", "job-moved", "same-gpu-twice"])
def test_placements_written_together_fail_together(store: Store, fault: str) -> None:
    a = _host(store, "h1")
    jobs = [_queued(store, i) for i in range(2)]
    second = a[1:3] if fault == "same-gpu-twice" else a[2:]
    holds = [[HoldRequest("h1", a[:2], 1, 1)], [HoldRequest("h1", second, 1, 1)]]
    if fault == "gpu-taken":
        store.hosts.hold("h1", "j-other#1", a[3:], 1, 1)
    if fault == "job-moved":
        store.jobs.update(jobs[1].updated(T0, reason="someone else wrote it"))
    before = _held(store)
    writes = [
        PlacementWrite(*_placed(j, h), attempt_key(j.id, 1), h) for j, h in zip(jobs, holds, strict=True)
    ]
    with pytest.raises(Conflict):
        store.placements.place_many(writes)
    assert _held(store) == before
    for job in jobs:
        stored = store.jobs.get(job.id)
        assert stored is not None and stored.status is JobStatus.QUEUED


@pytest.fixture
def serializable() -> Iterator[None]:
    """DynamoDB applies each write atomically; moto interleaves concurrent ones unless the local
    cloud's isolation is installed (see test_host_repository)."""
    from berth_tools.localcloud import dynamodb_isolation

    undo = dynamodb_isolation.install()
    yield
    undo()


def test_racing_placements_never_give_a_gpu_twice(store: Store, serializable: None) -> None:
    a, b = _host(store, "h1"), _host(store, "h2")
    jobs = [_queued(store, i) for i in range(8)]
    won: list[str] = []
    barrier = threading.Barrier(len(jobs))

    def place(i: int, job: Job) -> None:
        # Every placement wants two GPUs of h1 (one of two pairs) and two of h2.
        holds = [
            HoldRequest("h1", a[i % 2 * 2 : i % 2 * 2 + 2], 1, 1),
            HoldRequest("h2", b[i % 2 * 2 : i % 2 * 2 + 2], 1, 1),
        ]
        nxt, event = _placed(job, holds)
        barrier.wait()
        try:
            store.placements.place(nxt, event, attempt_key(job.id, 1), holds)
            won.append(job.id)
        except Conflict:
            pass

    threads = [threading.Thread(target=place, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= len(won) <= 2
    held = _held(store)
    assert all(len(g) == len(set(g)) == 2 * len(won) for g in held.values())
    started = [j.id for j in jobs if store.jobs.get(j.id).status is JobStatus.STARTING]  # type: ignore[union-attr]
    assert sorted(started) == sorted(won)
