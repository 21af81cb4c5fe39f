"""The user's estimate: an optional hint in the spec, bounded, never a limit; how the core reads it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from berth.domain.job_spec import JobSpec
from berth.scheduler import pending_from_spec
from berth.scheduler.predictor import RuntimePredictor

BASE: dict[str, Any] = {"name": "resnet50", "image": "pytorch/pytorch:2.3.0", "command": ["python", "t.py"]}


def test_expected_duration_is_optional_and_reaches_the_core_in_seconds() -> None:
    assert JobSpec.model_validate(BASE).expected_duration_minutes is None
    spec = JobSpec.model_validate({**BASE, "expected_duration_minutes": 90, "timeout_minutes": 120})
    job = pending_from_spec("j", "vision", spec, 0.0)
    assert job.expected_duration_s == 5400.0 and job.timeout_s == 7200.0 and job.family == "resnet50"
    assert pending_from_spec("j", "vision", JobSpec.model_validate(BASE), 0.0).expected_duration_s is None


@pytest.mark.parametrize(
    ("value", "why"),
    [(0, "greater than or equal to 1"), (-5, "greater than or equal to 1"), ("90", "valid integer"),
     (60 * 24 * 30 + 1, "less than or equal to")],
)  # fmt: skip
def test_expected_duration_must_be_a_positive_bounded_integer(value: object, why: str) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**BASE, "expected_duration_minutes": value})
    assert why in str(exc.value)


def test_an_estimate_beyond_the_timeout_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate({**BASE, "expected_duration_minutes": 600, "timeout_minutes": 60})
    assert "longer than timeout_minutes" in str(exc.value)


def test_the_estimate_is_a_hint_the_timeout_caps_the_prediction() -> None:
    p = RuntimePredictor()
    for _ in range(20):  # this tenant underestimates by 10x
        p.observe("t", "resnet50", "V100", 1, 36000.0, 3600.0)
    rt = p.predict("t", "other", "V100", 1, 3600.0, 7200.0)
    assert rt is not None and rt.quantile(0.5) == pytest.approx(7200.0)
    rt = p.predict("t", "other", "V100", 1, 3600.0, None)
    assert rt is not None and rt.quantile(0.5) > 3 * 3600.0
