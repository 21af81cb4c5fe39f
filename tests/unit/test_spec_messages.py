"""Job spec validation errors in plain words: the dotted field, the problem, the values allowed, a
guess for a mistyped field or value; one message per field (never one per union member)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from berth.domain.job_spec import FIELD_CHOICES, FIELD_FORMS, JobSpec
from berth.domain.validation_messages import clean_loc, describe, dotted

BASE: dict[str, Any] = {"name": "resnet50", "image": "busybox", "command": ["true"]}
GPU_MODELS = ["H100", "A100", "A100-80G", "A10G", "L4", "T4", "V100", "L40S", "H200"]


def _details(spec: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(spec)
    # As the API sees them: under "body" (Powertools' prefix).
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.value.errors()]
    return describe(errors, JobSpec, FIELD_FORMS, FIELD_CHOICES)


@pytest.mark.parametrize(
    ("change", "field", "words", "extra"),
    [
        (
            {"comand": ["x"]},
            "comand",
            "unknown field 'comand': did you mean 'command'?",
            {"did_you_mean": "command"},
        ),
        ({"resources": {"gpu": 2}}, "resources.gpu", "did you mean 'gpus'?", {"did_you_mean": "gpus"}),
        ({"constraints": {"max_cost": 5}}, "constraints.max_cost", "did you mean 'max_cost_usd'?", {}),
        (
            {"constraints": {"max_cost_usd": "ten"}},
            "constraints.max_cost_usd",
            "must be a number, not the text 'ten'",
            {},
        ),
        (
            {"constraints": {"max_cost_usd": -1}},
            "constraints.max_cost_usd",
            "must be more than 0 (got -1)",
            {},
        ),
        (
            {"resources": {"gpus": "4"}},
            "resources.gpus",
            "must be a whole number, not the text '4' (write it without quotes)",
            {},
        ),
        ({"resources": {"gpus": 0}}, "resources.gpus", "must be at least 1", {}),
        ({"resources": {"gpus": 65}}, "resources.gpus", "must be at most 64", {}),
        (
            {"resources": {"gpu_type": "a10"}},
            "resources.gpu_type",
            "did you mean A10G?",
            {"allowed": GPU_MODELS, "did_you_mean": "A10G"},
        ),
        (
            {"resources": {"gpu_type": "GTX1080"}},
            "resources.gpu_type",
            "use one of H100, A100",
            {"allowed": GPU_MODELS},
        ),
        (
            {"constraints": {"placement": "onprm"}},
            "constraints.placement",
            "use one of auto, onprem, cloud (did you mean 'onprem'?)",
            {"allowed": ["auto", "onprem", "cloud"]},
        ),
        (
            {"constraints": {"spot": "sometimes"}},
            "constraints.spot",
            "use one of allowed, required, never",
            {},
        ),
        ({"constraints": {"priority": "urgent"}}, "constraints.priority", "use one of low, normal, high", {}),
        ({"name": "Bad_Name"}, "name", "is not a job name: 1 to 63 lowercase letters", {}),
        ({"image": "UPPER/Case"}, "image", "is not an image reference", {}),
        ({"constraints": {"regions": ["mars-1"]}}, "constraints.regions[0]", "is not an AWS region name", {}),
        ({"data": [{"source": "ftp://x", "mount": "/d"}]}, "data[0].source", "is not a data source", {}),
        ({"secrets": {"KEY": "nope"}}, "secrets.KEY", "is not a secret name", {}),
        ({"array": {"size": 0}}, "array.size", "must be at least 1 (got 0)", {}),
        ({"timeout_minutes": None}, "timeout_minutes", "must be a whole number, not null", {}),
        ({"resources": "big"}, "resources", "must be an object", {}),
        ({"command": "python train.py"}, "command", "must be a list of arguments, not a shell string", {}),
        ({"env": {"1BAD": "x"}}, "env", "is not a variable name", {}),
    ],
)
def test_bad_specs_are_told_in_words(
    change: dict[str, Any], field: str, words: str, extra: dict[str, Any]
) -> None:
    details = _details({**BASE, **change})
    assert len(details) == 1, details  # one message per problem: no union members, no duplicates
    (d,) = details
    assert d["field"] == field
    assert d["message"].startswith(f"{field}: ") and words in d["message"], d["message"]
    for key, value in extra.items():
        assert d[key] == value
    for leak in ("constrained-", "function-", ".none", "Input should", "body:", "^[", "String should match"):
        assert leak not in d["message"], d["message"]


def test_a_rule_over_several_fields_names_the_spec() -> None:
    (d,) = _details({"name": "x", "command": ["a"]})
    assert d["field"] == "spec" and "exactly one of 'image' or 'code'" in d["message"]


def test_a_missing_field_is_required() -> None:
    (d,) = _details({"image": "busybox"})
    assert d["message"] == "name: is required"
    (d,) = _details({**BASE, "name": None})
    assert d["message"] == "name: must be text, not null"


def test_several_problems_give_one_detail_each() -> None:
    details = _details({**BASE, "comand": ["x"], "resources": {"gpus": "4", "gpu_typ": "A100"}})
    assert sorted(d["field"] for d in details) == ["comand", "resources.gpu_typ", "resources.gpus"]


@pytest.mark.parametrize(
    ("given", "stored"), [("a100", "A100"), ("h100", "H100"), ("a100-80g", "A100-80G"), ("L40s", "L40S")]
)
def test_gpu_models_are_taken_in_any_case(given: str, stored: str) -> None:
    assert JobSpec.model_validate({**BASE, "resources": {"gpu_type": given}}).resources.gpu_type == stored


def test_union_and_wrapper_tags_leave_the_path() -> None:
    loc = ("body", "array", "function-after[_size_xor_parameters(), ArraySpec]", "size", "constrained-int")
    assert clean_loc(loc) == ("array", "size")
    assert clean_loc(("body", "env", "MY_VAR")) == ("env", "MY_VAR")
    assert dotted(("data", 0, "source")) == "data[0].source" and dotted(()) == "spec"


def test_defaults_applied_names_what_the_spec_left_out() -> None:
    from berth.domain.job_spec import defaults_applied

    assert defaults_applied(JobSpec.model_validate(BASE)) == ["resources"]
    partial = JobSpec.model_validate({**BASE, "resources": {"gpus": 2, "cpu": 8}})
    assert defaults_applied(partial) == ["resources.gpu_type", "resources.memory_gib"]
    full = {"gpu_type": "V100", "gpus": 1, "cpu": 2, "memory_gib": 8}
    assert defaults_applied(JobSpec.model_validate({**BASE, "resources": full})) == []
