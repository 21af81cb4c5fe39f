"""The run-time predictor: fallbacks, calibration, re-prediction, state (hypothesis)."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth.scheduler.predictor import RuntimePredictor, Source

from .test_properties import SETTINGS

durations = st.floats(min_value=60.0, max_value=30 * 86400.0)


@SETTINGS
@given(est=durations, timeout=durations)
def test_with_no_history_it_falls_back_to_the_estimate_then_the_timeout(est: float, timeout: float) -> None:
    p = RuntimePredictor()
    rt = p.predict("t", "resnet", "V100", 1, est, timeout)
    assert rt is not None and rt.source is Source.ESTIMATE
    assert rt.quantile(0.5) == pytest.approx(min(est, timeout), rel=1e-9)
    rt = p.predict("t", "resnet", "V100", 1, None, timeout)
    assert rt is not None and rt.source is Source.TIMEOUT and rt.quantile(0.5) == pytest.approx(timeout)
    assert p.predict("t", "resnet", "V100", 1, None, None) is None


@SETTINGS
@given(
    ratio=st.floats(min_value=0.05, max_value=20.0),
    estimates=st.lists(st.floats(min_value=600.0, max_value=86400.0), min_size=2, max_size=30),
)
def test_calibration_moves_toward_the_tenants_real_ratio(ratio: float, estimates: list[float]) -> None:
    p = RuntimePredictor()
    gaps = [abs(math.log(p.calibration_factor("t")) - math.log(ratio))]
    for i, e in enumerate(estimates):
        p.observe("t", f"f{i}", "V100", 1, e * ratio, e)
        gaps.append(abs(math.log(p.calibration_factor("t")) - math.log(ratio)))
    assert all(b <= a + 1e-9 for a, b in pairwise(gaps))
    if abs(math.log(ratio)) > 1e-6:
        assert gaps[-1] < gaps[0]
    # Another tenant's estimates are untouched.
    assert p.calibration_factor("other") == 1.0


@SETTINGS
@given(runs=st.lists(durations, min_size=1, max_size=20), done=st.lists(durations, min_size=2, max_size=5))
def test_a_job_running_past_its_prediction_is_predicted_longer(runs: list[float], done: list[float]) -> None:
    p = RuntimePredictor()
    for r in runs:
        p.observe("t", "bert", "V100", 8, r, None)
    rt = p.predict("t", "bert", "V100", 8, None, None)
    assert rt is not None and rt.source is Source.HISTORY
    ends = [rt.quantile(0.5, d) for d in sorted(done)]
    assert all(e >= d for e, d in zip(ends, sorted(done), strict=True))
    assert all(b >= a - 1e-6 for a, b in pairwise(ends))


@SETTINGS
@given(runs=st.lists(st.tuples(durations, st.one_of(st.none(), durations)), min_size=1, max_size=20))
def test_state_round_trips_and_predictions_are_deterministic(runs: list[tuple[float, float | None]]) -> None:
    p = RuntimePredictor()
    for i, (actual, est) in enumerate(runs):
        p.observe("t", f"f{i % 3}", "V100", 1 + i % 2, actual, est)
    q = RuntimePredictor.from_dict(p.to_dict())
    for fam in ("f0", "f1", "new"):
        a = p.predict("t", fam, "V100", 1, 3600.0, None)
        b = q.predict("t", fam, "V100", 1, 3600.0, None)
        assert a is not None and b is not None
        assert a.quantile(0.9) == pytest.approx(b.quantile(0.9), rel=1e-6)


def test_history_of_a_family_dominates_a_wild_estimate() -> None:
    p = RuntimePredictor()
    for _ in range(30):
        p.observe("t", "bert", "V100", 8, 7200.0, 7200.0)
    rt = p.predict("t", "bert", "V100", 8, 10 * 86400.0, None)
    assert rt is not None and rt.source is Source.BLEND
    assert 3600.0 < rt.quantile(0.5) < 4 * 86400.0
