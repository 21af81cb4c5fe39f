"""A short fuzz run over the published OpenAPI document (docs/openapi.json) against the API Lambda.

Schemathesis generates requests from the document alone; two properties hold:
- positive: a request the document calls valid is accepted (the schema is never looser than the
  server, so a client generated from it never sends what the server refuses), and a quota reads
  back as it was sent;
- negative: a request that breaks the document gets a 4xx in the error shape with a status the
  document lists for that operation, never a 5xx, and stores nothing.
`make fuzz` runs the same with many more examples (BERTH_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode

from berth.scheduler.outcomes import Rule
from tests.functional.conftest import Invoke
from tests.functional.test_api import stored_jobs

DOC = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())
SCHEMA = schemathesis.openapi.from_dict(DOC)
EXAMPLES = int(os.environ.get("BERTH_FUZZ_EXAMPLES", "20"))
SHORT_RUN = "BERTH_FUZZ_EXAMPLES" not in os.environ
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=SHORT_RUN,  # the short run in `make test` is reproducible
    # Shrinking a failure against the Lambda can take minutes; the short run reports it unshrunk
    # (`make fuzz` shrinks).
    phases=[p for p in Phase if p is not Phase.shrink] if SHORT_RUN else list(Phase),
    suppress_health_check=list(HealthCheck),
)
OPERATIONS = [
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("GET", "/v1/tenants/{tenant}/quota"),
    ("PUT", "/v1/tenants/{tenant}/quota"),
    ("GET", "/v1/jobs/{job_id}/explain"),
    ("GET", "/v1/policy"),
    ("PUT", "/v1/policy"),
    ("PUT", "/v1/offers"),
]
ADMIN_PATHS = ("quota", "policy", "offers")


def _strategy(method: str, path: str, mode: GenerationMode) -> st.SearchStrategy[Any]:
    return SCHEMA[path][method].as_strategy(generation_mode=mode)


def _call(api: Invoke, case: Any, user: str = "alice") -> tuple[int, Any]:
    path = case.operation.path
    for name, value in (case.path_parameters or {}).items():
        path = path.replace("{" + name + "}", quote(str(value), safe=""))
    query = {k: str(v) for k, v in (case.query or {}).items()} or None
    has_body = case.body is not None and type(case.body).__name__ != "NotSet"
    headers = {"Content-Type": case.media_type or "application/json"} if has_body else {}
    raw = None
    if has_body:
        raw = case.body.decode("latin-1") if isinstance(case.body, bytes) else json.dumps(case.body)
    return api(case.method.upper(), path, user=user, raw_body=raw, query=query, headers=headers)


def _documented(method: str, path: str) -> set[int]:
    return {int(code) for code in DOC["paths"][path][method.lower()]["responses"]}


@FUZZ
@given(case=_strategy("POST", "/v1/jobs", GenerationMode.POSITIVE))
def test_every_spec_the_document_accepts_is_accepted(api: Invoke, case: Any) -> None:
    # Which bundles, data and secrets a tenant may use is a rule of its records, not of the schema
    # (tests/functional/test_code_and_data.py covers it): drop those references, keep the rest.
    spec = dict(case.body)
    spec.pop("data", None)
    spec.pop("secrets", None)
    if "code" in spec:
        del spec["code"]
        spec["image"] = "registry.example.com/team/train:v1"
    # A hint longer than the limit is refused (in the field's description; JSON Schema cannot
    # compare two fields).
    if spec.get("expected_duration_minutes", 0) > spec.get("timeout_minutes", 1440):
        spec["expected_duration_minutes"] = spec.get("timeout_minutes", 1440)
    array = spec.get("array")
    if isinstance(array, dict):
        # How many tasks fit is a rule of the tenant's quota record (max_active_jobs, default 1,000),
        # and parameter names must differ ignoring case (in the field's description).
        size = array.get("size")
        if isinstance(size, int | float) and not isinstance(size, bool):
            array["size"] = min(size, 1000)  # a whole float (7255.0) is an integer to the schema
        if isinstance(array.get("parameters"), list):
            entries = array["parameters"][:1000]
            array["parameters"] = [
                {k: v for k, v in e.items() if k == min(x for x in e if x.upper() == k.upper())}
                for e in entries
            ]
    case.body = spec
    before = stored_jobs()
    status, body = _call(api, case)
    if status == 429 and isinstance(array, dict) and body["error"]["code"] == "QuotaExceeded":
        # Valid, but earlier examples' jobs leave too little room under the tenant's
        # max_active_jobs for this many tasks now: the refusal must be right and store nothing.
        details = body["error"]["details"]
        assert details["active"] + details["size"] > details["max_active_jobs"], body
        assert stored_jobs() == before, body
        return
    if status == 422 and body["error"]["code"] == "Infeasible":
        # Valid, but no host or offer of this (empty) fleet could ever run it: a rule of the fleet
        # and the policy, not of the schema; the answer names the scheduler core's rule.
        assert body["error"]["details"]["rule"] in {str(r) for r in Rule}, body
        return
    assert status == 201, (case.body, body)


@FUZZ
@given(case=_strategy("PUT", "/v1/tenants/{tenant}/quota", GenerationMode.POSITIVE))
def test_every_quota_the_document_accepts_is_stored_as_sent(api: Invoke, case: Any) -> None:
    case.path_parameters = {"tenant": "nlp"}
    status, body = _call(api, case, user="admin")
    assert status == 200, (case.body, body)
    _, stored = api("GET", "/v1/tenants/nlp/quota", user="admin")
    for key, value in case.body.items():
        if key != "gpus":
            assert stored[key] == value
    for model, gq in case.body.get("gpus", {}).items():
        assert all(stored["gpus"][model][k] == v for k, v in gq.items())


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_requests_that_break_the_document_get_a_documented_4xx(api: Invoke, method: str, path: str) -> None:
    @FUZZ
    @given(case=_strategy(method, path, GenerationMode.NEGATIVE))
    def run(case: Any) -> None:
        before = stored_jobs()
        status, body = _call(api, case, user="admin" if any(p in path for p in ADMIN_PATHS) else "alice")
        assert status < 500, (case.path_parameters, case.query, case.body, body)
        if status >= 400:
            assert status in _documented(method, path) | {401, 403}, (status, body)
            assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
            assert stored_jobs() == before

    run()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "multipart/form-data",
        "multipart/form-data; boundary=zz",
        "application/x-www-form-urlencoded",
        "text/plain",
        "",
    ]
)


@FUZZ
@given(body=JSON, content_type=CONTENT_TYPES)
def test_any_body_in_any_content_type_gets_a_4xx(api: Invoke, body: Any, content_type: str) -> None:
    status, resp = api("POST", "/v1/jobs", raw_body=json.dumps(body), headers={"Content-Type": content_type})
    assert status in _documented("POST", "/v1/jobs") - {201}, (status, resp)
    assert set(resp["error"]) == {"code", "message", "details"}
    assert stored_jobs() == 0
