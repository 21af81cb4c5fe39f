"""The API Lambda on moto: routes, tenancy, idempotency, bad input (4xx, nothing stored)."""

from __future__ import annotations

import json
from typing import Any

import boto3

from tests.functional.conftest import TABLES, Invoke


def stored_jobs() -> int:
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    return int(ddb.scan(TableName=TABLES["BERTH_JOBS_TABLE"], Select="COUNT")["Count"])


def test_submit_get_list_cancel_events(api: Invoke, spec: dict[str, Any]) -> None:
    status, job = api("POST", "/v1/jobs", body=spec)
    assert status == 201
    assert job["status"] == "QUEUED" and job["tenant"] == "vision" and job["owner"].endswith("user/alice")
    assert set(job) >= {
        "id",
        "tenant",
        "owner",
        "status",
        "reason",
        "spec",
        "created_at",
        "updated_at",
        "site",
        "placement",
        "attempts",
        "cost_usd",
    }
    assert job["spec"]["resources"]["gpus"] == 4

    status, got = api("GET", f"/v1/jobs/{job['id']}")
    # The submit answer also says which resource defaults it applied (a fact of the submit only).
    assert job.pop("defaults_applied") == ["resources.cpu", "resources.memory_gib"]
    assert status == 200 and got == job

    status, page = api("GET", "/v1/jobs")
    assert status == 200 and [j["id"] for j in page["jobs"]] == [job["id"]] and page["next_token"] is None

    status, canceled = api("POST", f"/v1/jobs/{job['id']}/cancel")
    assert status == 202 and canceled["status"] == "CANCELED" and "alice" in canceled["reason"]
    status, again = api("POST", f"/v1/jobs/{job['id']}/cancel")
    assert status == 202 and again["status"] == "CANCELED"

    status, hist = api("GET", f"/v1/jobs/{job['id']}/events")
    assert status == 200
    assert [(e["from"], e["to"]) for e in hist["events"]] == [(None, "QUEUED"), ("QUEUED", "CANCELED")]
    assert all(set(e) == {"at", "from", "to", "reason"} for e in hist["events"])


def test_tenant_isolation(api: Invoke, spec: dict[str, Any]) -> None:
    _, job = api("POST", "/v1/jobs", body=spec)
    for method, path in [
        ("GET", f"/v1/jobs/{job['id']}"),
        ("POST", f"/v1/jobs/{job['id']}/cancel"),
        ("GET", f"/v1/jobs/{job['id']}/events"),
    ]:
        status, body = api(method, path, user="bob")
        assert status == 404 and body["error"]["code"] == "NotFound", (method, path)
    _, bobs = api("GET", "/v1/jobs", user="bob")
    assert bobs["jobs"] == []
    _, still = api("GET", f"/v1/jobs/{job['id']}")
    assert still["status"] == "QUEUED"


def test_pagination_and_status_filter(api: Invoke, spec: dict[str, Any]) -> None:
    ids = [api("POST", "/v1/jobs", body={**spec, "name": f"job-{i}"})[1]["id"] for i in range(5)]
    api("POST", f"/v1/jobs/{ids[0]}/cancel")
    seen: list[str] = []
    token = None
    while True:
        status, page = api(
            "GET", "/v1/jobs", query={"limit": "2", **({"next_token": token} if token else {})}
        )
        assert status == 200
        seen += [j["id"] for j in page["jobs"]]
        token = page["next_token"]
        if not token:
            break
    assert seen == ids[::-1]
    _, canceled = api("GET", "/v1/jobs", query={"status": "CANCELED"})
    assert [j["id"] for j in canceled["jobs"]] == [ids[0]]
    _, queued = api("GET", "/v1/jobs", query={"status": "QUEUED", "limit": "100"})
    assert len(queued["jobs"]) == 4


def test_next_token_cannot_cross_tenants(api: Invoke, spec: dict[str, Any]) -> None:
    for i in range(3):
        api("POST", "/v1/jobs", body={**spec, "name": f"job-{i}"})
    _, page = api("GET", "/v1/jobs", query={"limit": "1"})
    status, body = api("GET", "/v1/jobs", user="bob", query={"next_token": page["next_token"]})
    assert status == 400 and "next_token" in body["error"]["message"]
    status, body = api("GET", "/v1/jobs", query={"next_token": page["next_token"], "status": "QUEUED"})
    assert status == 400


def test_idempotency_key(api: Invoke, spec: dict[str, Any]) -> None:
    h = {"Idempotency-Key": "train-2026-11-29"}
    s1, a = api("POST", "/v1/jobs", body=spec, headers=h)
    s2, b = api("POST", "/v1/jobs", body=spec, headers=h)
    assert s1 == s2 == 201 and a["id"] == b["id"]
    assert stored_jobs() == 1
    s3, c = api("POST", "/v1/jobs", body={**spec, "name": "other"}, headers=h)
    assert s3 == 409 and c["error"]["code"] == "IdempotencyKeyReused"
    # The same key in another tenant is another request.
    s4, d = api("POST", "/v1/jobs", body=spec, headers=h, user="bob")
    assert s4 == 201 and d["id"] != a["id"] and d["tenant"] == "nlp"
    assert stored_jobs() == 2
    s5, _ = api("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": "x" * 500})
    assert s5 == 400


def test_bad_input_is_4xx_and_stores_nothing(api: Invoke, spec: dict[str, Any]) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"raw_body": "{not json"}, 400, "not valid JSON"),
        ({"raw_body": ""}, 422, "required"),
        ({"body": {**spec, "gpu": 2}}, 422, "gpu: unknown field"),
        ({"body": {**spec, "command": "python train.py && rm -rf /"}}, 422, "not a shell string"),
        ({"body": {**spec, "resources": {"gpus": 1000}}}, 422, "resources.gpus"),
        ({"body": [1, 2]}, 422, ""),
        (
            {"raw_body": '{"name": "x", "image": "busybox", "env": {"A": "' + "x" * 70_000 + '"}}'},
            400,
            "larger than",
        ),
    ]
    for kw, status, needle in cases:
        got, body = api("POST", "/v1/jobs", **kw)
        assert got == status, (kw.keys(), body)
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
        assert needle in body["error"]["message"], body
    assert stored_jobs() == 0


def test_bad_ids_and_routes(api: Invoke) -> None:
    assert api("GET", "/v1/jobs/j-01m8mqjbkdv5w4957pgbyz12fk")[0] == 404
    assert api("GET", "/v1/jobs/not-an-id")[0] == 422
    assert api("GET", "/v1/jobs", query={"status": "DONE"})[0] == 422
    assert api("GET", "/v1/jobs", query={"limit": "1000"})[0] == 422
    assert api("DELETE", "/v1/jobs")[0] in (404, 405)


def test_identity_rules(api: Invoke) -> None:
    status, body = api("GET", "/v1/jobs", user="mallory")
    assert status == 403 and "not a member" in body["error"]["message"]
    status, body = api("GET", "/v1/jobs", user="")
    assert status == 401


def test_quota_admin_only_and_enforced(api: Invoke, spec: dict[str, Any]) -> None:
    assert api("GET", "/v1/tenants/vision/quota")[0] == 200
    assert api("GET", "/v1/tenants/nlp/quota")[0] == 403
    status, body = api("PUT", "/v1/tenants/vision/quota", body={"max_active_jobs": 1})
    assert status == 403 and body["error"]["code"] == "Forbidden"
    assert api("PUT", "/v1/tenants/ghost/quota", user="admin", body={})[0] == 404
    assert api("PUT", "/v1/tenants/vision/quota", user="admin", body={"gpus": {"Z80": {}}})[0] == 422
    status, q = api(
        "PUT",
        "/v1/tenants/vision/quota",
        user="admin",
        body={"max_active_jobs": 1, "gpus": {"V100": {"guaranteed": 16, "borrow_limit": 8}}, "weight": 2},
    )
    assert status == 200 and q["gpus"]["V100"]["guaranteed"] == 16
    assert api("GET", "/v1/tenants/vision/quota", user="admin")[1] == q
    assert api("POST", "/v1/jobs", body=spec)[0] == 201
    status, body = api("POST", "/v1/jobs", body=spec)
    assert status == 429 and body["error"]["code"] == "QuotaExceeded"


def test_unparseable_bodies_are_400_not_5xx(api: Invoke) -> None:
    import base64

    deep = "[" * 5000 + "]" * 5000
    status, body = api("POST", "/v1/jobs", raw_body=deep)
    assert status == 400 and "nested" in body["error"]["message"]
    from berth.handlers import api as api_module
    from tests.functional.conftest import EVENTS, FakeContext

    event = json.loads((EVENTS / "apigw_submit_job.json").read_text())
    event["body"] = base64.b64encode(b"\xff\xfe{not utf8").decode()
    event["isBase64Encoded"] = True
    resp = api_module.lambda_handler(event, FakeContext())  # type: ignore[arg-type]
    assert resp["statusCode"] == 400 and "UTF-8" in json.loads(resp["body"])["error"]["message"]
    assert stored_jobs() == 0


def test_forged_next_token_is_400(api: Invoke, spec: dict[str, Any]) -> None:
    import base64

    forged = {
        "t": "vision",
        "s": None,
        "k": {"job_id": {"S": ""}, "created_key": {"S": ""}, "tenant": {"S": "vision"}},
    }
    token = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
    status, _ = api("GET", "/v1/jobs", query={"next_token": token})
    assert status == 400


def test_active_job_counter_follows_cancel(api: Invoke, spec: dict[str, Any]) -> None:
    api("PUT", "/v1/tenants/vision/quota", user="admin", body={"max_active_jobs": 2})
    a = api("POST", "/v1/jobs", body=spec)[1]
    api("POST", "/v1/jobs", body=spec)
    assert api("POST", "/v1/jobs", body=spec)[0] == 429
    api("POST", f"/v1/jobs/{a['id']}/cancel")
    api("POST", f"/v1/jobs/{a['id']}/cancel")  # repeating the cancel must not release twice
    assert api("POST", "/v1/jobs", body=spec)[0] == 201
    assert api("POST", "/v1/jobs", body=spec)[0] == 429
