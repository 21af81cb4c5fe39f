"""The answer to a submit says which resource defaults Berth filled in (none is silent)."""

from __future__ import annotations

from typing import Any

from tests.functional.conftest import Invoke


def test_no_resources_means_the_whole_default_said_so(api: Invoke, spec: dict[str, Any]) -> None:
    body = {k: v for k, v in spec.items() if k != "resources"}
    status, job = api("POST", "/v1/jobs", body=body)
    assert status == 201 and job["defaults_applied"] == ["resources"]
    assert job["spec"]["resources"] == {
        "gpu_type": "A100",
        "gpus": 1,
        "cpu": 4.0,
        "memory_gib": 16.0,
        "nodes": 1,
    }
    _, again = api("GET", f"/v1/jobs/{job['id']}")
    assert "defaults_applied" not in again  # a fact of the submit, not of the job


def test_partial_resources_name_each_default(api: Invoke, spec: dict[str, Any]) -> None:
    status, job = api("POST", "/v1/jobs", body={**spec, "resources": {"gpus": 2}})
    assert status == 201
    assert job["defaults_applied"] == ["resources.gpu_type", "resources.cpu", "resources.memory_gib"]
    full = {"gpu_type": "V100", "gpus": 1, "cpu": 2, "memory_gib": 8}
    status, job = api("POST", "/v1/jobs", body={**spec, "resources": full}, headers={"Idempotency-Key": "k1"})
    assert status == 201 and job["defaults_applied"] == []
    status, replay = api(
        "POST", "/v1/jobs", body={**spec, "resources": full}, headers={"Idempotency-Key": "k1"}
    )
    assert status == 201 and replay["id"] == job["id"] and replay["defaults_applied"] == []
