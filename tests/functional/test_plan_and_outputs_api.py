"""``POST /v1/jobs/plan`` (a dry run: the same 4xx as a submit, the scheduler core's outcome, nothing
written) and ``GET /v1/jobs/{id}/outputs`` (a job's output prefix, listed and presigned, tenant-checked,
paginated), through the API Lambda on moto."""

from __future__ import annotations

import urllib.parse
from typing import Any

import boto3
import pytest

from berth.scheduler.outcomes import Rule
from tests.functional.conftest import BUCKETS, TABLES, Invoke
from tests.functional.test_fleet_api import _register


@pytest.fixture
def fleet(api: Invoke) -> Invoke:
    _register("v100-a", "V100", 8)
    _register("a100-a", "A100", 8, pool="lab")
    return api


def _items() -> dict[str, list[Any]]:
    """Every item of every table, but the per-request rate counters (``RATE#``), which every request
    of a tenant writes by design (docs/security.md, "Abuse limits")."""
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    out: dict[str, list[Any]] = {}
    for table in TABLES.values():
        items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
        out[table] = sorted(
            (i for i in items if not i.get("pk", {}).get("S", "").startswith("RATE#")), key=repr
        )
    return out


def test_plan_places_on_prem_prices_it_and_writes_nothing(fleet: Invoke, spec: dict[str, Any]) -> None:
    quota_before = fleet("GET", "/v1/tenants/vision/quota")[1]
    before = _items()
    body = {**spec, "constraints": {"placement": "onprem", "max_cost_usd": 40}}
    status, plan = fleet("POST", "/v1/jobs/plan", body=body)
    assert status == 200, plan
    assert plan["outcome"] == "onprem" and plan["stored"] is False
    assert plan["summary"].startswith("placed on-prem in pool default on v100-a")
    # on-prem: the policy's internal rate (1 USD per GPU-hour by default) for its 4 GPUs
    assert plan["hourly_usd"] == pytest.approx(4.0)
    assert plan["limits"]["max_cost_usd"] == 40 and plan["limits"]["timeout_minutes"] == 1440
    rows = {c["site"]: c for c in plan["explanation"]["candidates"]}
    assert rows["onprem:lab/A100"]["rule"] == Rule.GPU_TYPE
    assert _items() == before
    assert fleet("GET", "/v1/tenants/vision/quota")[1] == quota_before
    assert fleet("GET", "/v1/jobs")[1]["jobs"] == []


def test_plan_says_why_it_would_wait_and_what_bursting_would_cost(
    fleet: Invoke, spec: dict[str, Any]
) -> None:
    from berth.dal.hosts import DynamoHostRepository

    hosts = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    rec = hosts.get("v100-a")
    assert rec is not None
    hosts.hold("v100-a", "j-other#1", rec.free_gpu_ids, 1, 1)
    status, plan = fleet("POST", "/v1/jobs/plan", body={**spec, "expected_duration_minutes": 10})
    assert status == 200, plan
    # the default policy waits for on-prem before it bursts: 30 % of the predicted run time, at
    # least policy.burst.min_wait_s (600 s)
    assert plan["outcome"] == "pending"
    assert Rule.CAPACITY in plan["explanation"]["rules"] and Rule.BURST_WAIT in plan["explanation"]["rules"]
    assert "may burst in 10 min" in plan["summary"], plan["summary"]
    cloud = [c["hourly_usd"] for c in plan["explanation"]["candidates"] if c["site"].startswith("cloud:")]
    assert plan["hourly_usd"] == min(p for p in cloud if p is not None)


def test_plan_of_an_array_plans_one_task(fleet: Invoke, spec: dict[str, Any]) -> None:
    sweep = {
        **spec,
        "command": ["python3", "train.py", "--lr", "{lr}"],
        "constraints": {"placement": "onprem"},
        "array": {"parameters": [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]},
    }
    status, plan = fleet("POST", "/v1/jobs/plan", body=sweep)
    assert status == 200, plan
    assert plan["tasks"] == 3 and plan["outcome"] == "onprem"
    assert fleet("GET", "/v1/jobs")[1]["jobs"] == []


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"resources": {"gpu_type": "H200", "gpus": 1}}, 422, "Infeasible"),
        ({"gpu": 4}, 422, "ValidationError"),
        ({"command": "python train.py && sh"}, 422, "ValidationError"),
        ({"data": [{"source": "s3://berth-data/nlp/x/", "mount": "/data"}]}, 403, "Forbidden"),
        (
            {"array_task": {"array_id": "j-" + "0" * 26, "index": 0, "size": 1, "params": {}}},
            400,
            "BadRequest",
        ),
    ],
)
def test_bad_specs_get_the_same_answer_as_submit(
    fleet: Invoke, spec: dict[str, Any], change: dict[str, Any], status: int, code: str
) -> None:
    body = {**spec, **change}
    submitted = fleet("POST", "/v1/jobs", body=body)
    planned = fleet("POST", "/v1/jobs/plan", body=body)
    assert planned[0] == submitted[0] == status, (planned, submitted)
    assert planned[1]["error"]["code"] == submitted[1]["error"]["code"]
    assert planned[1]["error"]["code"] == code


def test_plan_needs_a_known_caller(fleet: Invoke, spec: dict[str, Any]) -> None:
    status, err = fleet("POST", "/v1/jobs/plan", body=spec, user="mallory")
    assert status == 403, err


def _put(key: str, body: bytes) -> None:
    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket=BUCKETS["BERTH_DATA_BUCKET"], Key=key, Body=body
    )


def test_outputs_lists_and_presigns_the_jobs_own_prefix_only(api: Invoke, spec: dict[str, Any]) -> None:
    job = api("POST", "/v1/jobs", body=spec)[1]
    other = api("POST", "/v1/jobs", body=spec)[1]
    prefix = f"vision/jobs/{job['id']}/"
    _put(prefix + "outputs/model.pt", b"weights")
    _put(prefix + "checkpoints/step-10.pt", b"ckpt")
    _put(f"vision/jobs/{other['id']}/outputs/other.pt", b"not this job's")
    _put("vision/data/train.csv", b"the team's data")
    status, out = api("GET", f"/v1/jobs/{job['id']}/outputs")
    assert status == 200, out
    assert out["location"] == f"s3://berth-data/{prefix}"
    assert out["outputs"] == f"s3://berth-data/{prefix}outputs/"
    assert out["checkpoints"] == f"s3://berth-data/{prefix}checkpoints/"
    assert [(o["path"], o["size"]) for o in out["objects"]] == [
        ("checkpoints/step-10.pt", 4),
        ("outputs/model.pt", 7),
    ]
    assert out["next_token"] is None
    url = urllib.parse.urlsplit(out["objects"][1]["url"])
    assert url.path.endswith(f"/{prefix}outputs/model.pt") and "X-Amz-Signature" in url.query


def test_outputs_paginate(api: Invoke, spec: dict[str, Any]) -> None:
    job = api("POST", "/v1/jobs", body=spec)[1]
    for i in range(5):
        _put(f"vision/jobs/{job['id']}/outputs/{i}.txt", b"x")
    seen: list[str] = []
    token: str | None = None
    while True:
        query = {"limit": "2", **({"next_token": token} if token else {})}
        status, out = api("GET", f"/v1/jobs/{job['id']}/outputs", query=query)
        assert status == 200, out
        seen += [o["path"] for o in out["objects"]]
        token = out["next_token"]
        if token is None:
            break
    assert seen == [f"outputs/{i}.txt" for i in range(5)]


def test_outputs_have_the_same_tenant_check_as_get(api: Invoke, spec: dict[str, Any]) -> None:
    job = api("POST", "/v1/jobs", body=spec)[1]
    _put(f"vision/jobs/{job['id']}/outputs/model.pt", b"weights")
    status, err = api("GET", f"/v1/jobs/{job['id']}/outputs", user="bob")
    assert status == 404 and err["error"]["code"] == "NotFound"
    assert len(api("GET", f"/v1/jobs/{job['id']}/outputs", user="admin")[1]["objects"]) == 1
    assert api("GET", "/v1/jobs/j-00000000000000000000000000/outputs")[0] == 404
    assert api("GET", "/v1/jobs/bad/outputs")[0] == 422
    # a token is a key under the job's own prefix: one naming another prefix lists nothing of it
    status, out = api("GET", f"/v1/jobs/{job['id']}/outputs", query={"next_token": "../../../nlp/"})
    assert status == 200 and all(o["key"].startswith(f"vision/jobs/{job['id']}/") for o in out["objects"])
    assert api("GET", f"/v1/jobs/{job['id']}/outputs", query={"next_token": "\x1b"})[0] == 400
