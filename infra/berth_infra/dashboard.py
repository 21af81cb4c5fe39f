"""The operations dashboard (``<stack>-operations``): the scheduler, the queue per team and GPU type,
the workflow's retries, the cloud's errors per region, the API, and the AWS services under them
(Lambda, SQS dead-letter queues, DynamoDB, Step Functions). docs/operations.md, "Reading the
dashboard", walks through it. Per-team and per-cause series are CloudWatch search expressions, so a
new team or cause appears without a deploy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from berth_infra.monitoring import CLOUD, FIVE_MINUTES, NAMESPACE, SCHEDULER, Monitored, berth_metric

ONE_MINUTE = Duration.minutes(1)


def search(
    metric: str, dimensions: Sequence[str], statistic: str, label: str, extra: str = ""
) -> cw.MathExpression:
    """Every series of ``metric`` in Berth's namespace with exactly these dimensions."""
    schema = ",".join([NAMESPACE, *sorted(dimensions)])
    query = f'MetricName="{metric}"' + (f" {extra}" if extra else "")
    return cw.MathExpression(
        expression=f"SEARCH('{{{schema}}} {query}', '{statistic}', 60)", label=label, period=ONE_MINUTE
    )


@dataclass(frozen=True)
class Watched:
    """The AWS resources whose own metrics the dashboard shows."""

    functions: Mapping[str, lambda_.IFunction]
    tables: Mapping[str, ddb.ITable]
    state_machine: sfn.IStateMachine


def graph(
    title: str,
    left: Sequence[cw.IMetric],
    right: Sequence[cw.IMetric] = (),
    width: int = 8,
    right_line: tuple[float, str] | None = None,
) -> cw.GraphWidget:
    return cw.GraphWidget(
        title=title,
        left=list(left),
        right=list(right),
        width=width,
        height=6,
        right_annotations=[cw.HorizontalAnnotation(value=right_line[0], label=right_line[1])]
        if right_line
        else None,
    )


class OperationsDashboard(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        monitored: Monitored,
        watched: Watched,
        alarms: Sequence[cw.IAlarm],
    ) -> None:
        super().__init__(scope, construct_id)
        self.dashboard_name = f"{Stack.of(self).stack_name}-operations"
        self.dashboard = cw.Dashboard(
            self, "Dashboard", dashboard_name=self.dashboard_name, default_interval=Duration.hours(3)
        )
        fns = watched.functions
        timeout_ms = monitored.scheduler_timeout_s * 1000
        self.widgets: list[cw.IWidget] = [
            cw.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24, height=4),
            # -- the scheduler ------------------------------------------------------------------------
            graph(
                "Scheduler pass (s) and invocation (ms)",
                [
                    berth_metric("PassSeconds", SCHEDULER, "Average", ONE_MINUTE),
                    berth_metric("PassSeconds", SCHEDULER, "Maximum", ONE_MINUTE),
                ],
                [monitored.scheduler.metric_duration(period=ONE_MINUTE, statistic="Maximum")],
                right_line=(timeout_ms, "Lambda timeout"),
            ),
            graph(
                "Placements per site, deferred by the deadline",
                [
                    berth_metric("JobsPlaced", {**SCHEDULER, "Site": site}, period=ONE_MINUTE)
                    for site in ("onprem", "cloud")
                ]
                + [berth_metric("PlacementsDeferred", SCHEDULER, period=ONE_MINUTE)],
            ),
            graph(
                "Hosts lost, queued jobs not read by the pass",
                [berth_metric("HostsLost", SCHEDULER, period=ONE_MINUTE)],
                [berth_metric("JobsNotConsidered", SCHEDULER, "Maximum", ONE_MINUTE)],
            ),
            # -- the queue ------------------------------------------------------------------------------
            graph(
                "Queue depth per team and GPU type",
                [search("QueueDepth", ["GpuType", "Tenant", "service"], "Maximum", "")],
            ),
            graph(
                "Oldest queued job age (s) per team and GPU type",
                [
                    search("OldestQueuedSeconds", ["GpuType", "Tenant", "service"], "Maximum", ""),
                    berth_metric("OldestQueuedSeconds", SCHEDULER, "Maximum", ONE_MINUTE),
                ],
            ),
            graph(
                "Monthly cloud budget used (%) per team",
                [search("BudgetUsedPercent", ["Tenant", "service"], "Maximum", "")],
            ),
            # -- the workflow, the cloud, the API -------------------------------------------------------
            graph(
                "Retries and failed jobs by cause",
                [search("AttemptsRetried", ["Cause", "service"], "Sum", "retried")],
                [search("JobsFailed", ["Cause", "service"], "Sum", "failed")],
            ),
            graph(
                "Batch errors per region",
                [
                    berth_metric("BatchErrors", {**CLOUD, "Region": r}, period=ONE_MINUTE)
                    for r in monitored.regions
                ],
            ),
            graph(
                "API requests by route and status class",
                [search("Requests", ["Route", "StatusClass", "service"], "Sum", "", 'StatusClass="2xx"')],
                [search("Requests", ["Route", "StatusClass", "service"], "Sum", "", 'NOT StatusClass="2xx"')],
            ),
            # -- AWS services ---------------------------------------------------------------------------
            graph(
                "Lambda errors",
                [f.metric_errors(period=ONE_MINUTE, label=n) for n, f in fns.items()],
                width=8,
            ),
            graph(
                "Lambda duration, p99 (ms)",
                [f.metric_duration(period=ONE_MINUTE, statistic="p99", label=n) for n, f in fns.items()],
                width=8,
            ),
            graph(
                "Lambda throttles",
                [f.metric_throttles(period=ONE_MINUTE, label=n) for n, f in fns.items()],
                width=8,
            ),
            graph(
                "Dead-letter queues (messages visible)",
                [
                    q.metric_approximate_number_of_messages_visible(
                        period=FIVE_MINUTES, statistic="Maximum", label=n
                    )
                    for n, q in monitored.dead_letter_queues.items()
                ],
            ),
            graph(
                "DynamoDB throttled requests",
                [
                    t.metric(m, period=ONE_MINUTE, statistic="Sum", label=f"{n} {m}")
                    for n, t in watched.tables.items()
                    for m in ("ReadThrottleEvents", "WriteThrottleEvents")
                ],
            ),
            graph(
                "Step Functions executions failed, timed out, aborted",
                [
                    watched.state_machine.metric_failed(period=ONE_MINUTE, statistic="Sum"),
                    watched.state_machine.metric_timed_out(period=ONE_MINUTE, statistic="Sum"),
                    watched.state_machine.metric_aborted(period=ONE_MINUTE, statistic="Sum"),
                ],
            ),
        ]
        # Laid out left to right, 24 columns a row.
        self.dashboard.add_widgets(*self.widgets)
