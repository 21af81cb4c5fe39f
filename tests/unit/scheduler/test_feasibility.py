"""Submit-time feasibility: refuse with the rule that forbids the job."""

from __future__ import annotations

from berth.domain.job_spec import JobSpec
from berth.scheduler import check_feasible
from berth.scheduler.outcomes import Rule
from berth.scheduler.snapshot import TenantState

from .helpers import host, job, offer, policy


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
