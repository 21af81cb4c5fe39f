"""The simulator tells the scheduler no future: estimate modes, noise, the predictor's diet."""

from __future__ import annotations

from typing import Any

import pytest

from berth.scheduler.snapshot import Snapshot
from berth_tools.sim import engine
from berth_tools.sim.estimates import EstimateMode, UserEstimates
from berth_tools.sim.policies import resolve_policy
from berth_tools.sim.records import SimJob
from berth_tools.sim.runner import simulate
from berth_tools.sim.trace import TraceJob

from .test_sim import SMALL, _synthetic

SIGMAS = (None, 0.5, 1.0)


def _spy_run(monkeypatch: pytest.MonkeyPatch, sigma: float | None, mode: EstimateMode) -> list[str]:
    """Replay the synthetic trace, checking every snapshot handed to the core; returns problems."""
    from berth_tools.sim.cluster import load_cluster

    trace = _synthetic()
    sim = engine.Simulator(trace, load_cluster(SMALL), resolve_policy("berth"), mode, sigma)
    truth = {t.job_id: t.duration_s for t in trace}
    learnt: set[str] = set()
    learn = sim._learn

    def spy_learn(job: SimJob) -> None:
        learnt.add(job.trace.job_id)
        learn(job)

    real = engine.schedule
    problems: list[str] = []

    def spy_schedule(snap: Snapshot, policy: Any, now: float) -> Any:
        finished = {
            j.trace.job_id for j in sim.state.jobs.values() if j.end_s is not None and j.trace.duration_s > 0
        }
        if learnt != finished:
            problems.append(f"{now}: predictor learnt {len(learnt)} jobs, {len(finished)} had finished")
        for p in snap.pending:
            if p.job_id in learnt:
                problems.append(f"{now}: the predictor knew pending {p.job_id}'s run time")
            if p.expected_duration_s is not None and p.expected_duration_s == truth[p.job_id]:
                problems.append(f"{now}: {p.job_id} handed its true run time")
            if p.expected_duration_s != sim.state.jobs[p.job_id].estimate_s:
                problems.append(f"{now}: {p.job_id} handed something other than its user estimate")
        problems.extend(
            f"{now}: {r.job_id} has a known end" for r in snap.running if r.expected_end_at is not None
        )
        return real(snap, policy, now)

    sim._learn = spy_learn  # type: ignore[method-assign]
    monkeypatch.setattr(engine, "schedule", spy_schedule)
    sim.run()
    return problems


@pytest.mark.parametrize("sigma", SIGMAS)
def test_default_mode_hands_the_core_no_true_duration_and_learns_only_from_finished_jobs(
    monkeypatch: pytest.MonkeyPatch, sigma: float | None
) -> None:
    assert _spy_run(monkeypatch, sigma, EstimateMode.PREDICTOR) == []


def test_the_oracle_is_the_only_mode_that_hands_over_the_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _spy_run(monkeypatch, None, EstimateMode.ORACLE) != []


def test_user_estimates_are_seeded_lognormal_with_a_tenant_bias() -> None:
    jobs = [TraceJob(f"j{i}", 0.0, f"t{i % 2}", 1, "V100", 3600.0) for i in range(400)]
    a, b = UserEstimates(0.5, seed=1), UserEstimates(0.5, seed=1)
    est = [a.estimate(j) for j in jobs]
    assert est == [b.estimate(j) for j in jobs]
    assert UserEstimates(None).estimate(jobs[0]) is None
    import math

    logs = [math.log(e / 3600.0) for e in est if e is not None]
    mean = sum(logs) / len(logs)
    sd = (sum((x - mean) ** 2 for x in logs) / len(logs)) ** 0.5
    assert 0.4 < sd < 0.6


def test_output_names_the_mode_and_the_predictor_error() -> None:
    from berth_tools.sim.cluster import load_cluster

    cluster = load_cluster(SMALL)
    trace = _synthetic()
    oracle = simulate(trace, cluster, resolve_policy("berth"), EstimateMode.ORACLE)
    noisy = simulate(trace, cluster, resolve_policy("berth"), EstimateMode.PREDICTOR, 0.5)
    assert oracle["estimates"] == "oracle" and oracle["predictor_error_median"] == 0.0
    assert noisy["estimates"] == "predictor" and noisy["estimate_noise"] == 0.5
    assert 0 < noisy["predictor_error_median"] <= noisy["predictor_error_p90"]
