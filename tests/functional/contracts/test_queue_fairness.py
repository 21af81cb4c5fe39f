"""A queue that is fair at any depth, over both stores (the fakes and DynamoDB on moto): one tenant's
deep backlog never hides another tenant's job from the pass, the pass reads the heads of the
tenants' queues round-robin when they do not all fit in its read budget, says how many it did not
consider, and reads full items only for the jobs it places."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.status import JobStatus
from berth.logic.scheduler_service import SchedulerService
from berth.logic.snapshot import QueueLimits
from berth.scheduler.explain import not_considered
from tests.unit.test_workflow_services import NOW

from .conftest import Store
from .test_scheduler_service import _world


def _spec(gpus: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "A100", "gpus": gpus},
        }
    )


def _jobs(tenant: str, n: int, gpus: int, start_ms: int = 0) -> list[Job]:
    out = []
    for i in range(n):
        at = NOW + timedelta(milliseconds=start_ms + i)
        job, _ = new_job(new_job_id(at), tenant, "alice", _spec(gpus), at)
        out.append(job)
    return out


def _seed(store: Store, jobs: list[Job]) -> None:
    """Queued jobs as the API would leave them (job items and the tenants' active-job counters), in
    bulk: BatchWriteItem on DynamoDB (the contract of ``create`` is tested on its own)."""
    from tests.unit.fakes import FakeJobs

    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.tenant] = counts.get(job.tenant, 0) + 1
    if isinstance(store.jobs, FakeJobs):
        for job in jobs:
            store.jobs.jobs[job.id] = job
            store.jobs.history[job.id] = []
        for tenant, n in counts.items():
            item = store.jobs.table.tenant_item(tenant)
            item.update(active_jobs=item.get("active_jobs", 0) + n, directory="T")
        return
    from berth.dal.jobs import DynamoJobRepository
    from berth.dal.models import tenant_model
    from tests.functional.conftest import TABLES

    repo = store.jobs
    assert isinstance(repo, DynamoJobRepository)
    with repo._Job.batch_write() as batch:
        for job in jobs:
            batch.save(repo._row(job))
    Tenant = tenant_model(TABLES["BERTH_TENANTS_TABLE"])
    for tenant, n in counts.items():
        Tenant("TENANT#" + tenant).update(actions=[Tenant.active_jobs.add(n), Tenant.directory.set("T")])


def _limited(scheduler: SchedulerService, limits: QueueLimits) -> SchedulerService:
    return replace(scheduler, source=replace(scheduler.source, queue=limits))


@pytest.mark.parametrize("limited", [False, True])
def test_a_deep_backlog_never_hides_another_tenants_job(store: Store, limited: bool) -> None:
    """10,500 queued jobs of one team (each too big for the free GPU), then one job of another team:
    the next pass sees it and places it on the free GPU. Before the queue index, a pass read the
    10,000 oldest queued jobs of all teams and never saw it. On moto (slow per item) the same with a
    tenth of the jobs and of the read budget."""
    from tests.unit.fakes import FakeJobs

    scale = 1 if isinstance(store.jobs, FakeJobs) else 10
    scheduler, _, _ = _world(store, gpus_per_host=1, hosts=1)
    budget = 10_000 // scale  # the old MAX_JOBS_PER_STATUS
    if limited:
        scheduler = _limited(scheduler, QueueLimits(read_budget=budget))
    deep = 10_500 // scale
    _seed(store, _jobs("deep", deep, gpus=2))
    [late] = _jobs("late", 1, gpus=1, start_ms=deep + 1)
    _seed(store, [late])
    report = scheduler.run_pass()
    placed = store.jobs.get(late.id)
    assert placed is not None and placed.status is JobStatus.STARTING
    assert report.placed == 1
    if limited:  # the head of the deep queue, and the late job
        assert report.pending == budget and report.not_considered == deep - (budget - 1)
    else:  # the default budget (20,000) holds the whole backlog
        assert report.pending == deep + 1 and report.not_considered == 0


def test_past_the_read_budget_every_tenant_keeps_its_head(store: Store) -> None:
    scheduler, _, _ = _world(store, gpus_per_host=1, hosts=1)
    scheduler = _limited(scheduler, QueueLimits(read_budget=30, min_head=5))
    _seed(store, _jobs("deep", 200, gpus=2))
    [late] = _jobs("late", 1, gpus=1, start_ms=500)
    _seed(store, [late])
    inputs = scheduler.source.pass_inputs()
    read = {e.job_id for e in inputs.pending}
    assert late.id in read
    # the shallow queue's unused share went to the deep one: the whole budget was read
    assert len(read) == 30
    assert inputs.snapshot.unread == {"deep": 200 - 29}
    report = scheduler.run_pass()
    assert report.placed == 1 and report.not_considered == 200 - 29
    moved = store.jobs.get(late.id)
    assert moved is not None and moved.status is JobStatus.STARTING


def test_more_tenants_than_fit_are_read_round_robin_and_explained(store: Store) -> None:
    scheduler, _, _ = _world(store, gpus_per_host=1, hosts=1)
    source = _limited(scheduler, QueueLimits(read_budget=4, min_head=2)).source
    tenants = ["t1", "t2", "t3", "t4", "t5"]
    for i, tenant in enumerate(tenants):
        _seed(store, _jobs(tenant, 3, gpus=2, start_ms=10 * i))
    seen: list[list[str]] = []
    for _ in range(4):
        inputs = source.pass_inputs()
        seen.append(sorted({e.tenant for e in inputs.pending}))
        assert len(inputs.pending) == 4
        # every tenant not read this pass, and the third job of each one read, is counted
        assert sum(inputs.snapshot.unread.values()) == 15 - 4
    assert seen == [["t1", "t2"], ["t3", "t4"], ["t1", "t5"], ["t2", "t3"]]
    # explain of a job the pass did not read names why, and how many were left out
    snapshot = source.pass_inputs().snapshot  # reads t4, t5
    why = not_considered(snapshot, "t1")
    assert why is not None and why["tenant_not_considered"] == 3 and why["not_considered"] == 11
    assert "not reached this pass" in why["summary"]
    assert not_considered(snapshot, "t4") is not None  # its third job
    assert not_considered(snapshot, "nobody") is None


def test_a_pass_reads_full_items_only_for_the_jobs_it_places(store: Store) -> None:
    from tests.unit.fakes import FakeJobs

    if not isinstance(store.jobs, FakeJobs):
        pytest.skip("only the fake counts its reads (BatchGetItem itself: test_queue_index_dynamo)")
    scheduler, _, _ = _world(store, gpus_per_host=2, hosts=2)
    _seed(store, _jobs("vision", 50, gpus=1))
    report = scheduler.run_pass()
    assert report.placed == 4 and report.pending == 50
    assert store.jobs.reads["get_many_keys"] == 4 and store.jobs.reads["get_many"] == 1


def test_reading_past_the_deadline_leaves_the_rest_to_the_next_pass(store: Store) -> None:
    """Each read of a tenant's head takes 'a second' (a clock advanced by the reads): with a 2.5 s
    deadline a pass reads three tenants' heads, and the next pass starts with the fourth."""
    from berth.logic.snapshot import QueueCursor, read_queue

    for i, tenant in enumerate(("a", "b", "c", "d", "e")):
        _seed(store, _jobs(tenant, 2, gpus=1, start_ms=10 * i))
    t = [0.0]
    real = store.jobs.queue_head

    class Slow:
        def __getattr__(self, name: str) -> object:
            return getattr(store.jobs, name)

        def queue_head(self, tenant: str, limit: int) -> object:
            t[0] += 1.0
            return real(tenant, limit)

    limits = QueueLimits(read_budget=100, min_head=10, read_deadline_s=2.5)
    cursor = QueueCursor()
    first = read_queue(Slow(), limits, cursor, {}, lambda: t[0])  # type: ignore[arg-type]
    assert sorted({e.tenant for e in first.entries}) == ["a", "b", "c"]
    assert first.skipped_tenants == ("d", "e") and first.unread == {"d": 2, "e": 2}
    second = read_queue(Slow(), limits, cursor, {}, lambda: t[0])  # type: ignore[arg-type]
    assert sorted({e.tenant for e in second.entries}) == ["a", "d", "e"]
