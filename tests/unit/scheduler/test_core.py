"""Behaviour of one scheduling pass on small hand-made snapshots."""

from __future__ import annotations

from typing import Any

from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy
from berth.domain.placement import Site
from berth.scheduler import schedule
from berth.scheduler.decisions import CloudAssignment, Decisions, OnPremAssignment
from berth.scheduler.explain import explain_job
from berth.scheduler.outcomes import Rule
from berth.scheduler.policy import load_policy
from berth.scheduler.snapshot import CircuitRecord, RunningJob, TenantState

from .helpers import NOW, host, job, offer, policy, running, snap


def test_places_onprem_best_fit_keeps_whole_host_free() -> None:
    s = snap([job("j1", gpus=2)], hosts=[host("h1"), host("h2", free=3)])
    d = schedule(s, policy(), NOW)
    (a,) = d.placements
    assert isinstance(a, OnPremAssignment)
    assert a.hosts == (("h2", 2),)  # the fuller host; h1 stays whole for an 8-GPU job


def test_gang_multi_node_only_within_one_pool() -> None:
    hosts = [host("a1", pool="a"), host("b1", pool="b")]
    d = schedule(snap([job("big", gpus=16, nodes=2)], hosts=hosts), policy(burst=None), NOW)
    assert d.placements == []
    assert d.outcomes["big"].rules == (Rule.CAPACITY, Rule.BURST)
    assert "fewer than 2 hosts with 8 free V100 GPUs each" in d.reasons["big"]
    hosts.append(host("a2", pool="a"))
    d = schedule(snap([job("big", gpus=16, nodes=2)], hosts=hosts), policy(burst=None), NOW)
    (a,) = d.placements
    assert isinstance(a, OnPremAssignment) and a.pool == "a" and {h for h, _ in a.hosts} == {"a1", "a2"}


def test_a_single_host_shortage_reads_as_plain_english() -> None:
    d = schedule(snap([job("wide", gpus=16)], hosts=[host("a1")]), policy(burst=None), NOW)
    assert "no host with 16 free V100 GPUs (" in d.reasons["wide"]
    assert "no a host" not in d.reasons["wide"]
    d = schedule(snap([job("one", gpus=1)], hosts=[host("a1", free=0)]), policy(burst=None), NOW)
    assert "no host with 1 free V100 GPU (" in d.reasons["one"]


def test_cloud_after_burst_wait_with_cheapest_offer_and_spot() -> None:
    pol = load_policy({"burst": {"min_wait_s": 600, "wait_fraction": 0}})
    offers = [offer(zone="z1", spot=1.2), offer(zone="z2", spot=0.8), offer(zone="z3", spot=None, od=2.0)]
    j = job("c1", submitted_at=NOW - 100, checkpointing=True)
    d = schedule(snap([j], offers=offers), pol, NOW)
    assert d.placements == [] and d.outcomes["c1"].rules == (Rule.CAPACITY, Rule.BURST_WAIT)
    assert "may burst in 8 min" in d.reasons["c1"]
    assert d.wake_at == NOW + 500
    d = schedule(snap([j], offers=offers), pol, NOW + 500)
    (a,) = d.placements
    assert isinstance(a, CloudAssignment) and a.zone == "z2" and a.spot and a.hourly_usd == 0.8


def test_spot_never_and_non_checkpointing_get_on_demand() -> None:
    offers = [offer(zone="z1", od=3.0, spot=0.5)]
    for j in (job("n1", spot=SpotPolicy.NEVER, checkpointing=True), job("n2", expected_duration_s=86400.0)):
        (a,) = schedule(snap([j], offers=offers), policy(), NOW).placements
        assert isinstance(a, CloudAssignment) and not a.spot and a.hourly_usd == 3.0


def test_open_circuit_steers_elsewhere_until_half_open() -> None:
    offers = [offer(zone="z1", spot=0.5), offer(region="us-west-2", zone="w1", spot=0.9)]
    fails = (CircuitRecord("us-east-1", "p3.2xlarge", (NOW - 30, NOW - 20, NOW - 10)),)
    j = job("c", checkpointing=True)
    (a,) = schedule(snap([j], offers=offers, circuits=fails), policy(), NOW).placements
    assert isinstance(a, CloudAssignment) and a.region == "us-west-2"
    later = NOW + 1000  # open_s = 900 after the last failure: half-open, cheapest again
    (a,) = schedule(snap([j], offers=offers, circuits=fails), policy(), later).placements
    assert isinstance(a, CloudAssignment) and a.region == "us-east-1"
    # Only one probe per pass goes to a half-open circuit.
    d = schedule(snap([j, job("c2", checkpointing=True)], offers=offers, circuits=fails), policy(), later)
    assert sorted(a.region for a in d.placements if isinstance(a, CloudAssignment)) == [
        "us-east-1",
        "us-west-2",
    ]


def _cloud_rules(d: Decisions, job_id: str) -> tuple[Rule, ...]:
    return tuple(s.rule for s in d.outcomes[job_id].steps if s.site is Site.CLOUD)


def test_job_constraints_and_policy_rules_exclude_offers_with_reason() -> None:
    offers = [offer(zone="z1", od=3.0, spot=None)]
    d = schedule(snap([job("r", regions=("us-west-2",))], offers=offers), policy(), NOW)
    assert Rule.REGIONS in _cloud_rules(d, "r")
    d = schedule(snap([job("m", max_hourly_usd=1.0)], offers=offers), policy(), NOW)
    assert Rule.MAX_HOURLY_USD in _cloud_rules(d, "m")
    d = schedule(snap([job("p")], offers=offers), policy(max_usd_per_gpu_hour=2.0), NOW)
    assert Rule.MAX_USD_PER_GPU_HOUR in _cloud_rules(d, "p")
    d = schedule(snap([job("o", placement=PlacementConstraint.ONPREM)], offers=offers), policy(), NOW)
    assert d.placements == [] and "cloud" not in d.reasons["o"]


def test_residency_and_burst_tenants() -> None:
    offers = [offer()]
    pol = policy(
        residency=[{"dataset_prefix": "s3://secret/", "onprem_only": True}],
        burst={"tenants": ["a"], "min_wait_s": 0},
    )
    d = schedule(snap([job("s", datasets=("s3://secret/x",)), job("b", tenant="b")], offers=offers), pol, NOW)
    assert d.placements == []
    assert d.outcomes["s"].rules[-1] is Rule.RESIDENCY
    assert "residency[dataset s3://secret/] keeps the job on-prem" in d.reasons["s"]
    assert d.outcomes["b"].rules[-1] is Rule.BURST_TENANTS


def test_quota_limits_onprem_and_marks_borrowed() -> None:
    tenants = {"a": TenantState("a", guaranteed_gpus={"V100": 2}, borrow_limit_gpus={"V100": 2})}
    pend = [job(f"j{i}", submitted_at=NOW - 10 + i) for i in range(5)]
    d = schedule(snap(pend, hosts=[host("h1")], tenants=tenants), policy(burst=None), NOW)
    placed = [a for a in d.placements if isinstance(a, OnPremAssignment)]
    assert len(placed) == 4
    assert [a.borrowed for a in placed] == [False, False, True, True]
    assert d.outcomes["j4"].rules[0] is Rule.BORROW_LIMIT


def test_reclaim_preempts_borrowed_least_loss_first() -> None:
    tenants = {"own": TenantState("own", guaranteed_gpus={"V100": 8}), "b": TenantState("b")}
    hosts = [host("h1", free=0)]
    run = [
        running("old", "b", (("h1", 4),), started_at=NOW - 7200, borrowed=True),
        running("young", "b", (("h1", 4),), started_at=NOW - 900, borrowed=True),
    ]
    d = schedule(
        snap([job("mine", tenant="own", gpus=4)], run, hosts, tenants=tenants), policy(burst=None), NOW
    )
    assert [p.job_id for p in d.preemptions] == ["young"]
    assert d.preemptions[0].rule == "policy.preemption.reclaim"
    (a,) = d.placements
    assert a.job_id == "mine"


def test_no_preemption_without_a_rule_and_budget_bounds_it() -> None:
    hosts = [host("h1", free=0)]
    run = [running("x", "b", (("h1", 8),), borrowed=True)]
    # Tenant without guarantee: may not reclaim; same priority: no priority preemption.
    d = schedule(snap([job("j", tenant="a", priority=Priority.HIGH)], run, hosts), policy(burst=None), NOW)
    assert d.preemptions == [] and d.placements == []
    # Priority preemption within a tenant, bounded per pass.
    hosts = [host(f"h{i}", free=0) for i in range(4)]
    run = [running(f"low{i}", "a", ((f"h{i}", 8),), priority=Priority.LOW) for i in range(4)]
    pend = [job(f"hi{i}", tenant="a", gpus=8, priority=Priority.HIGH) for i in range(4)]
    pol = policy(burst=None, preemption={"max_per_pass": 2})
    d = schedule(snap(pend, run, hosts), pol, NOW)
    assert len(d.preemptions) == 2 and len(d.placements) == 2


def test_min_runtime_protects_fresh_jobs() -> None:
    hosts = [host("h1", free=0)]
    run = [running("fresh", "a", (("h1", 8),), priority=Priority.LOW, started_at=NOW - 10)]
    d = schedule(snap([job("hi", gpus=8, priority=Priority.HIGH)], run, hosts), policy(burst=None), NOW)
    assert d.preemptions == []


def test_repatriates_checkpointing_cloud_job_when_onprem_frees() -> None:
    r = running("cj", "a", (("x", 1),), started_at=NOW - 1000)
    cloud = type(r)(
        job_id="cj",
        tenant="a",
        gpu_type="V100",
        gpus=1,
        started_at=NOW - 1000,
        site="cloud",
        region="us-east-1",
        instance_type="p3.2xlarge",
        hourly_usd=3.0,
        checkpointing=True,
        checkpoint_interval_s=900.0,
        expected_end_at=NOW + 86400,
    )
    d = schedule(snap([], [cloud], [host("h1")]), policy(), NOW)
    (rep,) = d.repatriations
    assert rep.job_id == "cj" and rep.to.hosts == (("h1", 1),) and rep.lost_progress_s == 100.0
    assert rep.saving_usd > 50
    # Not when it would throw away more than the policy allows, or when it would not save.
    d = schedule(snap([], [cloud], [host("h1")]), policy(repatriation={"max_lost_progress_s": 50}), NOW)
    assert d.repatriations == []


def test_repatriation_scores_a_job_left_alone_on_a_shared_instance_by_the_whole_instance() -> None:
    from berth.scheduler.snapshot import CloudInstance

    def alone(others: int) -> tuple[list[RunningJob], CloudInstance]:
        # An 8-GPU instance at 8 USD/h; "cj" (1 GPU, its share 1 USD/h) has about 2 h left.
        jobs = [
            RunningJob(
                job_id=jid,
                tenant="a",
                gpu_type="V100",
                gpus=1,
                started_at=NOW - 1000,
                site=Site.CLOUD,
                region="us-east-1",
                instance_type="p3.16xlarge",
                hourly_usd=1.0,
                checkpointing=True,
                checkpoint_interval_s=900.0,
                expected_end_at=NOW + 7200,
                instance_id="i-1",
            )
            for jid in ["cj", *(f"o{k}" for k in range(others))]
        ]
        inst = CloudInstance(
            "i-1", "us-east-1", "z1", "p3.16xlarge", "V100", True, 8, 64.0, 488.0, 8.0,
            7 - others, 60.0 - 4 * others, 480.0 - 8 * others,
        )  # fmt: skip
        return jobs, inst

    jobs, inst = alone(0)
    s = snap([], jobs, [host("h1", free=1)], instances=(inst,))
    pol = policy(repatriation={"min_saving_usd": 5.0})
    # Its GPU share saves about 1.6 USD: below the threshold, it stays.
    assert schedule(s, pol, NOW).repatriations == []
    pol = policy(repatriation={"min_saving_usd": 5.0, "instance_share": True})
    (rep,) = schedule(s, pol, NOW).repatriations
    assert rep.job_id == "cj" and rep.saving_usd > 10  # the whole instance: 8 USD/h for ~1.6 h
    # Sharing the instance with seven others, it pays only its share: not worth a restart.
    jobs, inst = alone(7)
    s = snap([], jobs, [host("h1", free=1)], instances=(inst,))
    assert schedule(s, pol, NOW).repatriations == []


def test_fair_share_serves_the_tenant_with_lower_share_first() -> None:
    hosts = [host("h1", free=4)]
    run = [running("r", "heavy", (("h1", 4),))]
    pend = [job("h", tenant="heavy", submitted_at=NOW - 100), job("l", tenant="light", submitted_at=NOW - 1)]
    d = schedule(snap(pend, run, hosts), policy(burst=None), NOW)
    assert next(a.job_id for a in d.placements) == "l"
    fifo = schedule(snap(pend, run, hosts), policy(burst=None, fair_share={"ordering": "fifo"}), NOW)
    assert next(a.job_id for a in fifo.placements) == "h"


def test_same_snapshot_same_decisions() -> None:
    pend = [job(f"j{i}", tenant="ab"[i % 2], gpus=1 + i % 4) for i in range(20)]
    s = snap(pend, hosts=[host(f"h{i}") for i in range(3)], offers=[offer(), offer(zone="z2", spot=0.7)])
    assert schedule(s, policy(), NOW) == schedule(s, policy(), NOW)


def test_explain_names_candidates_and_causes() -> None:
    offers = [offer(zone="z1"), offer(region="us-west-2", zone="w1")]
    s = snap(
        [job("e", regions=("us-west-2",), submitted_at=NOW - 5)], hosts=[host("h1", free=0)], offers=offers
    )
    pol = load_policy({"burst": {"min_wait_s": 600}})
    ex = explain_job(s, pol, NOW, "e")
    assert ex.outcome == "pending"
    by_site = {c.site: c for c in ex.candidates}
    assert by_site["onprem:p1/V100"].rule == "capacity"
    assert by_site["cloud:us-east-1/p3.2xlarge/z1"].rule == "job.regions"
    assert by_site["cloud:us-west-2/p3.2xlarge/w1"].rule == Rule.BURST_WAIT
    assert ex.rules == [Rule.CAPACITY, Rule.BURST_WAIT]
    assert ex.fair_share_rank == 1
    placed = explain_job(s, pol, NOW + 600, "e")
    assert placed.outcome == "cloud" and by_site.keys() == {c.site for c in placed.candidates}
    assert [c.site for c in placed.candidates if c.chosen] == ["cloud:us-west-2/p3.2xlarge/w1"]


def test_fifo_onprem_backfills_and_gives_every_waiting_job_a_reason() -> None:
    pol = policy(burst=None, fair_share={"ordering": "fifo"}, preemption={"max_per_pass": 0})
    pend = [
        job("big", gpus=8, submitted_at=NOW - 30),
        job("one", submitted_at=NOW - 20),
        job("four", gpus=4, submitted_at=NOW - 10),
        job("two", gpus=2, submitted_at=NOW - 5),
    ]
    d = schedule(snap(pend, hosts=[host("h1", free=3), host("h2", free=2)]), pol, NOW)
    assert sorted(a.job_id for a in d.placements) == ["one", "two"]
    assert set(d.reasons) == {"big", "four"}
    assert all("never bursts" in r for r in d.reasons.values())
    assert "largest free block" in d.reasons["four"]


def test_repatriation_before_queue_gives_the_slot_to_the_long_cloud_job() -> None:
    cloud = RunningJob(
        job_id="cj",
        tenant="a",
        gpu_type="V100",
        gpus=1,
        started_at=NOW - 1000,
        site="cloud",
        region="us-east-1",
        instance_type="p3.2xlarge",
        hourly_usd=3.0,
        checkpointing=True,
        checkpoint_interval_s=900.0,
        expected_end_at=NOW + 10 * 86400,
    )
    s = snap([job("short", expected_duration_s=3600.0)], [cloud], [host("h1", free=1)])
    d = schedule(s, policy(), NOW)
    assert [a.job_id for a in d.placements] == ["short"] and d.repatriations == []
    d = schedule(s, policy(repatriation={"before_queue": True}), NOW)
    assert [r.job_id for r in d.repatriations] == ["cj"]
    assert "short" in d.reasons or any(isinstance(a, CloudAssignment) for a in d.placements)


def test_fifo_onprem_fast_path_places_exactly_like_the_general_pass() -> None:
    # The fast FIFO on-prem scan skips jobs larger than the largest free block; a residency rule
    # for an absent tenant turns the fast path off without changing any decision.
    import random

    rng = random.Random(7)
    fast = policy(burst=None, fair_share={"ordering": "fifo"}, preemption={"max_per_pass": 0})
    slow = policy(
        burst=None,
        fair_share={"ordering": "fifo"},
        preemption={"max_per_pass": 0},
        residency=[{"tenant": "nobody", "pools": ["p1"]}],
    )
    for _ in range(30):
        hosts = [host(f"h{i}", free=rng.choice([0, 1, 2, 3, 4, 8])) for i in range(6)]
        pend = []
        for i in range(40):
            gpus = rng.choice([1, 1, 2, 4, 8, 16])
            pend.append(
                job(
                    f"j{i:02d}",
                    tenant=rng.choice("abc"),
                    gpus=gpus,
                    nodes=2 if gpus == 16 else 1,
                    submitted_at=NOW - rng.randrange(1000),
                )
            )
        s = snap(pend, hosts=hosts)
        a, b = schedule(s, fast, NOW), schedule(s, slow, NOW)
        assert [(p.job_id, p.hosts) for p in a.placements] == [(p.job_id, p.hosts) for p in b.placements]
        placed = {p.job_id for p in a.placements}
        assert set(a.reasons) == {j.job_id for j in pend} - placed


def test_estimate_wait_bursts_at_once_only_when_onprem_is_out_of_reach() -> None:
    burst = {"min_wait_s": 600, "wait_fraction": 0.1, "max_wait_s": 86400}
    est = policy(burst={**burst, "estimate_wait": True})
    plain = policy(burst=burst)
    offers = [offer()]
    hosts = [host("h1", free=0)]
    # Waited 700 s of a 10,000 s budget (10 % of 100,000 s).
    j1 = job("j1", submitted_at=NOW - 700, expected_duration_s=100_000.0, checkpointing=True)
    j2 = job("j2", submitted_at=NOW - 650, expected_duration_s=100_000.0, checkpointing=True)

    def fleet(first_end: float) -> list[RunningJob]:
        return [
            running("r1", "b", (("h1", 1),), expected_end_at=NOW + first_end),
            running("r2", "b", (("h1", 7),), expected_end_at=NOW + 1_000_000),
        ]

    # On-prem frees nothing before the job may burst anyway: burst now (the plain rule waits).
    d = schedule(snap([j1], fleet(50_000), hosts, offers), est, NOW)
    assert [a.job_id for a in d.placements] == ["j1"] and isinstance(d.placements[0], CloudAssignment)
    assert schedule(snap([j1], fleet(50_000), hosts, offers), plain, NOW).placements == []
    # A GPU frees within the wait: keep waiting for it.
    d = schedule(snap([j1], fleet(1_000), hosts, offers), est, NOW)
    assert d.placements == [] and "may burst in" in d.reasons["j1"]
    # ... but only one: the job behind j1 (which is waiting for it) is out of reach and bursts.
    d = schedule(snap([j1, j2], fleet(1_000), hosts, offers), est, NOW)
    assert [a.job_id for a in d.placements] == ["j2"]
    # Not before min_wait_s.
    early = job("e", submitted_at=NOW - 100, expected_duration_s=100_000.0, checkpointing=True)
    assert schedule(snap([early], fleet(50_000), hosts, offers), est, NOW).placements == []


def test_the_pass_restores_the_garbage_collector_as_it_found_it() -> None:
    import gc

    s = snap([job("g")], hosts=[host("h1")])
    assert gc.isenabled()
    schedule(s, policy(), NOW)
    assert gc.isenabled()
    gc.disable()
    try:
        schedule(s, policy(), NOW)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _alone_on(gpus_in_use: int, started_at: float = NOW - 3600, end_in: float = 10 * 3600) -> Any:
    """A 1-GPU checkpointing job on an 8-GPU instance (8 USD/h) with ``gpus_in_use`` GPUs busy."""
    from berth.scheduler.snapshot import CloudInstance

    jobs = [
        RunningJob(
            job_id=jid,
            tenant="a",
            gpu_type="V100",
            gpus=1,
            started_at=started_at,
            site=Site.CLOUD,
            region="us-east-1",
            instance_type="p3.16xlarge",
            spot=True,
            hourly_usd=1.0,
            checkpointing=True,
            checkpoint_interval_s=900.0,
            expected_end_at=NOW + end_in,
            instance_id="i-1",
        )
        for jid in ["cj", *(f"o{k}" for k in range(gpus_in_use - 1))]
    ]
    inst = CloudInstance(
        "i-1", "us-east-1", "z1", "p3.16xlarge", "V100", True, 8, 64.0, 488.0, 8.0,
        8 - gpus_in_use, 64.0 - 4 * gpus_in_use, 488.0 - 8 * gpus_in_use,
    )  # fmt: skip
    offers = [offer(zone="z1", spot=1.0), offer(zone="z1", itype="p3.16xlarge", gpus=8, spot=8.0)]
    return snap([], jobs, [host("h1", free=0)], offers=offers, instances=(inst,))


def test_consolidation_frees_a_large_instance_a_job_holds_alone() -> None:
    from berth.scheduler.repatriation import CONSOLIDATE

    pol = policy(repatriation={"consolidate": True})
    d = schedule(_alone_on(1), pol, NOW)
    (p,) = d.preemptions
    assert p.job_id == "cj" and p.rule == CONSOLIDATE and p.for_job == "cj"
    assert d.wake_at is not None and d.wake_at <= NOW + 60  # it is back in the queue: run again soon
    # Off by default; not while others share the instance; not a fresh attempt; not when the
    # saving (7 USD/h for the 5 min left after the restart) is below the threshold.
    assert schedule(_alone_on(1), policy(), NOW).preemptions == []
    assert (
        schedule(_alone_on(1), policy(repatriation={"consolidate": True, "enabled": False}), NOW).preemptions
        == []
    )
    assert schedule(_alone_on(2), pol, NOW).preemptions == []
    assert schedule(_alone_on(1, started_at=NOW - 60), pol, NOW).preemptions == []
    assert schedule(_alone_on(1, end_in=600), pol, NOW).preemptions == []


def test_consolidation_does_not_stop_a_job_that_a_waiting_job_joins_in_this_pass() -> None:
    s = _alone_on(1)
    s = snap(
        [job("w", submitted_at=NOW - 7200, checkpointing=True, expected_duration_s=36000.0)],
        list(s.running),
        list(s.hosts),
        offers=list(s.offers),
        instances=s.instances,
    )
    d = schedule(s, policy(repatriation={"consolidate": True}), NOW)
    assert [a.job_id for a in d.placements] == ["w"] and d.placements[0].instance_id == "i-1"
    assert d.preemptions == []


def test_a_sweeps_tasks_are_served_in_index_order() -> None:
    # one GPU free, eleven tasks of one array submitted together: task 0 first, then 1, 2 ... 10
    # (not 0, 1, 10, 2 as their ids sort as text), under either order within a tenant
    array = "j-" + "0123456789abcdefghjkmnpqrs"
    tasks = [job(f"{array}:{i}", submitted_at=NOW - 5) for i in (10, 3, 1, 2, 0)]
    for within in ("submit", "longest-first"):
        placed = []
        pending = list(tasks)
        for _ in range(len(tasks)):
            d = schedule(
                snap(pending, hosts=[host("h1", gpus=1)]), policy(fair_share={"within_tenant": within}), NOW
            )
            (first,) = d.placements
            placed.append(first.job_id.rpartition(":")[2])
            pending = [j for j in pending if j.job_id != first.job_id]
        assert placed == ["0", "1", "2", "3", "10"], within
