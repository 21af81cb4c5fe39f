"""Alarms and their topic: what pages an operator (docs/operations.md, "Alarms", says what each means
and what to do). Every alarm notifies one SNS topic, encrypted with a customer-managed KMS key that
CloudWatch may use (the AWS-managed ``alias/aws/sns`` key refuses CloudWatch, whose notifications
would then be dropped); ``-c berth:alarmEmail=a@example.com[,b@...]`` subscribes addresses to it.

The metric names and dimensions are those ``berth.handlers.telemetry`` publishes (namespace
``Berth``); ``ALARM_METRICS`` names them once for the alarms and the dashboard (``dashboard.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

NAMESPACE = "Berth"
SCHEDULER = {"service": "berth-scheduler"}
CLOUD = {"service": "berth-cloud"}
FIVE_MINUTES = Duration.minutes(5)

#: Context keys (``-c key=value``) and their defaults.
DEFAULT_THRESHOLDS: dict[str, float] = {
    # the oldest queued job's age, seconds (since its submission)
    "berth:oldestQueuedAlarmSeconds": 3600,
    # a team's cloud spend this month, percent of its monthly cloud budget
    "berth:budgetAlarmPercent": 80,
    # cloud failures of one region in 10 minutes (a circuit opens at 3)
    "berth:batchErrorsAlarmCount": 3,
    # the scheduler invocation's longest duration, fraction of its Lambda timeout
    "berth:passDurationAlarmFraction": 0.8,
}


def berth_metric(
    name: str, dimensions: dict[str, str], statistic: str = "Sum", period: Duration = FIVE_MINUTES
) -> cw.Metric:
    return cw.Metric(
        namespace=NAMESPACE, metric_name=name, dimensions_map=dimensions, statistic=statistic, period=period
    )


@dataclass(frozen=True)
class Monitored:
    """What the alarms watch, as the stack built it."""

    scheduler: lambda_.Function
    scheduler_timeout_s: int
    dead_letter_queues: dict[str, sqs.IQueue]
    regions: list[str]
    tenants: list[str]


def dead_letter_queues(scope: Construct) -> dict[str, sqs.IQueue]:
    """Every queue of the stack that some queue's redrive policy sends to, by its construct id."""
    found: dict[str, sqs.IQueue] = {}
    for node in Stack.of(scope).node.find_all():
        if isinstance(node, sqs.Queue) and node.dead_letter_queue is not None:
            dlq = node.dead_letter_queue.queue
            found[dlq.node.id] = dlq
    return dict(sorted(found.items()))


class Alarms(Construct):
    """The alarm topic and one alarm per condition an operator must act on."""

    def __init__(self, scope: Construct, construct_id: str, *, watched: Monitored) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        threshold = {
            key: float(self.node.try_get_context(key) or default)
            for key, default in DEFAULT_THRESHOLDS.items()
        }
        self.key = kms.Key(
            self,
            "TopicKey",
            description="Berth alarm topic encryption (CloudWatch may use it to publish)",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        # CloudWatch encrypts what it publishes to the topic with this key (AWS's documented key policy
        # for alarms on an encrypted topic).
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
            )
        )
        self.topic = sns.Topic(
            self, "Topic", display_name="Berth alarms", master_key=self.key, enforce_ssl=True
        )
        emails = str(self.node.try_get_context("berth:alarmEmail") or "")
        for address in filter(None, (e.strip() for e in emails.split(","))):
            self.topic.add_subscription(subs.EmailSubscription(address))
        self.alarms: dict[str, cw.Alarm] = {}
        self.prefix = stack.stack_name

        self.add(
            "OldestQueuedJob",
            berth_metric("OldestQueuedSeconds", SCHEDULER, "Maximum"),
            threshold["berth:oldestQueuedAlarmSeconds"],
            "A job has waited in the queue longer than the threshold (seconds since its submission).",
            evaluation_periods=2,
        )
        self.add(
            "SchedulerNotRunning",
            berth_metric("PassSeconds", SCHEDULER, "SampleCount", Duration.minutes(10)),
            1,
            "No scheduling pass for 10 minutes (the timer asks for one every minute).",
            comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            missing=cw.TreatMissingData.BREACHING,
        )
        self.add(
            "HostsLost",
            berth_metric("HostsLost", SCHEDULER),
            1,
            "The scheduler declared at least one on-prem host lost (silent past its lease).",
        )
        self.add(
            "SchedulerErrors",
            watched.scheduler.metric_errors(period=FIVE_MINUTES, statistic="Sum"),
            1,
            "Scheduling passes fail (SchedulerFunction errors in 2 of the last 3 five-minute periods).",
            evaluation_periods=3,
            datapoints=2,
        )
        near = threshold["berth:passDurationAlarmFraction"]
        self.add(
            "SchedulerPassNearTimeout",
            watched.scheduler.metric_duration(period=FIVE_MINUTES, statistic="Maximum"),
            round(near * watched.scheduler_timeout_s * 1000),
            f"A scheduler invocation took {near:.0%} of its {watched.scheduler_timeout_s} s Lambda timeout.",
            evaluation_periods=2,
        )
        for name, dlq in watched.dead_letter_queues.items():
            self.add(
                f"{name}Depth",
                dlq.metric_approximate_number_of_messages_visible(period=FIVE_MINUTES, statistic="Maximum"),
                1,
                f"Messages in the dead-letter queue {name}: their processing failed every redelivery.",
                anchor="dead-letter-queue-depth",
            )
        for region in watched.regions:
            self.add(
                f"BatchErrors-{region}",
                berth_metric("BatchErrors", {**CLOUD, "Region": region}, period=Duration.minutes(10)),
                threshold["berth:batchErrorsAlarmCount"],
                f"Cloud failures in {region} (capacity, Batch API errors, spot interruptions) in 10 minutes.",
                anchor="batcherrors",
            )
        for tenant in watched.tenants:
            self.add(
                f"BudgetBurn-{tenant}",
                berth_metric("BudgetUsedPercent", {**SCHEDULER, "Tenant": tenant}, "Maximum"),
                threshold["berth:budgetAlarmPercent"],
                f"Team {tenant} has spent this share (%) of its monthly cloud budget.",
                anchor="budgetburn",
            )

    def add(
        self,
        alarm_id: str,
        metric: cw.IMetric,
        threshold: float,
        description: str,
        *,
        evaluation_periods: int = 1,
        datapoints: int | None = None,
        comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        missing: cw.TreatMissingData = cw.TreatMissingData.NOT_BREACHING,
        anchor: str | None = None,
    ) -> cw.Alarm:
        alarm = cw.Alarm(
            self,
            alarm_id,
            alarm_name=f"{self.prefix}-{alarm_id}",
            alarm_description=f"{description} Runbook: docs/operations.md#{anchor or alarm_id.lower()}",
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints,
            comparison_operator=comparison,
            treat_missing_data=missing,
        )
        action = cw_actions.SnsAction(self.topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)
        self.alarms[alarm_id] = alarm
        return alarm
