"""Bad input found by fuzzing the published OpenAPI document: each gets a 4xx in the error shape
and nothing is stored (issue 6)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.functional.conftest import Invoke
from tests.functional.test_api import stored_jobs


def _assert_error(status: int, body: Any, expected: int) -> None:
    assert status == expected, body
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] and body["error"]["message"]


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("multipart/form-data", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/x-www-form-urlencoded", 415),
        ("text/plain", 415),
        ("application/xml", 415),
        ("application/json; charset=utf-8", 201),
        ("application/json", 201),
        ("APPLICATION/JSON", 201),
    ],
)
def test_content_types(api: Invoke, spec: dict[str, Any], content_type: str, expected: int) -> None:
    status, body = api("POST", "/v1/jobs", raw_body=json.dumps(spec), headers={"Content-Type": content_type})
    if expected == 201:
        assert status == 201, body
        return
    _assert_error(status, body, expected)
    assert body["error"]["code"] == "UnsupportedMediaType"
    assert stored_jobs() == 0


def test_quota_put_with_wrong_content_type(api: Invoke) -> None:
    status, body = api(
        "PUT", "/v1/tenants/nlp/quota", user="admin", raw_body="{}", headers={"Content-Type": "text/csv"}
    )
    _assert_error(status, body, 415)


@pytest.mark.parametrize(
    "raw",
    [
        '{"name": "x", "image": "busybox", "timeout_minutes": ' + "9" * 5000 + "}",
        '{"name": "x", "image": "busybox", "timeout_minutes": -' + "1" * 4301 + "}",
        '{"name": "x", "image": "busybox", "resources": {"cpu": NaN}}',
        '{"name": "x", "image": "busybox", "resources": {"cpu": Infinity}}',
        '{"name": "x", "image": "busybox", "resources": {"cpu": 1e999}}',
        "{not json",
        "[" * 100_000,
        '"just a string"',
    ],
)
def test_malformed_json_bodies(api: Invoke, raw: str) -> None:
    status, body = api("POST", "/v1/jobs", raw_body=raw, headers={"Content-Type": "application/json"})
    assert 400 <= status < 500, body
    _assert_error(status, body, status)
    assert stored_jobs() == 0


@pytest.mark.parametrize(
    "quota",
    [
        {"max_active_jobs": False},
        {"max_active_jobs": "5"},
        {"max_active_jobs": 5.5},
        {"weight": "2"},
        {"weight": True},
        {"monthly_cloud_budget_usd": "100"},
        {"gpus": {"V100": {"guaranteed": "4"}}},
        {"gpus": {"V100": {"guaranteed": True}}},
        {"gpus": {"V100": {"guaranteed": 4.5}}},
    ],
)
def test_quota_body_is_strict(api: Invoke, quota: dict[str, Any]) -> None:
    status, body = api("PUT", "/v1/tenants/nlp/quota", user="admin", body=quota)
    _assert_error(status, body, 422)
    status, stored = api("GET", "/v1/tenants/nlp/quota", user="admin")
    assert status == 200 and stored["max_active_jobs"] == 1000


def test_quota_accepts_an_integer_for_a_float(api: Invoke) -> None:
    status, body = api("PUT", "/v1/tenants/nlp/quota", user="admin", body={"weight": 2, "max_active_jobs": 5})
    assert status == 200 and body["weight"] == 2.0 and body["max_active_jobs"] == 5


@pytest.mark.parametrize(
    "change",
    [
        {"image": None, "code": "s3://bucket-a/vision/../nlp/code.tar.gz"},
        {"image": None, "code": "s3://bucket-a/vision/%2e%2e/nlp/code.tar.gz"},
        {"image": None, "code": "s3://bucket-a/vision\\..\\nlp/code.tar.gz"},
        {"data": [{"source": "s3://bucket-a/vision/%2e%2e/nlp", "mount": "/data"}]},
        {"data": [{"source": "s3://bucket-a/vision/%2E%2E/nlp", "mount": "/data"}]},
        {"data": [{"source": "s3://bucket-a/vision\\nlp", "mount": "/data"}]},
        {"data": [{"source": "/datasets/a/%2e%2e/b", "mount": "/data"}]},
        {"data": [{"source": "dataset://imagenet/../secret", "mount": "/data"}]},
        {"data": [{"source": "s3://bucket-a/x", "mount": "/data/%2e%2e"}]},
        {"image": "registry.example.com/team/train:v\u00e9"},
        {"image": "registry.example.com/team/tr\u00e4in:v1"},
        {"image": "busybox:\u0661\u0662"},
    ],
)
def test_traversal_and_non_ascii_references(
    api: Invoke, spec: dict[str, Any], change: dict[str, Any]
) -> None:
    body = {k: v for k, v in {**spec, **change}.items() if v is not None}
    status, resp = api("POST", "/v1/jobs", body=body)
    _assert_error(status, resp, 422)
    assert stored_jobs() == 0
