"""The API's 422 for a bad spec: the documented error envelope, one detail per problem in words."""

from __future__ import annotations

from typing import Any

from tests.functional.conftest import Invoke


def test_a_bad_spec_is_answered_in_words(api: Invoke, spec: dict[str, Any]) -> None:
    body = {**spec, "comand": ["x"], "constraints": {"max_cost_usd": "ten"}}
    status, answer = api("POST", "/v1/jobs", body=body)
    assert status == 422
    error = answer["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == "ValidationError"
    by_field = {d["field"]: d for d in error["details"]}
    assert set(by_field) == {"comand", "constraints.max_cost_usd"}  # one each: no union members
    assert by_field["comand"]["did_you_mean"] == "command"
    assert by_field["constraints.max_cost_usd"]["message"] == (
        "constraints.max_cost_usd: must be a number, not the text 'ten'"
    )
    assert "did you mean 'command'?" in error["message"] and "constrained" not in error["message"]


def test_gpu_models_in_any_case_are_stored_as_listed(api: Invoke, spec: dict[str, Any]) -> None:
    status, job = api("POST", "/v1/jobs", body={**spec, "resources": {"gpu_type": "v100", "gpus": 1}})
    assert status == 201 and job["spec"]["resources"]["gpu_type"] == "V100"
    status, answer = api("POST", "/v1/jobs", body={**spec, "resources": {"gpu_type": "v10"}})
    assert status == 422 and answer["error"]["details"][0]["did_you_mean"] == "V100"


def test_a_body_that_is_no_object(api: Invoke) -> None:
    status, answer = api("POST", "/v1/jobs", body=[1, 2])
    assert status == 422 and answer["error"]["details"][0]["field"] == "spec"
    assert "must be a JSON object" in answer["error"]["message"]


def test_other_bodies_get_guesses_too(api: Invoke) -> None:
    status, answer = api(
        "PUT", "/v1/tenants/nlp/quota", user="admin", body={"gpus": {"V100": {"guaranted": 1}}}
    )
    assert status == 422
    (d,) = answer["error"]["details"]
    assert d["field"] == "gpus.V100.guaranted" and d["did_you_mean"] == "guaranteed"
