"""FleetService and SnapshotSource over the in-memory fakes: what the scheduler is shown, and the
document rules (admins only, If-Match, versions kept)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import Conflict, Forbidden, Infeasible, NotFound, ValidationFailed
from berth.domain.fleet import HostInventory
from berth.domain.job import new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import HostGpus, OnPremPlacement, Site
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller, GpuQuota, Quota, Role
from berth.logic.fleet import FleetService
from berth.logic.snapshot import POLICY, SnapshotSource
from berth.scheduler.defaults import default_policy
from berth.scheduler.outcomes import Rule
from tests.unit.fakes import FakeDocuments, FakeHosts, fake_store

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
ADMIN = Caller("arn:aws:iam::1:user/admin", "platform", Role.ADMIN, "admin")
ALICE = Caller("arn:aws:iam::1:user/alice", "vision", Role.MEMBER, "alice")


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class CountingHosts(FakeHosts):
    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def list_hosts(self):  # type: ignore[no-untyped-def]
        self.scans += 1
        return super().list_hosts()


def _spec(**resources: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "t", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "V100", **resources}}
    )


@pytest.fixture
def world() -> tuple[FleetService, SnapshotSource, CountingHosts, Clock]:
    jobs, tenants = fake_store()
    hosts = CountingHosts()
    clock = Clock()
    source = SnapshotSource(jobs, tenants, hosts, FakeDocuments(), clock)
    for name, lease in (("live", NOW + timedelta(minutes=5)), ("stale", NOW - timedelta(seconds=1))):
        hosts.register(
            HostInventory(
                host_id=name,
                pool="p",
                gpu_type="V100",
                gpu_ids=(f"{name}-0", f"{name}-1"),
                cpu=8,
                memory_gib=64,
            ),
            lease,
        )
    return FleetService(source, cache_s=5.0), source, hosts, clock


def test_hosts_past_their_lease_are_unhealthy_to_the_core(world) -> None:  # type: ignore[no-untyped-def]
    _, source, _, _ = world
    fleet = source.fleet()
    assert {h.host_id: h.healthy for h in fleet.hosts} == {"live": True, "stale": False}
    assert fleet.policy == default_policy() and fleet.policy_version == 0 and fleet.offers_version == 0


def test_snapshot_holds_pending_and_placed_jobs_and_quotas(world) -> None:  # type: ignore[no-untyped-def]
    _, source, _, _ = world
    source.tenants.put_quota("vision", Quota(gpus={"V100": GpuQuota(guaranteed=2, borrow_limit=1)}, weight=3))
    queued, ev = new_job(new_job_id(NOW), "vision", "arn:x", _spec(gpus=1), NOW)
    source.jobs.create(queued, ev, max_active=10)
    placed, ev = new_job(new_job_id(NOW + timedelta(1)), "nlp", "arn:y", _spec(gpus=2), NOW)
    source.jobs.create(placed, ev, max_active=10)
    where = OnPremPlacement(pool="p", gpu_type="V100", hosts=(HostGpus(host_id="live", gpus=2),))
    moved, ev = placed.transition(JobStatus.STARTING, "placed", NOW, site=Site.ONPREM, placement=where)
    source.jobs.save(moved, ev)
    snapshot, _, pending = source.snapshot()
    assert [p.job_id for p in snapshot.pending] == [queued.id] == [e.job_id for e in pending]
    (running,) = snapshot.running
    assert running.job_id == placed.id and running.hosts == (("live", 2),) and running.site is Site.ONPREM
    vision = snapshot.tenants["vision"]
    assert vision.weight == 3 and vision.onprem_limit("V100") == 3 and "nlp" in snapshot.tenants


def test_documents_admin_only_if_match_and_versions(world) -> None:  # type: ignore[no-untyped-def]
    svc, _, _, _ = world
    doc = default_policy().model_dump(mode="json")
    with pytest.raises(Forbidden):
        svc.put_document(ALICE, POLICY, doc, None)
    with pytest.raises(ValidationFailed):
        svc.put_document(ADMIN, POLICY, {"burst": {"wait_fraction": 1000}}, None)
    with pytest.raises(Conflict):
        svc.put_document(ADMIN, POLICY, doc, 3)
    v1 = svc.put_document(ADMIN, POLICY, {**doc, "name": "one"}, 0)
    v2 = svc.put_document(ADMIN, POLICY, {**doc, "name": "two"}, None)
    assert (v1.version, v2.version, v2.updated_by) == (1, 2, "admin")
    assert svc.get_document(ALICE, POLICY).document["name"] == "two"
    assert svc.get_document(ALICE, POLICY, 1).document["name"] == "one"
    assert svc.get_document(ALICE, POLICY, 0).version == 0
    with pytest.raises(NotFound):
        svc.get_document(ALICE, POLICY, 3)


def test_feasibility_names_the_rule_and_reuses_the_fleet_briefly(world) -> None:  # type: ignore[no-untyped-def]
    svc, _, hosts, clock = world
    svc.check(_spec(gpus=2), "vision")
    with pytest.raises(Infeasible) as err:
        svc.check(_spec(gpu_type="H200", gpus=1), "vision")
    assert err.value.details["rule"] == Rule.GPU_TYPE
    assert hosts.scans == 1  # the second check reused the fleet read by the first
    clock.now = NOW + timedelta(seconds=6)
    svc.check(_spec(gpus=2), "vision")
    assert hosts.scans == 2


def test_explain_of_a_job_behind_the_read_budget_says_it_was_not_considered(world) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from berth.domain.tenancy import Caller, Role
    from berth.logic.jobs import JobService
    from berth.logic.snapshot import QueueLimits

    _, source, _, clock = world
    ids = []
    for i in range(4):
        job, ev = new_job(new_job_id(NOW + timedelta(seconds=i)), "vision", "arn:x", _spec(gpus=1), NOW)
        source.jobs.create(job, ev, max_active=10)
        ids.append(job.id)
    limited = FleetService(replace(source, queue=QueueLimits(read_budget=2, min_head=2)), cache_s=0.0)
    caller = Caller("arn:x", "vision", Role.MEMBER)
    jobs = JobService(source.jobs, source.tenants, clock)
    head = limited.explain(jobs, caller, ids[0])
    assert head["outcome"] in {"onprem", "pending"}
    assert head["explanation"]["not_considered"] == 2 and head["explanation"]["tenant_not_considered"] == 2
    behind = limited.explain(jobs, caller, ids[3])
    assert behind["outcome"] == "not-considered"
    assert behind["explanation"]["tenant_not_considered"] == 2 and behind["explanation"]["tenant_read"] == 2
    assert "behind the first 2" in behind["explanation"]["summary"]


def test_explain_of_a_job_placed_while_it_reads_the_snapshot_says_where(world) -> None:  # type: ignore[no-untyped-def]
    """The job is read QUEUED, then a pass places it before the snapshot is read: explain answers
    from the job as it is now (placed), never a bare "not-pending"."""
    from berth.domain.tenancy import Caller, Role
    from berth.logic.jobs import JobService

    _, source, _, clock = world
    job, ev = new_job(new_job_id(NOW), "vision", "arn:x", _spec(gpus=1), NOW)
    source.jobs.create(job, ev, max_active=10)
    where = OnPremPlacement(pool="p", gpu_type="V100", hosts=(HostGpus(host_id="live", gpus=1),))

    class PlacingSource:
        """The store as a pass that places the job between explain's two reads leaves it."""

        def __getattr__(self, name: str) -> object:
            return getattr(source, name)

        def snapshot(self):  # type: ignore[no-untyped-def]
            stored = source.jobs.get(job.id)
            moved, event = stored.transition(
                JobStatus.STARTING, "placed", NOW, site=Site.ONPREM, placement=where
            )
            source.jobs.save(moved, event)
            return source.snapshot()

    svc = FleetService(PlacingSource(), cache_s=0.0)  # type: ignore[arg-type]
    out = svc.explain(
        JobService(source.jobs, source.tenants, clock), Caller("arn:x", "vision", Role.MEMBER), job.id
    )
    assert out["outcome"] == "placed" and out["status"] == "STARTING", out
    assert [h["host_id"] for h in out["placement"]["hosts"]] == ["live"] and out["explanation"] is None


def test_capacity_names_only_the_callers_own_tenants_job_ids(world) -> None:  # type: ignore[no-untyped-def]
    """Finding 8a over the fakes: a member sees its own tenant's attempts on a host, an admin all."""
    fleet, source, hosts, _ = world
    ids = []
    for i, tenant in enumerate(("vision", "nlp")):
        job, event = new_job(new_job_id(NOW + timedelta(seconds=i)), tenant, "someone", _spec(gpus=1), NOW)
        source.jobs.create(job, event, max_active=100)
        ids.append(job.id)
    mine, theirs = ids
    hosts.hold("live", f"{mine}#1", ("live-0",), 1, 1)
    hosts.hold("live", f"{theirs}#1", ("live-1",), 1, 1)

    def attempts(caller: Caller) -> list[str]:
        return {h["host_id"]: h for h in fleet.capacity(caller)["hosts"]}["live"]["attempts"]

    assert attempts(ALICE) == [f"{mine}#1"]
    assert attempts(ADMIN) == sorted([f"{mine}#1", f"{theirs}#1"])


def test_capacity_shows_each_hosts_containment(world) -> None:  # type: ignore[no-untyped-def]
    svc, _, hosts, _ = world
    inv = HostInventory(
        host_id="contained",
        pool="p",
        gpu_type="V100",
        gpu_ids=("c-0",),
        cpu=8,
        memory_gib=64,
        containment="process-group",
    )
    hosts.register(inv, NOW + timedelta(minutes=5))
    cap = svc.capacity(ALICE)
    assert {h["host_id"]: h["containment"] for h in cap["hosts"]} == {
        "contained": "process-group",
        "live": None,  # an agent that does not say
        "stale": None,
    }
    with pytest.raises(ValueError, match="containment"):
        HostInventory(**{**inv.model_dump(), "containment": "chroot"})
