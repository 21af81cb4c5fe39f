"""Packing and free slots are decided by the core under every rule (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth.domain.batch_queues import batch_queue_name
from berth.domain.job_spec import PlacementConstraint, SpotPolicy
from berth.domain.placement import Site
from berth.scheduler import schedule
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.explain import explain_job
from berth.scheduler.policy import SchedulingPolicy, load_policy
from berth.scheduler.snapshot import CloudInstance, RunningJob, Snapshot

from .helpers import NOW
from .test_properties import OFFERS, SETTINGS, snapshots


@st.composite
def packing_snapshots(draw: st.DrawFn) -> tuple[Snapshot, SchedulingPolicy]:
    snap, policy = draw(snapshots())
    instances = []
    running = list(snap.running)
    for i in range(draw(st.integers(0, 3))):
        offer = draw(st.sampled_from([o for o in OFFERS if o.gpus > 1]))
        spot = draw(st.booleans())
        used = draw(st.integers(1, offer.gpus))
        iid = f"i{i}"
        price = (offer.spot_usd_h or offer.on_demand_usd_h) if spot else offer.on_demand_usd_h
        instances.append(
            CloudInstance(
                iid, offer.region, offer.zone, offer.instance_type, offer.gpu_type, spot, offer.gpus,
                offer.vcpus, offer.memory_gib, price, offer.gpus - used, offer.vcpus - 2.0 * used,
                offer.memory_gib - 8.0 * used,
            )
        )  # fmt: skip
        running.append(
            RunningJob(
                f"c{i}", "b", offer.gpu_type, used, NOW - 600, Site.CLOUD, region=offer.region,
                instance_type=offer.instance_type, spot=spot, cpu=2.0 * used, memory_gib=8.0 * used,
                expected_end_at=NOW + draw(st.sampled_from((600.0, 86400.0))), instance_id=iid,
            )
        )  # fmt: skip
    doc = policy.model_dump()
    doc["burst"]["pack_instances"] = True
    doc["burst"]["min_wait_s"] = draw(st.sampled_from((0.0, 86400.0)))
    return replace(snap, running=tuple(running), instances=tuple(instances)), load_policy(doc)


@SETTINGS
@given(packing_snapshots())
def test_packed_instances_never_overfill_and_keep_every_constraint(
    case: tuple[Snapshot, SchedulingPolicy],
) -> None:
    snap, policy = case
    d = schedule(snap, policy, NOW)
    pending = {j.job_id: j for j in snap.pending}
    existing = {i.instance_id: i for i in snap.instances}
    offers = {(o.region, o.zone, o.instance_type): o for o in OFFERS}
    taken: dict[str, list[int]] = {}
    for a in d.placements:
        if isinstance(a, CloudAssignment):
            # Issue 23: the queue runs exactly the instance type the job was priced on, packed or not.
            assert a.queue == batch_queue_name(a.region, a.instance_type, a.spot), a
        if not isinstance(a, CloudAssignment) or a.instance_id is None:
            continue
        job = pending[a.job_id]
        inst = existing.get(a.instance_id)
        if inst is None:
            # A new instance is launched by the first job placed on it; jobs packed onto it later in
            # the same pass join it (launch=False).
            assert a.launch == (a.instance_id not in taken)
            offer = offers[(a.region, a.zone, a.instance_type)]
            cap = (offer.gpus, offer.vcpus, offer.memory_gib)
        else:
            cap = (inst.free_gpus, inst.free_cpu, inst.free_memory_gib)
            assert (inst.region, inst.gpu_type, inst.spot) == (a.region, a.gpu_type, a.spot)
        used = taken.setdefault(a.instance_id, [0, 0, 0])
        used[0] += job.gpus
        used[1] += job.cpu
        used[2] += job.memory_gib
        assert used[0] <= cap[0] and used[1] <= cap[1] + 1e-6 and used[2] <= cap[2] + 1e-6
        # Every rule a cloud placement obeys.
        assert job.nodes == 1 and job.placement is not PlacementConstraint.ONPREM
        assert policy.burst is not None and policy.burst.allows(job.tenant) and job.tenant != "c"
        assert not job.regions or a.region in job.regions
        assert a.gpu_type in policy.accepted_gpus(job.gpu_type)
        assert not (job.spot is SpotPolicy.NEVER and a.spot)
        assert not (job.spot is SpotPolicy.REQUIRED and not a.spot)
        assert job.max_hourly_usd is None or a.hourly_usd <= job.max_hourly_usd + 1e-9
        if policy.max_usd_per_gpu_hour is not None:
            gpus = inst.gpus if inst is not None else offers[(a.region, a.zone, a.instance_type)].gpus
            assert a.instance_hourly_usd / gpus <= policy.max_usd_per_gpu_hour + 1e-9
        assert a.hourly_usd == a.instance_hourly_usd * job.gpus / cap_gpus(a, existing, offers)
        budget = snap.tenants[job.tenant].monthly_budget_usd
        horizon = job.expected_duration_s or job.timeout_s or 3600.0
        assert budget is None or a.hourly_usd * horizon / 3600 <= budget + 1e-6


def cap_gpus(
    a: CloudAssignment, existing: dict[str, CloudInstance], offers: dict[tuple[str, str, str], object]
) -> int:
    inst = existing.get(a.instance_id or "")
    if inst is not None:
        return inst.gpus
    offer = offers[(a.region, a.zone, a.instance_type)]
    return offer.gpus  # type: ignore[attr-defined, no-any-return]


@SETTINGS
@given(packing_snapshots())
def test_explain_and_the_pass_agree_on_every_job(case: tuple[Snapshot, SchedulingPolicy]) -> None:
    snap, policy = case
    d = schedule(snap, policy, NOW)
    for job in snap.pending:
        o = d.outcomes[job.job_id]
        ex = explain_job(snap, policy, NOW, job.job_id)
        expected = "pending" if o.placed is None else str(o.placed.site)
        assert ex.outcome == expected
        assert ex.rules == [str(r) for r in o.rules]
        if o.placed is None:
            assert ex.summary == d.reasons[job.job_id]
        chosen = [c for c in ex.candidates if c.chosen]
        assert len(chosen) == (0 if o.placed is None else 1)


def test_jobs_bursting_together_share_one_larger_instance_and_rules_still_hold() -> None:
    from berth.scheduler.outcomes import Rule
    from berth.scheduler.snapshot import CloudOffer, TenantState

    from .helpers import job, policy, snap

    one = CloudOffer("us-east-1", "e1", "p3.2xlarge", "V100", 1, 8, 61, 3.06, 0.9)
    eight = CloudOffer("us-east-1", "e1", "p3.16xlarge", "V100", 8, 64, 488, 24.48, 2.75)
    west = CloudOffer("us-west-2", "w1", "p3.2xlarge", "V100", 1, 8, 61, 3.06, 0.95)
    jobs = [job(f"j{i}", checkpointing=True, cpu=4.0, memory_gib=32.0) for i in range(6)]
    jobs.append(job("avoid", checkpointing=True, avoid_regions=("us-east-1",)))
    jobs.append(job("poor", tenant="b", checkpointing=True))
    tenants = {"b": TenantState("b", monthly_budget_usd=0.01)}
    pol = policy(burst={"min_wait_s": 0, "wait_fraction": 0, "pack_instances": True})
    d = schedule(snap(jobs, offers=[one, eight, west], tenants=tenants), pol, NOW)
    placed = {a.job_id: a for a in d.placements if isinstance(a, CloudAssignment)}
    shared = {placed[f"j{i}"].instance_id for i in range(6)}
    assert len(shared) == 1 and all(placed[f"j{i}"].instance_type == "p3.16xlarge" for i in range(6))
    assert all(placed[f"j{i}"].hourly_usd == pytest.approx(2.75 / 8) for i in range(6))
    # One launch; the jobs packed with the first join the instance it launches.
    assert [placed[f"j{i}"].launch for i in range(6)].count(True) == 1
    assert placed["avoid"].region == "us-west-2"
    assert "poor" not in placed and d.outcomes["poor"].rules[-1] is Rule.BUDGET
