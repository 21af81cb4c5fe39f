"""The simulator replays traces through the real core; metrics and baselines behave."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from berth_tools.sim.cluster import load_cluster, parse_cluster
from berth_tools.sim.estimates import EstimateMode
from berth_tools.sim.policies import POLICY_NAMES, resolve_policy
from berth_tools.sim.runner import simulate
from berth_tools.sim.trace import TraceJob, load_trace, parse_trace, split_nodes

ROOT = Path(__file__).resolve().parents[3]
TIRESIAS = ROOT / "examples" / "traces" / "tiresias-60.csv"
SMALL = ROOT / "examples" / "clusters" / "small.yaml"
KEYS = {
    "policy",
    "jobs",
    "completed",
    "avg_wait_s",
    "p95_wait_s",
    "avg_jct_s",
    "onprem_gpu_utilization",
    "cloud_gpu_hours",
    "total_cost_usd",
    "cost_lower_bound_usd",
    "jain_fairness",
    "tenants",
}


def _synthetic(n: int = 120, tenants: int = 3) -> list[TraceJob]:
    """A bursty synthetic trace: waves of mixed jobs that exceed a 32-GPU fleet."""
    jobs = []
    for i in range(n):
        wave = i // 30
        jobs.append(
            TraceJob(
                f"s{i:03d}",
                wave * 20000.0 + (i % 30) * 60.0,
                f"t{i % tenants}",
                (1, 2, 4, 8)[i % 4],
                "V100",
                1800.0 + (i * 797) % 14000,
            )
        )
    return jobs


def _check(result: dict[str, Any], n: int) -> None:
    assert result.keys() >= KEYS
    assert result["jobs"] == result["completed"] == n
    assert 0 <= result["onprem_gpu_utilization"] <= 1
    assert result["avg_wait_s"] >= 0 and result["p95_wait_s"] >= 0 and result["avg_jct_s"] > 0
    assert 0 < result["jain_fairness"] <= 1
    assert result["total_cost_usd"] + 1e-6 >= 0
    assert sum(t["jobs"] for t in result["tenants"]) == n
    assert abs(sum(t["cost_usd"] for t in result["tenants"]) - result["total_cost_usd"]) < 0.05


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_tiresias_replays_for_every_policy(policy: str) -> None:
    trace = load_trace(TIRESIAS)
    result = simulate(trace, load_cluster(SMALL), resolve_policy(policy))
    _check(result, 60)
    assert result["policy"] == policy


def test_baselines_differ_as_expected_on_a_bursty_trace() -> None:
    trace = _synthetic()
    cluster = load_cluster(SMALL)
    r = {p: simulate(trace, cluster, resolve_policy(p)) for p in POLICY_NAMES}
    for res in r.values():
        _check(res, len(trace))
    assert r["fifo-onprem"]["total_cost_usd"] == 0 and r["fifo-onprem"]["cloud_gpu_hours"] == 0
    assert r["cloud-cheapest"]["onprem_gpu_utilization"] == 0
    assert r["cloud-cheapest"]["total_cost_usd"] > r["burst-nowait"]["total_cost_usd"] > 0
    assert r["burst-nowait"]["avg_wait_s"] < r["fifo-onprem"]["avg_wait_s"]
    assert r["berth"]["total_cost_usd"] <= r["burst-nowait"]["total_cost_usd"]
    assert r["berth"]["avg_jct_s"] < r["fifo-onprem"]["avg_jct_s"]
    assert r["berth"]["cost_lower_bound_usd"] <= r["berth"]["total_cost_usd"]


def test_simulation_is_deterministic() -> None:
    trace = _synthetic(60)
    cluster = load_cluster(SMALL)
    a = simulate(trace, cluster, resolve_policy("berth"))
    b = simulate(trace, cluster, resolve_policy("berth"))
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert a == b


def test_spot_interruptions_requeue_and_lose_only_unsaved_work() -> None:
    cluster = parse_cluster(
        {
            "pools": [],
            "cloud": {
                "regions": ["us-east-1"],
                "gpu_types": ["V100"],
                "startup_delay_s": 0,
                "spot": {"interruptions_per_hour": 2.0, "seed": 3},
            },
            "jobs": {"checkpoint_interval_s": 600},
        }
    )
    trace = [TraceJob(f"j{i}", 0.0, "t", 1, "V100", 7200.0) for i in range(10)]
    result = simulate(trace, cluster, resolve_policy("cloud-cheapest"))
    _check(result, 10)
    assert result["spot_interruptions"] > 0
    # Each interruption loses less than one checkpoint interval; the rest of the work is kept.
    assert result["avg_jct_s"] < 7200 + result["spot_interruptions"] / 10 * 600 + 600
    assert result["cloud_gpu_hours"] >= 20.0


def test_trace_parsing_and_node_split() -> None:
    jobs = parse_trace("job_id,submit_s,tenant,gpus,gpu_type,duration_s\nb,5,t,2,V100,10\na,1,t,1,V100,5\n")
    assert [j.job_id for j in jobs] == ["a", "b"]
    with pytest.raises(ValueError, match="lacks columns"):
        parse_trace("job_id,submit_s\n")
    assert (split_nodes(8, 8), split_nodes(16, 8), split_nodes(12, 8), split_nodes(20, 8)) == (1, 2, 2, 4)


def test_cost_lower_bound_counts_overflow_at_cheapest_gpu_hour() -> None:
    cluster = parse_cluster(
        {
            "pools": [{"name": "p", "hosts": 1, "gpu_type": "V100", "gpus_per_host": 8}],
            "cloud": {"regions": ["us-east-1"], "gpu_types": ["V100"]},
        }
    )
    # 16 GPUs for the whole 10-hour span: 8 fit on-prem, 80 GPU-hours must go elsewhere.
    trace = [TraceJob("a", 0, "t", 16, "V100", 36000.0), TraceJob("b", 36000.0, "t", 1, "V100", 0.0)]
    result = simulate(trace, cluster, resolve_policy("berth"))
    # Cheapest V100 GPU-hour in us-east-1 in the catalog: p3.16xlarge spot 2.7531 / 8.
    assert result["cost_lower_bound_usd"] == pytest.approx(80 * 2.7531 / 8, rel=1e-3)


def _cloud_only() -> Any:
    return parse_cluster(
        {
            "pools": [],
            "cloud": {
                "regions": ["us-east-1"],
                "gpu_types": ["V100"],
                "startup_delay_s": 0,
                "spot": {"interruptions_per_hour": 0.0, "seed": 1},
            },
            "jobs": {"checkpoint_interval_s": 600},
        }
    )


def test_shared_cloud_instances_stay_within_capacity_and_are_paid_until_the_last_job_leaves() -> None:
    from berth.scheduler.policy import load_policy
    from berth_tools.sim.engine import Simulator
    from berth_tools.sim.metrics import summarise
    from berth_tools.sim.policies import BUILTIN

    cluster = _cloud_only()
    # Eight 1-GPU jobs at once (one runs 2 h), then one more while the instance still runs.
    trace = [TraceJob(f"j{i}", 0.0, "t", 1, "V100", 7200.0 if i == 0 else 3600.0) for i in range(8)]
    trace.append(TraceJob("late", 4000.0, "t", 1, "V100", 1000.0))
    packing = load_policy({**BUILTIN["cloud-cheapest"], "burst": {"tenants": ["*"], "pack_instances": True}})
    # Mechanics of shared instances, with run times known (the oracle), so the packing is fixed.
    sim = Simulator(trace, cluster, packing, EstimateMode.ORACLE)
    seen: list[int] = []
    join = sim.cloud.join

    def checked_join(a: Any, job_id: str, gpus: int, cpu: float, mem: float, now: float) -> Any:
        inst = join(a, job_id, gpus, cpu, mem, now)
        assert 0 <= inst.free_gpus <= inst.offer.gpus
        assert inst.free_cpu >= -1e-9 and inst.free_memory_gib >= -1e-9
        seen.append(inst.offer.gpus - inst.free_gpus)
        return inst

    sim.cloud.join = checked_join  # type: ignore[method-assign]
    state = sim.run()
    result = summarise(trace, cluster, packing, state)
    _check(result, 9)
    # One p3.16xlarge (spot 2.7531 USD/h in use1-az5) holds all nine jobs, never more than 8 GPUs,
    # and is paid from launch until its last job leaves (2 h), idle slots included.
    assert state.instances_launched == 1 and max(seen) == 8 and state.max_instance_gpus_used <= 8
    assert not sim.cloud.instances
    assert result["total_cost_usd"] == pytest.approx(2 * 2.7531, rel=1e-3)
    # The late job used a free slot of the running instance: no start-up, no new instance.
    assert state.jobs["late"].first_start_s == 4000.0

    # The baseline launches the cheapest instance for each job alone (p3.2xlarge spot, 0.5197 USD/h)
    # and pays it until that job leaves.
    base = simulate(trace, cluster, resolve_policy("cloud-cheapest"), EstimateMode.ORACLE)
    _check(base, 9)
    gpu_h = 2 + 7 * 1 + 1000 / 3600
    assert base["total_cost_usd"] == pytest.approx(gpu_h * 0.5197, rel=1e-3)
