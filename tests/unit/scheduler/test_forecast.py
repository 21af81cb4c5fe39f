"""The core's queue forecast: each waiting job's position in its team's queue and an estimated start,
read from the pass's own outcomes and predictor (``berth.scheduler.forecast``)."""

from __future__ import annotations

from berth.domain.job_spec import Priority
from berth.scheduler.core import schedule
from berth.scheduler.explain import explain_job
from berth.scheduler.policy import load_policy
from berth.scheduler.snapshot import TenantState
from tests.unit.scheduler.helpers import NOW, host, job, offer, policy, running, snap

NO_BURST = policy(burst=None)


def test_positions_follow_the_core_order_within_each_team_and_skip_placed_jobs() -> None:
    pending = [
        job("a-old", "a", gpus=8, submitted_at=NOW - 300),
        job("a-new", "a", gpus=8, submitted_at=NOW - 100),
        job("a-high", "a", gpus=8, submitted_at=NOW - 50, priority=Priority.HIGH),
        job("b-1", "b", gpus=8, submitted_at=NOW - 200),
        job("b-2", "b", gpus=8, submitted_at=NOW - 10),
    ]
    # One free 8-GPU host: one job is placed, every other one waits.
    d = schedule(snap(pending, hosts=[host("h1")]), NO_BURST, NOW, forecast=True)
    placed = {p.job_id for p in d.placements}
    assert len(placed) == 1 and placed.isdisjoint(d.queue)
    assert set(d.queue) == {j.job_id for j in pending} - placed
    by_team: dict[str, list[tuple[int, str]]] = {}
    for job_id, f in d.queue.items():
        by_team.setdefault(f.tenant, []).append((f.position, job_id))
    a = [jid for _, jid in sorted(by_team["a"])]
    # priority first, then submit time; positions are 1..n with no gap
    expected_a = [j for j in ["a-high", "a-old", "a-new"] if j not in placed]
    assert a == expected_a
    assert sorted(p for p, _ in by_team["a"]) == list(range(1, len(expected_a) + 1))
    assert [jid for _, jid in sorted(by_team["b"])] == [j for j in ["b-1", "b-2"] if j not in placed]


def test_no_forecast_unless_asked() -> None:
    d = schedule(snap([job("j", gpus=16)], hosts=[host("h1")]), NO_BURST, NOW)
    assert d.queue == {}


def test_onprem_estimate_is_when_predicted_ends_free_enough_gpus_for_the_jobs_ahead() -> None:
    run = [
        running("r1", "x", (("h1", 8),), expected_end_at=NOW + 600),
        running("r2", "x", (("h2", 8),), expected_end_at=NOW + 1800),
    ]
    hosts = [host("h1", free=0), host("h2", free=0)]
    pending = [job("first", gpus=8, submitted_at=NOW - 20), job("second", gpus=8, submitted_at=NOW - 10)]
    d = schedule(snap(pending, run, hosts), NO_BURST, NOW, forecast=True)
    first, second = d.queue["first"], d.queue["second"]
    assert (first.position, first.estimated_start, first.basis) == (1, NOW + 600, "onprem")
    # the second needs the GPUs of both running jobs: the first takes r1's
    assert (second.position, second.estimated_start, second.basis) == (2, NOW + 1800, "onprem")
    # a third needs more GPUs than any predicted end frees: no estimate
    d = schedule(snap([*pending, job("third", gpus=8)], run, hosts), NO_BURST, NOW, forecast=True)
    assert d.queue["third"].estimated_start is None and d.queue["third"].basis is None


def test_the_run_time_predictor_gives_the_end_of_a_running_job_without_a_known_end() -> None:
    # Started an hour ago with a 90-minute estimate: predicted to end in about 30 minutes.
    run = [running("r1", "x", (("h1", 8),), expected_duration_s=5400.0)]
    d = schedule(snap([job("w", gpus=8)], run, [host("h1", free=0)]), NO_BURST, NOW, forecast=True)
    assert d.queue["w"].basis == "onprem"
    assert d.queue["w"].estimated_start is not None
    assert abs(d.queue["w"].estimated_start - (NOW + 1800)) < 1


def test_burst_estimate_is_the_end_of_the_burst_wait_when_earlier() -> None:
    pol = load_policy({"burst": {"min_wait_s": 600, "wait_fraction": 0}})
    run = [running("r1", "x", (("h1", 8),), expected_end_at=NOW + 7200)]
    pending = [job("w", gpus=8, submitted_at=NOW - 120)]
    d = schedule(snap(pending, run, [host("h1", free=0)], offers=[offer(gpus=8)]), pol, NOW, forecast=True)
    f = d.queue["w"]
    assert f.basis == "burst" and f.estimated_start == NOW - 120 + 600
    step = next(s for s in d.outcomes["w"].steps if s.at is not None)
    assert f.estimated_start == step.at


def test_a_job_held_by_its_quota_gets_a_position_but_no_estimate() -> None:
    tenants = {"a": TenantState("a", guaranteed_gpus={"V100": 0}, borrow_limit_gpus={"V100": 0})}
    run = [running("r1", "x", (("h1", 8),), expected_end_at=NOW + 600)]
    d = schedule(
        snap([job("q", "a", gpus=8)], run, [host("h1", free=0)], tenants=tenants),
        NO_BURST,
        NOW,
        forecast=True,
    )
    assert d.queue["q"].position == 1 and d.queue["q"].estimated_start is None


def test_explain_reports_the_same_position_and_estimate_as_the_pass() -> None:
    run = [running("r1", "x", (("h1", 8),), expected_end_at=NOW + 600)]
    pending = [job("first", gpus=8, submitted_at=NOW - 20), job("second", gpus=4, submitted_at=NOW - 10)]
    s = snap(pending, run, [host("h1", free=0)])
    d = schedule(s, NO_BURST, NOW, forecast=True)
    for jid in ("first", "second"):
        e = explain_job(s, NO_BURST, NOW, jid)
        assert (e.queue_position, e.estimated_start, e.estimate_basis) == (
            d.queue[jid].position,
            d.queue[jid].estimated_start,
            d.queue[jid].basis,
        )
