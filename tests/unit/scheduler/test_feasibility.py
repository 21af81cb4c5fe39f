"""Submit-time feasibility: refuse with the rule that forbids the job."""

from __future__ import annotations

from typing import Any

import pytest

from berth.domain.job_spec import JobSpec, PlacementConstraint
from berth.scheduler import check_feasible, schedule
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.eligibility import instances_for
from berth.scheduler.outcomes import Rule
from berth.scheduler.snapshot import CloudOffer, Host, TenantState

from .helpers import NOW, host, job, offer, policy, snap


def spec(**kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "image": "python:3.11", **kw})


def test_feasible_job_passes() -> None:
    assert (
        check_feasible(spec(resources={"gpu_type": "V100", "gpus": 8}), "a", policy(), [host("h1")], [])
        is None
    )


def test_too_big_for_fleet_but_cloud_ok() -> None:
    s = spec(resources={"gpu_type": "V100", "gpus": 16, "nodes": 2})
    assert check_feasible(s, "a", policy(), [host("h1")], [offer(itype="p3.16xlarge", gpus=8)]) is None


def test_onprem_only_job_too_big_names_capacity() -> None:
    s = spec(resources={"gpu_type": "V100", "gpus": 16, "nodes": 2}, constraints={"placement": "onprem"})
    res = check_feasible(s, "a", policy(), [host("h1")], [offer()])
    assert res is not None and res.rule == "capacity"


def test_residency_forbids_cloud_for_a_job_the_fleet_cannot_hold() -> None:
    pol = policy(residency=[{"dataset_prefix": "s3://secret/", "onprem_only": True}])
    s = spec(resources={"gpu_type": "H100", "gpus": 8}, data=[{"source": "s3://secret/d", "mount": "/data"}])
    res = check_feasible(s, "a", pol, [host("h1")], [offer(gpu="H100", gpus=8, itype="p5.48xlarge")])
    assert res is not None and res.rule is Rule.RESIDENCY
    assert res.details[-1].subject == "residency[dataset s3://secret/]"
    assert "keeps the job on-prem" in res.message


def test_cloud_job_constraints_name_their_rule() -> None:
    offers = [offer(od=3.06, spot=None)]
    s = spec(
        resources={"gpu_type": "V100", "gpus": 1}, constraints={"placement": "cloud", "max_hourly_usd": 1}
    )
    res = check_feasible(s, "a", policy(), [host("h1")], offers)
    assert res is not None and res.rule == "job.max_hourly_usd"
    s = spec(resources={"gpu_type": "V100", "gpus": 1}, constraints={"placement": "cloud"})
    res = check_feasible(s, "b", policy(burst={"tenants": ["a"]}), [host("h1")], offers)
    assert res is not None and res.rule == "policy.burst.tenants"
    res = check_feasible(s, TenantState("a", monthly_budget_usd=10), policy(), [], offers)
    assert res is not None and res.rule == "tenant.monthly_budget_usd"


def test_quota_smaller_than_job() -> None:
    t = TenantState("a", guaranteed_gpus={"V100": 2}, borrow_limit_gpus={"V100": 2})
    s = spec(resources={"gpu_type": "V100", "gpus": 8}, constraints={"placement": "onprem"})
    res = check_feasible(s, t, policy(), [host("h1")], [])
    assert res is not None and res.rule == "tenant.quota"


def test_pending_job_accepted_directly() -> None:
    assert check_feasible(job("x", gpus=2), "a", policy(), [host("h1")], []) is None


# -- shapes that exist: a node's share fits one host or one instance ----------------------------------

P4D = CloudOffer("us-east-1", "use1-az1", "p4d.24xlarge", "A100", 8, 96.0, 1152.0, 32.77, 9.8)
A100_HOST = Host("a1", "p1", "A100", 8, 8, 128.0, 128.0, 1024.0, 1024.0)
A100_HOST_2 = Host("a2", "p1", "A100", 8, 8, 128.0, 128.0, 1024.0, 1024.0)


@pytest.mark.parametrize(
    ("resources", "placement", "rule"),
    [
        # fits on-prem only (CPU per node above any instance's vCPUs)
        ({"gpus": 8, "cpu": 120, "memory_gib": 500}, "auto", None),
        ({"gpus": 8, "cpu": 120, "memory_gib": 500}, "cloud", Rule.SHAPE),
        # fits the cloud only (memory per node above any host's)
        ({"gpus": 8, "cpu": 64, "memory_gib": 1100}, "auto", None),
        ({"gpus": 8, "cpu": 64, "memory_gib": 1100}, "onprem", Rule.SHAPE),
        # fits neither: 64 GPUs on one node (was: eight p4d instances for one container)
        ({"gpus": 64, "nodes": 1}, "auto", Rule.SHAPE),
        ({"gpus": 16, "nodes": 1}, "cloud", Rule.SHAPE),
        # multi-node: 8 nodes of 8 fit the cloud (one instance each); on-prem has 2 hosts
        ({"gpus": 64, "nodes": 8, "cpu": 64, "memory_gib": 512}, "auto", None),
        ({"gpus": 64, "nodes": 8, "cpu": 64, "memory_gib": 512}, "onprem", Rule.CAPACITY),
        ({"gpus": 16, "nodes": 2, "cpu": 64, "memory_gib": 512}, "onprem", None),
        # multi-node whose node is bigger than anything
        ({"gpus": 32, "nodes": 2}, "auto", Rule.SHAPE),
    ],
)
def test_a_nodes_share_must_fit_one_host_or_instance(
    resources: dict[str, Any], placement: str, rule: Rule | None
) -> None:
    s = spec(resources={"gpu_type": "A100", **resources}, constraints={"placement": placement})
    res = check_feasible(s, "a", policy(), [A100_HOST, A100_HOST_2], [P4D])
    assert (None if res is None else res.rule) == rule, res


def test_shape_refusal_names_the_largest_shape() -> None:
    s = spec(resources={"gpu_type": "A100", "gpus": 64, "nodes": 1})
    res = check_feasible(s, "a", policy(), [A100_HOST], [P4D])
    assert res is not None and res.rule is Rule.SHAPE and res.largest is not None
    assert (
        "the largest A100 shape is 8 GPUs, 96 vCPUs, 1152 GiB per node (p4d.24xlarge) / "
        "8 GPUs, 128 CPUs, 1024 GiB per on-prem host" in res.message
    )
    assert res.largest.to_dict()["cloud"]["where"] == "p4d.24xlarge"
    # no shape exists at all for the model: GPU type, and no largest shape is named
    res = check_feasible(spec(resources={"gpu_type": "H200", "gpus": 1}), "a", policy(), [A100_HOST], [P4D])
    assert res is not None and res.rule is Rule.GPU_TYPE and res.largest is None


def test_instances_hold_whole_nodes() -> None:
    assert instances_for(job("x", gpu_type="A100", gpus=64), P4D) is None
    assert instances_for(job("x", gpu_type="A100", gpus=64, nodes=8, cpu=64, memory_gib=512), P4D) == 8
    # a gang is an AWS Batch multi-node parallel job: one instance per node, even where one would
    # hold two nodes
    assert instances_for(job("x", gpu_type="A100", gpus=8, nodes=2, cpu=48, memory_gib=512), P4D) == 2
    assert instances_for(job("x", gpu_type="A100", gpus=8, nodes=2, cpu=97, memory_gib=512), P4D) is None
    assert instances_for(job("x", gpu_type="A100", gpus=8, cpu=97, memory_gib=10), P4D) is None


def test_the_pass_never_spreads_a_node_across_instances() -> None:
    big = job("big", gpu_type="A100", gpus=64, placement=PlacementConstraint.CLOUD)
    gang = job("gang", gpu_type="A100", gpus=16, nodes=2, cpu=64, memory_gib=512)
    d = schedule(snap([big, gang], offers=[P4D], tenants={"a": TenantState("a")}), policy(), NOW)
    placed_ids = {a.job_id for a in d.placements}
    assert "big" not in placed_ids and d.outcomes["big"].steps[-1].rule is Rule.SHAPE
    placed = d.outcomes["gang"].placed
    assert isinstance(placed, CloudAssignment) and placed.instances == 2


def test_a_tiny_cpu_or_memory_request_does_not_overflow() -> None:
    tiny = job("x", gpu_type="A100", gpus=8, cpu=5e-324, memory_gib=5e-324)
    assert instances_for(tiny, P4D) == 1
    s = spec(resources={"gpu_type": "A100", "gpus": 8, "cpu": 5e-324, "memory_gib": 5e-324})
    assert check_feasible(s, "a", policy(), [A100_HOST], [P4D]) is None
