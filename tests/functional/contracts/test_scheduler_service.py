"""The scheduler service over both stores (the fakes and DynamoDB on moto): two passes deciding from
the same snapshot give out no GPU twice, and a pass that dies half-way leaves a consistent store that
the next pass completes. Deterministic: the second pass applies after the first, from the snapshot
both read before either wrote (the worst interleaving the conditional writes must survive)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest

from berth.domain.fleet import HostInventory
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import OnPremPlacement
from berth.domain.status import JobStatus
from berth.logic.pass_apply import MAX_GROUP
from berth.logic.scheduler_service import SchedulerService
from berth.logic.snapshot import SnapshotSource
from berth.logic.workflow import WorkflowService, WorkflowSettings
from tests.unit.test_workflow_services import NOW, Clock, Queues, Tokens, Trigger

from .conftest import Store


def _world(
    store: Store, gpus_per_host: int = 4, hosts: int = 2, workers: int = 1
) -> tuple[SchedulerService, WorkflowService, Any]:
    clock = Clock()
    settings = WorkflowSettings(
        heartbeat_s=6, lease_s=60, outage_tolerance_s=60, fence_margin_s=30, orphan_grace_s=10
    )
    source = SnapshotSource(
        store.jobs, store.tenants, store.hosts, store.documents, clock, cloud_enabled=False
    )
    counter = iter(range(10**6))
    tokens = Tokens()
    scheduler = SchedulerService(
        source,
        store.jobs,
        store.hosts,
        tokens,
        Trigger(),
        clock,
        new_token=lambda: f"f{next(counter)}",
        settings=settings,
        placements=store.placements,
        apply_workers=workers,  # 1: a crash lands at a known point
    )
    workflow = WorkflowService(store.jobs, store.hosts, tokens, Queues(), clock, settings, random.Random(1))
    for i in range(hosts):
        store.hosts.register(
            HostInventory(
                host_id=f"h{i}",
                pool="default",
                gpu_type="A100",
                gpu_ids=tuple(f"GPU-h{i}-{g}" for g in range(gpus_per_host)),
                cpu=64,
                memory_gib=512,
            ),
            NOW + timedelta(minutes=5),
        )
    return scheduler, workflow, clock


def _submit(store: Store, gpus: int, i: int) -> Job:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "A100", "gpus": gpus},
        }
    )
    job, event = new_job(
        new_job_id(NOW + timedelta(milliseconds=i)), "vision", "alice", spec, NOW + timedelta(milliseconds=i)
    )
    store.jobs.create(job, event, max_active=1000)
    return job


def _held(store: Store) -> list[str]:
    return [g for h in store.hosts.list_hosts() for hold in h.holds.values() for g in hold.gpu_ids]


def test_two_passes_from_one_snapshot_give_no_gpu_twice(store: Store) -> None:
    scheduler, _, _ = _world(store)
    jobs = [_submit(store, g, i) for i, g in enumerate((3, 2, 2, 1, 4, 1))]
    snapshot = scheduler.source.pass_inputs()
    object.__setattr__(scheduler.source, "pass_inputs", lambda: snapshot)  # both decide from it
    first = scheduler.run_pass()
    second = scheduler.run_pass()
    held = _held(store)
    assert len(held) == len(set(held)) <= 8
    placed = [store.jobs.get(j.id) for j in jobs]
    started = [p for p in placed if p is not None and p.status is JobStatus.STARTING]
    assert first.placed == len(started) and second.placed == 0 and second.skipped == first.placed
    for p in started:
        assert p.attempts == 1 and isinstance(p.placement, OnPremPlacement)
        for h in p.placement.hosts:
            record = store.hosts.get(h.host_id)
            assert record is not None and record.holds[f"{p.id}#1"].gpu_ids == h.gpu_ids


@pytest.mark.parametrize("max_group", [1, MAX_GROUP])
def test_a_pass_dying_half_way_is_completed_by_the_next(store: Store, max_group: int) -> None:
    scheduler, _, _ = _world(store, gpus_per_host=8, hosts=1)
    object.__setattr__(scheduler, "max_group", max_group)
    a, b = _submit(store, 4, 0), _submit(store, 4, 1)

    def die(job: Job) -> None:
        raise RuntimeError("the pass died here")

    object.__setattr__(scheduler, "after_apply", die)
    with pytest.raises(RuntimeError):
        scheduler.run_pass()
    statuses = sorted(str(store.jobs.get(j.id).status) for j in (a, b))  # type: ignore[union-attr]
    if max_group == 1:  # one transaction per placement: the first applied, the second not
        assert statuses == ["QUEUED", "STARTING"] and len(_held(store)) == 4
    else:  # both on the one host: one transaction, applied whole
        assert statuses == ["STARTING", "STARTING"] and len(_held(store)) == 8
    object.__setattr__(scheduler, "after_apply", None)
    scheduler.run_pass()
    assert {store.jobs.get(j.id).status for j in (a, b)} == {JobStatus.STARTING}  # type: ignore[union-attr]
    held = _held(store)
    assert len(held) == len(set(held)) == 8


def test_a_lost_host_is_marked_once(store: Store) -> None:
    scheduler, _, clock = _world(store, hosts=1)
    clock.now = NOW + timedelta(minutes=6)  # past the 5 min lease, inside the 60 + 30 s after it
    assert scheduler.reap_lost_hosts(clock.now) == []
    clock.now = NOW + timedelta(minutes=6, seconds=31)
    assert scheduler.reap_lost_hosts(clock.now) == ["h0"]
    assert scheduler.reap_lost_hosts(clock.now) == []
    record = store.hosts.get("h0")
    assert record is not None and not record.healthy
