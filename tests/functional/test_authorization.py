"""Who may do what: every route against every kind of caller (issue 6).

Members act on their own tenant only (another tenant's job answers 404, as if it did not exist;
another tenant's list or quota answers 403). Platform admins are operators: they may read, list,
follow and cancel any tenant's job and manage quotas. Unknown principals get 403, unsigned 401.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.functional.conftest import Invoke

# caller -> expected status, per route; "vision" job is alice's.
MATRIX: list[tuple[str, str, dict[str, int]]] = [
    ("GET", "/v1/jobs", {"alice": 200, "bob": 200, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs?tenant=vision", {"alice": 200, "bob": 403, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs?tenant=nlp", {"alice": 403, "bob": 200, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs/{job}", {"alice": 200, "bob": 404, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs/{job}/events", {"alice": 200, "bob": 404, "admin": 200, "mallory": 403, "": 401}),
    ("POST", "/v1/jobs/{job}/cancel", {"alice": 202, "bob": 404, "admin": 202, "mallory": 403, "": 401}),
    ("POST", "/v1/jobs", {"alice": 201, "bob": 201, "admin": 201, "mallory": 403, "": 401}),
    ("GET", "/v1/tenants/vision/quota", {"alice": 200, "bob": 403, "admin": 200, "mallory": 403, "": 401}),
    ("PUT", "/v1/tenants/vision/quota", {"alice": 403, "bob": 403, "admin": 200, "mallory": 403, "": 401}),
    ("PUT", "/v1/tenants/ghosts/quota", {"alice": 403, "bob": 403, "admin": 404, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs/{job}/explain", {"alice": 200, "bob": 404, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/capacity", {"alice": 200, "bob": 200, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/policy", {"alice": 200, "bob": 200, "admin": 200, "mallory": 403, "": 401}),
    ("PUT", "/v1/policy", {"alice": 403, "bob": 403, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/offers", {"alice": 200, "bob": 200, "admin": 200, "mallory": 403, "": 401}),
    ("PUT", "/v1/offers", {"alice": 403, "bob": 403, "admin": 422, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs/{job}/logs", {"alice": 200, "bob": 404, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/jobs/{job}/metrics", {"alice": 200, "bob": 404, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/tenants/vision/usage", {"alice": 200, "bob": 403, "admin": 200, "mallory": 403, "": 401}),
    ("GET", "/v1/tenants/ghosts/usage", {"alice": 403, "bob": 403, "admin": 404, "mallory": 403, "": 401}),
    ("GET", "/v1/usage", {"alice": 200, "bob": 200, "admin": 200, "mallory": 403, "": 401}),
    # the body `{}` lacks `drain`: 422 for an admin, members are refused first
    ("PUT", "/v1/hosts/h-1/drain", {"alice": 403, "bob": 403, "admin": 422, "mallory": 403, "": 401}),
    # the body `{}` is no admission: 422 for an admin, members are refused first
    ("PUT", "/v1/hosts/h-1/admission", {"alice": 403, "bob": 403, "admin": 422, "mallory": 403, "": 401}),
    ("GET", "/v1/circuits", {"alice": 403, "bob": 403, "admin": 200, "mallory": 403, "": 401}),
    # no circuit has a record: 404 for an admin, members are refused first
    ("DELETE", "/v1/circuits/us-east-1", {"alice": 403, "bob": 403, "admin": 404, "mallory": 403, "": 401}),
]
CALLERS = ["alice", "bob", "admin", "mallory", ""]


@pytest.mark.parametrize(("method", "route", "expected"), MATRIX, ids=[f"{m} {r}" for m, r, _ in MATRIX])
def test_route_by_caller(
    api: Invoke, spec: dict[str, Any], method: str, route: str, expected: dict[str, int]
) -> None:
    """Every caller in turn on one store (the matrix's writes are harmless to repeat: a second
    cancel, another job, the same quota); a failure names the caller."""
    _, job = api("POST", "/v1/jobs", body=spec)  # alice's, tenant vision
    path, _, query = route.format(job=job["id"]).partition("?")
    params = dict(p.split("=") for p in query.split("&")) if query else None
    body: Any = spec if path == "/v1/jobs" and method == "POST" else ({} if method == "PUT" else None)
    for caller in CALLERS:
        status, resp = api(method, path, user=caller, body=body, query=params)
        assert status == expected[caller], (caller or "unsigned", resp)
        if status >= 400:
            assert set(resp["error"]) == {"code", "message", "details"}
            continue
        if (
            path.startswith("/v1/jobs/")
            and method == "GET"
            and not path.endswith(("/events", "/explain", "/logs", "/metrics"))
        ):
            assert resp["id"] == job["id"] and resp["tenant"] == "vision"
        if path.endswith("/explain"):
            assert resp["job_id"] == job["id"] and resp["tenant"] == "vision"
        if path.endswith(("/logs", "/metrics")):
            assert resp["job_id"] == job["id"] and resp["attempt"] is None  # queued: nothing yet


def test_admin_list_of_a_tenant_holds_its_jobs_only(api: Invoke, spec: dict[str, Any]) -> None:
    _, a = api("POST", "/v1/jobs", body=spec)
    _, b = api("POST", "/v1/jobs", body=spec, user="bob")
    status, page = api("GET", "/v1/jobs", user="admin", query={"tenant": "nlp"})
    assert status == 200 and [j["id"] for j in page["jobs"]] == [b["id"]]
    status, page = api("GET", "/v1/jobs", user="admin", query={"tenant": "vision"})
    assert status == 200 and [j["id"] for j in page["jobs"]] == [a["id"]]
    status, _ = api("GET", "/v1/jobs", user="admin", query={"tenant": "Not_A_Tenant"})
    assert status == 422


def test_admin_cancel_is_recorded_with_the_admin_name(api: Invoke, spec: dict[str, Any]) -> None:
    _, job = api("POST", "/v1/jobs", body=spec)
    status, canceled = api("POST", f"/v1/jobs/{job['id']}/cancel", user="admin")
    assert status == 202 and canceled["status"] == "CANCELED" and "admin" in canceled["reason"]
