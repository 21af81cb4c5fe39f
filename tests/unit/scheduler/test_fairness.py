"""Dominant resource fairness on the classic worked example (Ghodsi et al., NSDI 2011)."""

from __future__ import annotations

from berth.scheduler import schedule
from berth.scheduler.snapshot import Host

from .helpers import NOW, job, policy, snap


def test_drf_equalises_dominant_shares_of_different_shapes() -> None:
    # 9 CPUs and 18 GiB (GPUs plentiful, so they are nobody's dominant resource).
    # A's tasks need <1 CPU, 4 GiB> (memory-dominant); B's <3 CPU, 1 GiB> (CPU-dominant).
    h = Host("h1", "p", "V100", 64, 64, 9.0, 9.0, 18.0, 18.0)
    pend = [
        job(f"a{i}", tenant="A", gpus=1, cpu=1.0, memory_gib=4.0, submitted_at=NOW - 100 + i)
        for i in range(6)
    ]
    pend += [
        job(f"b{i}", tenant="B", gpus=1, cpu=3.0, memory_gib=1.0, submitted_at=NOW - 100 + i)
        for i in range(6)
    ]
    d = schedule(snap(pend, hosts=[h]), policy(burst=None, fair_share={"history_weight": 0}), NOW)
    placed = {"A": 0, "B": 0}
    for a in d.placements:
        placed[a.tenant] += 1
    # DRF: A gets 3 tasks (3 CPU, 12 GiB: memory share 2/3), B gets 2 (6 CPU, 2 GiB: CPU share 2/3).
    assert placed == {"A": 3, "B": 2}
    assert abs(d.shares["A"] - 2 / 3) < 1e-9 and abs(d.shares["B"] - 2 / 3) < 1e-9


def test_weights_scale_the_share() -> None:
    from berth.scheduler.snapshot import TenantState

    h = Host("h1", "p", "V100", 6, 6, 96.0, 96.0, 960.0, 960.0)
    pend = [job(f"a{i}", tenant="A", cpu=1.0, memory_gib=1.0) for i in range(6)]
    pend += [job(f"b{i}", tenant="B", cpu=1.0, memory_gib=1.0) for i in range(6)]
    tenants = {"A": TenantState("A", weight=2.0), "B": TenantState("B", weight=1.0)}
    d = schedule(
        snap(pend, hosts=[h], tenants=tenants), policy(burst=None, fair_share={"history_weight": 0}), NOW
    )
    placed = {"A": 0, "B": 0}
    for a in d.placements:
        placed[a.tenant] += 1
    assert placed == {"A": 4, "B": 2}


def test_decayed_usage_history_lowers_priority_of_recent_heavy_users() -> None:
    from berth.scheduler.snapshot import TenantState

    h = Host("h1", "p", "V100", 1, 1, 96.0, 96.0, 960.0, 960.0)
    pend = [job("a", tenant="A", submitted_at=NOW - 100), job("b", tenant="B", submitted_at=NOW - 1)]
    day = 86400.0
    heavy = TenantState("A", usage={"gpu:V100": 1.0 * day}, usage_as_of=NOW)
    pol = policy(burst=None, fair_share={"history_weight": 0.5, "half_life_s": day})
    d = schedule(snap(pend, hosts=[h], tenants={"A": heavy}), pol, NOW)
    assert [a.job_id for a in d.placements] == ["b"]
    # Long ago, the same usage has decayed away: first come, first served again (A submitted first).
    old = TenantState("A", usage={"gpu:V100": 1.0 * day}, usage_as_of=NOW - 60 * day)
    d = schedule(snap(pend, hosts=[h], tenants={"A": old}), pol, NOW)
    assert d.shares["A"] < 1e-6
