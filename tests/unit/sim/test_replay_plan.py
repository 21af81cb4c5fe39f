"""`berth bench replay`'s plan: what the simulator and the compressed service are both told."""

from __future__ import annotations

from dataclasses import replace

import pytest

from berth.scheduler.policy import load_policy
from berth_tools.bench.replay import (
    SERVICE_CLOUD_START_S,
    SERVICE_PASS_S,
    ReplayError,
    job_spec,
    plan,
    scaled_policy,
)
from berth_tools.sim.cluster import load_cluster, parse_cluster
from berth_tools.sim.policies import resolve_policy
from berth_tools.sim.trace import TraceJob

CLUSTER = "examples/clusters/replay-a10g.yaml"


def trace(n: int = 4, tenants: tuple[str, ...] = ("default",)) -> list[TraceJob]:
    return [
        TraceJob(f"t{i}", 30.0 * i, tenants[i % len(tenants)], 1 + i % 2, "A10G", 120.0 + i, "ResNet-50")
        for i in range(n)
    ]


def test_both_sides_get_the_same_limits_and_the_services_latencies() -> None:
    p = plan(trace(), load_cluster(CLUSTER), resolve_policy("berth"), 10.0)
    # The spec's whole minutes, stretched back by the factor, is the simulator's timeout.
    assert p.timeout_minutes == 1 and p.cluster.jobs.timeout_s == 600.0
    assert p.cluster.pass_interval_s == SERVICE_PASS_S * 10
    assert p.cluster.cloud.startup_delay_s == SERVICE_CLOUD_START_S * 10
    assert {t.tenant for t in p.trace} == {"vision"} and p.tenants == {"default": ("alice", "vision")}
    spec = job_spec(p.trace[3], p, 3.0, 12.0)
    assert spec["name"] == "resnet-50" and spec["command"] == ["sleep", "12.30"]
    assert spec["resources"] == {"gpu_type": "A10G", "gpus": 2, "cpu": 6.0, "memory_gib": 24.0}
    assert spec["timeout_minutes"] == 1


def test_the_stored_policy_compresses_durations_and_money_thresholds_not_rates() -> None:
    doc = scaled_policy(resolve_policy("berth"), 10.0)
    assert doc["burst"]["min_wait_s"] == 60.0 and doc["burst"]["max_wait_s"] == 8640.0
    assert doc["burst"]["wait_fraction"] == 0.3  # a ratio
    assert doc["repatriation"]["min_saving_usd"] == 0.5
    assert doc["runtime"]["wait_q"] == 0.8
    assert load_policy(doc).preemption.min_runtime_s == 60.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"factor": 0.5}, "compresses time"),
        ({"gpu": "V100"}, "GPU model"),
        ({"tenants": ("a", "b", "c")}, "at most 2 tenants"),
        ({"cluster": {"tenants": {"vision": {"weight": 2}}}}, "quotas are not replayed"),
        ({"cluster": {"cloud": {"spot": {"interruptions_per_hour": 1}}}}, "spot interruptions"),
        ({"gpus": 16}, "larger than one host"),
    ],
)
def test_what_the_local_cloud_cannot_replay_is_refused_clearly(change: dict, message: str) -> None:
    jobs = trace(3, change.get("tenants", ("default",)))
    if "gpu" in change:
        jobs = [replace(t, gpu_type=change["gpu"]) for t in jobs]
    if "gpus" in change:
        jobs = [replace(jobs[0], gpus=change["gpus"])]
    base = load_cluster(CLUSTER).model_dump()
    for k, v in change.get("cluster", {}).items():
        base[k] = {**base[k], **v} if isinstance(base.get(k), dict) and k != "tenants" else v
    with pytest.raises(ReplayError, match=message):
        plan(jobs, parse_cluster(base), resolve_policy("berth"), change.get("factor", 10.0))
