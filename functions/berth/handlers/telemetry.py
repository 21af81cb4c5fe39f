"""Operational metrics with dimensions: CloudWatch embedded metric format through Powertools'
``single_metric`` (one EMF line per figure), namespace ``Berth``. The dashboard and alarms of the
stack (``infra/berth_infra/monitoring.py``) read exactly these names and dimension sets, so each
carries an explicit ``service`` dimension rather than the emitting function's
``POWERTOOLS_SERVICE_NAME``; ``BatchErrors`` comes from four functions and is one metric per region.

Dimensions stay bounded: routes are API Gateway's resource templates (never a path with a job id),
status classes are ``2xx``/``4xx``/``5xx``, failure causes are ``Failure`` names, teams and GPU
types come from the store (a pass publishes at most ``MAX_QUEUE_SERIES`` team and GPU type pairs,
the oldest first). docs/operations.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from berth.domain.ports import CircuitEntry, CircuitRepository
from berth.logic.scheduler_service import PassReport

NAMESPACE = "Berth"
API_SERVICE = "berth-api"
SCHEDULER_SERVICE = "berth-scheduler"
WORKFLOW_SERVICE = "berth-workflow"
CLOUD_SERVICE = "berth-cloud"
#: Team and GPU type pairs whose queue one pass publishes at most (each pair is two custom metrics).
MAX_QUEUE_SERIES = 100


def emit(name: str, unit: MetricUnit, value: float, service: str, **dimensions: str) -> None:
    """One metric with its own dimension set, printed at once (no flush needed)."""
    with single_metric(
        name=name,
        unit=unit,
        value=value,
        namespace=NAMESPACE,
        default_dimensions={"service": service, **dimensions},
    ):
        pass


# -- API --------------------------------------------------------------------------------------------
def status_class(status_code: int) -> str:
    return f"{min(5, max(1, status_code // 100))}xx"


def api_route(event: Mapping[str, Any]) -> str:
    """``GET /v1/jobs/{id}``: API Gateway's resource template, never the path itself."""
    method = str(event.get("httpMethod") or "?")
    resource = event.get("resource")
    return f"{method} {resource}" if isinstance(resource, str) and resource else f"{method} unmatched"


def api_request(event: Mapping[str, Any], status_code: int) -> None:
    emit(
        "Requests",
        MetricUnit.Count,
        1,
        API_SERVICE,
        Route=api_route(event),
        StatusClass=status_class(status_code),
    )


# -- scheduler --------------------------------------------------------------------------------------
def scheduling_pass(report: PassReport) -> None:
    """The per-site, per-team and per-GPU-type figures of a pass (its totals go in the handler's
    ``Metrics`` blob: ``JobsPlaced``, ``PassSeconds``, ``HostsLost``, ``OldestQueuedSeconds``...)."""
    for site, placed in sorted(report.placed_by_site.items()):
        emit("JobsPlaced", MetricUnit.Count, placed, SCHEDULER_SERVICE, Site=site)
    oldest_first = sorted(report.figures.queue, key=lambda q: -q.oldest_s)[:MAX_QUEUE_SERIES]
    for q in oldest_first:
        dims = {"Tenant": q.tenant, "GpuType": q.gpu_type}
        emit("QueueDepth", MetricUnit.Count, q.depth, SCHEDULER_SERVICE, **dims)
        emit("OldestQueuedSeconds", MetricUnit.Seconds, q.oldest_s, SCHEDULER_SERVICE, **dims)
    for tenant, pct in report.figures.budget_used_pct.items():
        emit("BudgetUsedPercent", MetricUnit.Percent, pct, SCHEDULER_SERVICE, Tenant=tenant)


# -- workflow ---------------------------------------------------------------------------------------
def attempt_classified(result: Mapping[str, Any]) -> None:
    """``classify_failure``'s answer: a retry counts under ``AttemptsRetried``, a job that failed for
    good under ``JobsFailed``, each by cause (a repeated classification carries no cause: not counted
    twice)."""
    cause = result.get("failure")
    if not cause:
        return
    name = {"retry": "AttemptsRetried", "fail": "JobsFailed"}.get(str(result.get("action")))
    if name is not None:
        emit(name, MetricUnit.Count, 1, WORKFLOW_SERVICE, Cause=str(cause))


# -- cloud ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CountedCircuits:
    """A ``CircuitRepository`` that counts each cloud failure it records as ``BatchErrors`` of its
    region: every failure a circuit hears of is the cloud's own (capacity, the Batch API failing or
    throttling, spot interruptions, an instance that could not start a container), wherever the
    dispatcher, the Batch events or the pass's sweep noticed it."""

    inner: CircuitRepository

    def record_failure(self, region: str, instance_type: str, at: float) -> None:
        self.inner.record_failure(region, instance_type, at)
        emit("BatchErrors", MetricUnit.Count, 1, CLOUD_SERVICE, Region=region)

    def record_success(self, region: str, instance_type: str, at: float) -> None:
        self.inner.record_success(region, instance_type, at)

    def reset(self, region: str, instance_type: str | None) -> list[tuple[str, str]]:
        return self.inner.reset(region, instance_type)

    def list(self) -> list[CircuitEntry]:
        return self.inner.list()
