"""Operational metrics: what a pass, the workflow, the API and the cloud's circuits publish, read back
from the EMF lines Powertools prints (its documented way to test metrics: capture stdout)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aws_lambda_powertools import Metrics

from berth.domain.ports import CircuitEntry
from berth.domain.queue import QueueEntry
from berth.handlers import scheduler, telemetry
from berth.logic.pass_figures import PassFigures, QueueFigure, budget_used_pct, queue_figures
from berth.logic.scheduler_service import PassReport
from berth.scheduler.snapshot import TenantState
from tests.unit.test_scheduler_handler import _Context, _Expander, _Trigger
from tests.unit.test_workflow_services import World

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_metrics() -> Any:
    Metrics().clear_metrics()
    yield
    Metrics().clear_metrics()


def emf_lines(out: str) -> list[dict[str, Any]]:
    return [d for d in (json.loads(line) for line in out.splitlines() if line.startswith("{")) if "_aws" in d]


def metric_points(out: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(dimensions, value) of every published point of ``name`` in namespace Berth."""
    points = []
    for blob in emf_lines(out):
        (directive,) = blob["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == "Berth"
        if name not in {m["Name"] for m in directive["Metrics"]}:
            continue
        (dims,) = directive["Dimensions"]
        value = blob[name]
        for v in value if isinstance(value, list) else [value]:
            points.append(({d: blob[d] for d in dims}, float(v)))
    return points


# -- the figures (pure) -------------------------------------------------------------------------------
def _entry(job_id: str, tenant: str, gpu: str, age_s: float) -> QueueEntry:
    from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy

    at = NOW - timedelta(seconds=age_s)
    return QueueEntry(
        job_id, tenant, 1, at, at, "", False, gpu, 1, 1, 1.0, 1.0, PlacementConstraint.AUTO, (),
        SpotPolicy.ALLOWED, Priority.NORMAL, None, None, None, 3600.0, "f", (), (), (),
    )  # fmt: skip


def test_queue_figures_per_team_and_gpu_type() -> None:
    pending = [
        _entry("a", "vision", "A100", 30),
        _entry("b", "vision", "A100", 300),
        _entry("c", "vision", "H100", 5),
        _entry("d", "nlp", "A100", 60),
    ]
    assert queue_figures(pending, NOW) == [
        QueueFigure("nlp", "A100", 1, 60.0),
        QueueFigure("vision", "A100", 2, 300.0),
        QueueFigure("vision", "H100", 1, 5.0),
    ]
    assert PassFigures(queue=queue_figures(pending, NOW)).oldest_queued_s == 300.0
    assert PassFigures().oldest_queued_s == 0.0


def test_budget_burn_only_for_teams_with_a_budget() -> None:
    tenants = {
        "vision": TenantState("vision", monthly_budget_usd=200.0, cloud_spend_month_usd=50.0),
        "nlp": TenantState("nlp"),
        "audio": TenantState("audio", monthly_budget_usd=0.0),
    }
    assert budget_used_pct(tenants) == {"audio": 100.0, "vision": 25.0}


def test_a_pass_reports_placements_per_site_and_its_queue() -> None:
    w = World(hosts=2, gpus=8)
    jobs = [w.submit(gpus=8) for _ in range(3)]
    for job in jobs:
        w.workflow.await_placement(job.id, f"place-{job.id}")
    first = w.scheduler.run_pass()
    assert first.placed == 2 and first.placed_by_site == {"onprem": 2}
    assert first.figures.queue == [QueueFigure("vision", "A100", 3, 0.0)]
    w.clock.now += timedelta(seconds=45)
    second = w.scheduler.run_pass()
    assert second.placed_by_site == {}
    assert second.figures.queue == [QueueFigure("vision", "A100", 1, 45.0)]
    assert "figures" not in second.as_dict() and second.as_dict()["placed_by_site"] == {}


# -- the scheduler's handler --------------------------------------------------------------------------
class _Scheduler:
    def __init__(self, report: PassReport) -> None:
        self.report = report

    def run_pass(self, time_left: Any = None) -> PassReport:
        return self.report


def _run_handler(monkeypatch: pytest.MonkeyPatch, report: PassReport) -> None:
    monkeypatch.setattr(scheduler, "array_expander", lambda: _Expander(False, 0))
    monkeypatch.setattr(scheduler, "pass_trigger", lambda: _Trigger())
    monkeypatch.setattr(scheduler, "scheduler_service", lambda: _Scheduler(report))
    scheduler.lambda_handler({"Records": []}, _Context())


def test_the_scheduler_publishes_the_pass(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    report = PassReport(
        pending=4,
        placed=3,
        placed_by_site={"onprem": 2, "cloud": 1},
        deferred=5,
        lost_hosts=["h1", "h2"],
        load_s=1.0,
        decide_s=0.5,
        apply_s=2.0,
        figures=PassFigures(
            queue=[QueueFigure("vision", "A100", 3, 120.0), QueueFigure("nlp", "H100", 1, 900.0)],
            budget_used_pct={"vision": 85.0},
        ),
    )
    _run_handler(monkeypatch, report)
    out = capsys.readouterr().out
    svc = {"service": "berth-scheduler"}
    assert metric_points(out, "PassSeconds") == [(svc, 3.5)]
    assert metric_points(out, "PlacementsDeferred") == [(svc, 5.0)]
    assert metric_points(out, "HostsLost") == [(svc, 2.0)]
    assert sorted(metric_points(out, "JobsPlaced"), key=str) == sorted(
        [(svc, 3.0), ({**svc, "Site": "cloud"}, 1.0), ({**svc, "Site": "onprem"}, 2.0)], key=str
    )
    assert sorted(metric_points(out, "OldestQueuedSeconds"), key=str) == sorted(
        [
            (svc, 900.0),
            ({**svc, "Tenant": "nlp", "GpuType": "H100"}, 900.0),
            ({**svc, "Tenant": "vision", "GpuType": "A100"}, 120.0),
        ],
        key=str,
    )
    assert sorted(metric_points(out, "QueueDepth"), key=str) == sorted(
        [
            ({**svc, "Tenant": "nlp", "GpuType": "H100"}, 1.0),
            ({**svc, "Tenant": "vision", "GpuType": "A100"}, 3.0),
        ],
        key=str,
    )
    assert metric_points(out, "BudgetUsedPercent") == [({**svc, "Tenant": "vision"}, 85.0)]


def test_an_empty_queue_still_publishes_an_oldest_age_of_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    _run_handler(monkeypatch, PassReport())
    out = capsys.readouterr().out
    assert metric_points(out, "OldestQueuedSeconds") == [({"service": "berth-scheduler"}, 0.0)]
    assert metric_points(out, "QueueDepth") == []


def test_a_pass_publishes_at_most_the_oldest_queue_series(capsys: Any) -> None:
    many = [QueueFigure(f"t{i}", "A100", 1, float(i)) for i in range(telemetry.MAX_QUEUE_SERIES + 20)]
    telemetry.scheduling_pass(PassReport(figures=PassFigures(queue=many)))
    points = metric_points(capsys.readouterr().out, "OldestQueuedSeconds")
    assert len(points) == telemetry.MAX_QUEUE_SERIES
    assert min(v for _, v in points) == 20.0  # the 20 youngest were left out


# -- API, workflow, cloud ------------------------------------------------------------------------------
_JOB_GET = {"httpMethod": "GET", "resource": "/v1/jobs/{id}", "path": "/v1/jobs/j-20261203-1"}


@pytest.mark.parametrize(
    ("event", "status", "route", "cls"),
    [
        (_JOB_GET, 404, "GET /v1/jobs/{id}", "4xx"),
        ({"httpMethod": "POST", "resource": "/v1/jobs"}, 201, "POST /v1/jobs", "2xx"),
        ({"httpMethod": "GET", "path": "/v1/nowhere/j-123"}, 500, "GET unmatched", "5xx"),
    ],
)  # fmt: skip
def test_api_requests_by_route_template_and_status_class(
    capsys: Any, event: dict[str, Any], status: int, route: str, cls: str
) -> None:
    telemetry.api_request(event, status)
    points = metric_points(capsys.readouterr().out, "Requests")
    assert points == [({"service": "berth-api", "Route": route, "StatusClass": cls}, 1.0)]


def test_workflow_counts_retries_and_failures_by_cause(capsys: Any) -> None:
    telemetry.attempt_classified({"action": "retry", "backoff_s": 4, "failure": "HostLost"})
    telemetry.attempt_classified({"action": "fail", "backoff_s": 0, "failure": "OutOfMemory"})
    telemetry.attempt_classified({"action": "retry", "backoff_s": 1})  # classified before: not again
    telemetry.attempt_classified({"action": "cancel", "backoff_s": 0, "failure": "Canceled"})
    out = capsys.readouterr().out
    assert metric_points(out, "AttemptsRetried") == [
        ({"service": "berth-workflow", "Cause": "HostLost"}, 1.0)
    ]
    assert metric_points(out, "JobsFailed") == [({"service": "berth-workflow", "Cause": "OutOfMemory"}, 1.0)]


def test_classify_failure_names_the_cause_it_classified() -> None:
    w = World()
    job = w.submit()
    running, _host = w.run_to_running(job)
    result = w.workflow.classify_failure(job.id, running.attempts, "Berth.HostLost", "lease expired")
    assert result["action"] == "retry" and result["failure"] == "HostLost"
    again = w.workflow.classify_failure(job.id, running.attempts, "Berth.HostLost", "lease expired")
    assert "failure" not in again  # a retried task: the cause was counted once


class _Circuits:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def record_failure(self, region: str, instance_type: str, at: float) -> None:
        self.calls.append(("failure", region, instance_type))

    def record_success(self, region: str, instance_type: str, at: float) -> None:
        self.calls.append(("success", region, instance_type))

    def reset(self, region: str, instance_type: str | None) -> list[tuple[str, str]]:
        return [(region, instance_type or "*")]

    def list(self) -> list[CircuitEntry]:
        return []


def test_cloud_failures_count_as_batch_errors_of_their_region(capsys: Any) -> None:
    inner = _Circuits()
    counted = telemetry.CountedCircuits(inner)
    counted.record_failure("us-west-2", "*", 1.0)
    counted.record_failure("us-west-2", "p4d.24xlarge", 2.0)
    counted.record_success("us-east-1", "*", 3.0)
    assert counted.reset("us-west-2", None) == [("us-west-2", "*")] and counted.list() == []
    assert inner.calls == [
        ("failure", "us-west-2", "*"),
        ("failure", "us-west-2", "p4d.24xlarge"),
        ("success", "us-east-1", "*"),
    ]
    points = metric_points(capsys.readouterr().out, "BatchErrors")
    assert points == [({"service": "berth-cloud", "Region": "us-west-2"}, 1.0)] * 2
