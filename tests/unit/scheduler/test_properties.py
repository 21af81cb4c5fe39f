"""Invariants of a pass over random snapshots (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy
from berth.domain.placement import Site
from berth.scheduler import schedule
from berth.scheduler.decisions import CloudAssignment, OnPremAssignment
from berth.scheduler.eligibility import instances_for
from berth.scheduler.outcomes import Rule
from berth.scheduler.policy import SchedulingPolicy, load_policy
from berth.scheduler.snapshot import CloudOffer, Host, PendingJob, RunningJob, Snapshot, TenantState

from .helpers import NOW

TENANTS = ("a", "b", "c")
OFFERS = (
    CloudOffer("us-east-1", "e1", "p3.2xlarge", "V100", 1, 8, 61, 3.06, 0.7),
    CloudOffer("us-east-1", "e1", "p3.8xlarge", "V100", 4, 32, 244, 12.24, 1.8),
    CloudOffer("us-west-2", "w1", "p3.16xlarge", "V100", 8, 64, 488, 24.48, 7.7),
    CloudOffer("us-west-2", "w1", "g5.xlarge", "A10G", 1, 4, 16, 1.0, None),
)


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Snapshot, SchedulingPolicy]:
    hosts = []
    running = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from((4, 8)))
        model = draw(st.sampled_from(("V100", "A10G")))
        pool = draw(st.sampled_from(("p1", "p2")))
        busy = draw(st.integers(0, gpus))
        hid = f"h{i}"
        if busy:
            running.append(
                RunningJob(
                    job_id=f"r{i}",
                    tenant=draw(st.sampled_from(TENANTS)),
                    gpu_type=model,
                    gpus=busy,
                    started_at=NOW - draw(st.integers(0, 7200)),
                    site="onprem",
                    hosts=((hid, busy),),
                    cpu=2.0 * busy,
                    memory_gib=8.0 * busy,
                    priority=draw(st.sampled_from(list(Priority))),
                    borrowed=draw(st.booleans()),
                    checkpointing=draw(st.booleans()),
                    checkpoint_interval_s=600.0,
                )
            )
        hosts.append(
            Host(
                hid,
                pool,
                model,
                gpus,
                gpus - busy,
                32.0,
                32.0 - 2.0 * busy,
                128.0,
                128.0 - 8.0 * busy,
                healthy=draw(st.booleans()) or i == 0,
            )
        )
    pending = []
    for i in range(draw(st.integers(0, 12))):
        nodes = draw(st.sampled_from((1, 1, 1, 2)))
        gpn = draw(st.sampled_from((1, 2, 4, 8)))
        placement = draw(st.sampled_from(list(PlacementConstraint)))
        spot = draw(st.sampled_from(list(SpotPolicy)))
        if placement is PlacementConstraint.ONPREM and spot is SpotPolicy.REQUIRED:
            spot = SpotPolicy.ALLOWED
        pending.append(
            PendingJob(
                job_id=f"j{i}",
                tenant=draw(st.sampled_from(TENANTS)),
                gpu_type=draw(st.sampled_from(("V100", "A10G"))),
                gpus=gpn * nodes,
                nodes=nodes,
                submitted_at=NOW - draw(st.integers(0, 3600)),
                cpu=draw(st.sampled_from((1.0, 4.0, 16.0))),
                memory_gib=draw(st.sampled_from((4.0, 32.0, 100.0))),
                placement=placement,
                spot=spot,
                priority=draw(st.sampled_from(list(Priority))),
                regions=draw(st.sampled_from(((), ("us-east-1",), ("us-west-2",)))),
                max_hourly_usd=draw(st.sampled_from((None, 1.0, 5.0, 30.0))),
                expected_duration_s=draw(st.sampled_from((None, 600.0, 86400.0))),
                checkpointing=draw(st.booleans()),
            )
        )
    tenants = {
        t: TenantState(
            t,
            weight=draw(st.sampled_from((1.0, 2.0))),
            guaranteed_gpus={"V100": draw(st.integers(0, 8))},
            borrow_limit_gpus={"V100": draw(st.integers(0, 16))} if draw(st.booleans()) else {},
            monthly_budget_usd=draw(st.sampled_from((None, 10.0, 1e6))),
        )
        for t in TENANTS
    }
    policy = load_policy(
        {
            "burst": {
                "min_wait_s": draw(st.sampled_from((0.0, 1800.0))),
                "wait_fraction": 0.1,
                "tenants": draw(st.sampled_from((["*"], ["a"]))),
            },
            "max_usd_per_gpu_hour": draw(st.sampled_from((None, 2.0))),
            "preemption": {"max_per_pass": draw(st.integers(0, 3)), "min_runtime_s": 300.0},
            "residency": [{"tenant": "c", "onprem_only": True}],
        }
    )
    return Snapshot(tuple(pending), tuple(running), tuple(hosts), OFFERS, tenants), policy


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(snapshots())
def test_pass_invariants(case: tuple[Snapshot, SchedulingPolicy]) -> None:
    snap, policy = case
    d = schedule(snap, policy, NOW)
    pending = {j.job_id: j for j in snap.pending}
    hosts = {h.host_id: h for h in snap.hosts}
    running = {r.job_id: r for r in snap.running}
    free = {h.host_id: [h.free_gpus, h.free_cpu, h.free_memory_gib] for h in snap.hosts}
    # Preemption only when a rule allows it, and bounded per pass.
    assert len(d.preemptions) <= policy.preemption.max_per_pass
    for p in d.preemptions:
        victim, beneficiary = running[p.job_id], pending[p.for_job]
        assert NOW - victim.started_at >= policy.preemption.min_runtime_s
        if p.rule.endswith("reclaim"):
            assert victim.borrowed and victim.tenant != beneficiary.tenant
        else:
            assert victim.tenant == beneficiary.tenant and victim.priority.rank < beneficiary.priority.rank
        for hid, g in victim.hosts:
            free[hid][0] += g
            free[hid][1] += victim.cpu
            free[hid][2] += victim.memory_gib
    # Every pending job is either placed exactly once or has a reason.
    placed_ids = [a.job_id for a in d.placements]
    assert len(placed_ids) == len(set(placed_ids))
    assert set(placed_ids) | set(d.reasons) == set(pending)
    assert not set(placed_ids) & set(d.reasons)
    onprem_use: dict[tuple[str, str], int] = {}
    for r in snap.running:
        if r.site == "onprem" and r.job_id not in {p.job_id for p in d.preemptions}:
            onprem_use[(r.tenant, r.gpu_type)] = onprem_use.get((r.tenant, r.gpu_type), 0) + r.gpus
    for a in d.placements:
        job = pending[a.job_id]
        assert a.tenant == job.tenant
        if isinstance(a, OnPremAssignment):
            assert job.placement is not PlacementConstraint.CLOUD
            # Gang: all GPUs at once, one pool, nodes distinct healthy hosts of the right model.
            assert len(a.hosts) == job.nodes == len({h for h, _ in a.hosts})
            assert sum(g for _, g in a.hosts) == job.gpus
            assert {hosts[h].pool for h, _ in a.hosts} == {a.pool}
            for hid, g in a.hosts:
                h = hosts[hid]
                assert h.healthy and h.gpu_type == job.gpu_type
                free[hid][0] -= g
                free[hid][1] -= job.cpu
                free[hid][2] -= job.memory_gib
            key = (job.tenant, a.gpu_type)
            onprem_use[key] = onprem_use.get(key, 0) + job.gpus
            limit = snap.tenants[job.tenant].onprem_limit(a.gpu_type)
            assert limit is None or onprem_use[key] <= limit
        else:
            assert isinstance(a, CloudAssignment)
            assert job.placement is not PlacementConstraint.ONPREM and job.tenant != "c"
            assert policy.burst is not None and policy.burst.allows(job.tenant)
            assert not job.regions or a.region in job.regions
            assert a.gpu_type == job.gpu_type
            assert not (job.spot is SpotPolicy.NEVER and a.spot)
            assert not (job.spot is SpotPolicy.REQUIRED and not a.spot)
            assert job.max_hourly_usd is None or a.hourly_usd <= job.max_hourly_usd
            offer = next(o for o in OFFERS if o.zone == a.zone and o.instance_type == a.instance_type)
            assert instances_for(job, offer) == a.instances
            if policy.max_usd_per_gpu_hour is not None:
                whole = a.instance_hourly_usd if a.instance_id else a.hourly_usd / a.instances
                assert whole / offer.gpus <= policy.max_usd_per_gpu_hour + 1e-9
            tenant = snap.tenants[job.tenant]
            horizon = job.expected_duration_s or job.timeout_s or 3600.0
            if tenant.monthly_budget_usd is not None:
                assert a.hourly_usd * horizon / 3600 <= tenant.monthly_budget_usd + 1e-6
    # Never more GPUs, CPU or memory placed on a host than it has free.
    for hid, (g, c, m) in free.items():
        assert g >= 0 and c >= -1e-9 and m >= -1e-9, hid
    # Same snapshot, same decisions.
    assert schedule(snap, policy, NOW) == d


@SETTINGS
@given(snapshots())
def test_outcomes_name_the_real_cause(case: tuple[Snapshot, SchedulingPolicy]) -> None:
    snap, policy = case
    d = schedule(snap, policy, NOW)
    for job in snap.pending:
        o = d.outcomes[job.job_id]
        if o.placed is not None:
            continue
        cloud = o.step(Site.CLOUD)
        if job.placement is PlacementConstraint.ONPREM:
            assert cloud is None
        if job.placement is PlacementConstraint.CLOUD:
            assert o.step(Site.ONPREM) is None
        if job.tenant == "c" and job.placement is not PlacementConstraint.ONPREM:
            assert cloud is not None and cloud.rule in (Rule.RESIDENCY, Rule.BURST_TENANTS)
        elif (
            job.placement is not PlacementConstraint.ONPREM
            and policy.burst is not None
            and not policy.burst.allows(job.tenant)
        ):
            assert cloud is not None and cloud.rule is Rule.BURST_TENANTS
        assert d.reasons[job.job_id] == o.reason()
