"""The operations dashboard, the alarms and their topic (docs/operations.md documents each alarm)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aws_cdk import App, Duration, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Match, Template

from berth.handlers import telemetry
from berth_infra import monitoring
from berth_infra.monitoring import Alarms, Monitored, dead_letter_queues
from tests.infra.conftest import Synthesized

REPO_ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("us-east-1", "us-east-2", "us-west-2")
TENANTS = ("vision", "nlp", "platform")
DLQS = ("BatchEventsDlq", "BatchSubmitDlq", "SchedulerTriggerDlq")


def _alarms(s: Synthesized) -> dict[str, dict[str, Any]]:
    """Alarm properties by alarm name."""
    return {
        r["Properties"]["AlarmName"]: r["Properties"] for r in s.resources("AWS::CloudWatch::Alarm").values()
    }


def _topic_id(s: Synthesized) -> str:
    (topic_id,) = s.resources("AWS::SNS::Topic")
    return topic_id


def _dims(props: dict[str, Any]) -> dict[str, Any]:
    return {d["Name"]: d["Value"] for d in props.get("Dimensions", [])}


def test_the_alarms_are_these(synthesized: Synthesized) -> None:
    assert set(_alarms(synthesized)) == {
        "Berth-OldestQueuedJob",
        "Berth-SchedulerNotRunning",
        "Berth-HostsLost",
        "Berth-SchedulerErrors",
        "Berth-SchedulerPassNearTimeout",
        *(f"Berth-{dlq}Depth" for dlq in DLQS),
        *(f"Berth-BatchErrors-{region}" for region in REGIONS),
        *(f"Berth-BudgetBurn-{tenant}" for tenant in TENANTS),
    }


def test_every_alarm_notifies_the_topic_and_names_its_runbook(synthesized: Synthesized) -> None:
    topic = {"Ref": _topic_id(synthesized)}
    doc = (REPO_ROOT / "docs" / "operations.md").read_text()
    anchors = {_anchor(title) for title in re.findall(r"^#+ (.+)$", doc, flags=re.MULTILINE)}
    for name, props in _alarms(synthesized).items():
        assert props["AlarmActions"] == [topic] and props["OKActions"] == [topic], name
        runbook = props["AlarmDescription"].split("Runbook: docs/operations.md#")[1]
        assert runbook in anchors, f"{name}: no section #{runbook} in docs/operations.md"


def _anchor(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_the_topic_is_encrypted_with_a_key_cloudwatch_may_use(synthesized: Synthesized) -> None:
    (topic,) = synthesized.resources("AWS::SNS::Topic").values()
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = synthesized.json["Resources"][key_id]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    grants = [
        st
        for st in key["Properties"]["KeyPolicy"]["Statement"]
        if st.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}
    ]
    assert len(grants) == 1 and set(grants[0]["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    synthesized.template.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            }
        },
    )
    # No address configured: no subscription (cdk.json sets none).
    assert synthesized.resources("AWS::SNS::Subscription") == {}
    outputs = synthesized.json["Outputs"]
    assert outputs["AlarmTopicArn"]["Value"] == {"Ref": _topic_id(synthesized)}


def test_every_dead_letter_queue_has_a_depth_alarm(synthesized: Synthesized) -> None:
    queues = synthesized.resources("AWS::SQS::Queue")
    dlq_ids = {
        q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        for q in queues.values()
        if "RedrivePolicy" in q["Properties"]
    }
    assert len(dlq_ids) == len(DLQS)
    watched = {
        _dims(p)["QueueName"]["Fn::GetAtt"][0]
        for p in _alarms(synthesized).values()
        if p["MetricName"] == "ApproximateNumberOfMessagesVisible"
    }
    assert watched == dlq_ids
    for name in DLQS:
        props = _alarms(synthesized)[f"Berth-{name}Depth"]
        assert props["Namespace"] == "AWS/SQS" and props["Statistic"] == "Maximum" and props["Threshold"] == 1
        assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_scheduler_alarms(synthesized: Synthesized) -> None:
    alarms = _alarms(synthesized)
    scheduler = {"service": telemetry.SCHEDULER_SERVICE}
    oldest = alarms["Berth-OldestQueuedJob"]
    assert (oldest["Namespace"], oldest["MetricName"], _dims(oldest)) == (
        telemetry.NAMESPACE,
        "OldestQueuedSeconds",
        scheduler,
    )
    assert (
        oldest["Statistic"] == "Maximum" and oldest["Threshold"] == 3600 and oldest["EvaluationPeriods"] == 2
    )
    assert oldest["TreatMissingData"] == "notBreaching"
    lost = alarms["Berth-HostsLost"]
    assert (lost["MetricName"], _dims(lost), lost["Statistic"], lost["Threshold"]) == (
        "HostsLost",
        scheduler,
        "Sum",
        1,
    )
    silent = alarms["Berth-SchedulerNotRunning"]
    assert (silent["MetricName"], silent["Statistic"], silent["ComparisonOperator"]) == (
        "PassSeconds",
        "SampleCount",
        "LessThanThreshold",
    )
    assert silent["TreatMissingData"] == "breaching"
    scheduler_fn = synthesized.stack.workflow.scheduler_fn.function
    fn_ref = {"Ref": synthesized.stack.get_logical_id(scheduler_fn.node.default_child)}  # type: ignore[arg-type]
    errors = alarms["Berth-SchedulerErrors"]
    assert (errors["Namespace"], errors["MetricName"], _dims(errors)) == (
        "AWS/Lambda",
        "Errors",
        {"FunctionName": fn_ref},
    )
    assert (errors["EvaluationPeriods"], errors["DatapointsToAlarm"]) == (3, 2)
    near = alarms["Berth-SchedulerPassNearTimeout"]
    timeout_s = synthesized.json["Resources"][fn_ref["Ref"]]["Properties"]["Timeout"]
    assert (near["MetricName"], _dims(near), near["Statistic"]) == (
        "Duration",
        {"FunctionName": fn_ref},
        "Maximum",
    )
    assert near["Threshold"] == 0.8 * timeout_s * 1000


def test_batch_errors_per_region_and_budget_burn_per_team(synthesized: Synthesized) -> None:
    alarms = _alarms(synthesized)
    for region in REGIONS:
        props = alarms[f"Berth-BatchErrors-{region}"]
        assert (props["MetricName"], _dims(props), props["Statistic"], props["Period"]) == (
            "BatchErrors",
            {"service": telemetry.CLOUD_SERVICE, "Region": region},
            "Sum",
            600,
        )
        assert props["Threshold"] == 3
    for tenant in TENANTS:
        props = alarms[f"Berth-BudgetBurn-{tenant}"]
        assert (props["MetricName"], _dims(props), props["Statistic"], props["Threshold"]) == (
            "BudgetUsedPercent",
            {"service": telemetry.SCHEDULER_SERVICE, "Tenant": tenant},
            "Maximum",
            80,
        )
        assert props["TreatMissingData"] == "notBreaching"  # a team without a budget publishes nothing


def _dashboard_body(s: Synthesized) -> dict[str, Any]:
    (dashboard,) = s.resources("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body: dict[str, Any] = json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))
    return body


def test_the_dashboard_shows_every_signal(synthesized: Synthesized) -> None:
    body = _dashboard_body(synthesized)
    titles = [w["properties"]["title"] for w in body["widgets"]]
    assert titles == [
        "Alarms",
        "Scheduler pass (s) and invocation (ms)",
        "Placements per site, deferred by the deadline",
        "Hosts lost, queued jobs not read by the pass",
        "Queue depth per team and GPU type",
        "Oldest queued job age (s) per team and GPU type",
        "Monthly cloud budget used (%) per team",
        "Retries and failed jobs by cause",
        "Batch errors per region",
        "API requests by route and status class",
        "Lambda errors",
        "Lambda duration, p99 (ms)",
        "Lambda throttles",
        "Dead-letter queues (messages visible)",
        "DynamoDB throttled requests",
        "Step Functions executions failed, timed out, aborted",
    ]
    (alarm_widget,) = [w for w in body["widgets"] if w["type"] == "alarm"]
    assert len(alarm_widget["properties"]["alarms"]) == len(_alarms(synthesized))
    text = json.dumps(body)
    for metric in (
        "PassSeconds",
        "JobsPlaced",
        "PlacementsDeferred",
        "HostsLost",
        "QueueDepth",
        "OldestQueuedSeconds",
        "BudgetUsedPercent",
        "AttemptsRetried",
        "JobsFailed",
        "BatchErrors",
        "Requests",
        "Throttles",
        "ApproximateNumberOfMessagesVisible",
        "ReadThrottleEvents",
        "WriteThrottleEvents",
        "ExecutionsFailed",
        "ExecutionsTimedOut",
    ):
        assert metric in text, metric
    # Per-team series come from search expressions over exactly the published dimensions.
    assert "SEARCH('{Berth,GpuType,Tenant,service} MetricName=\\\"QueueDepth\\\"', 'Maximum', 60)" in text
    assert synthesized.json["Outputs"]["DashboardName"]["Value"] == "Berth-operations"


def test_alarm_dimensions_are_the_published_ones() -> None:
    """The infra names the services the handlers pin (a rename on one side breaks the alarms)."""
    assert monitoring.NAMESPACE == telemetry.NAMESPACE
    assert monitoring.SCHEDULER == {"service": telemetry.SCHEDULER_SERVICE}
    assert monitoring.CLOUD == {"service": telemetry.CLOUD_SERVICE}


def _small_stack(context: dict[str, Any]) -> Template:
    """The alarms alone, on a stack of their own (no cdk-nag: quick), to vary the context."""
    app = App(context=context)
    stack = Stack(app, "Small")
    scheduler = lambda_.Function(
        stack,
        "Scheduler",
        runtime=lambda_.Runtime.PYTHON_3_12,
        handler="index.handler",
        code=lambda_.Code.from_inline("def handler(e, c): pass"),
        timeout=Duration.seconds(30),
    )
    sqs.Queue(
        stack,
        "Work",
        dead_letter_queue=sqs.DeadLetterQueue(queue=sqs.Queue(stack, "WorkDlq"), max_receive_count=3),
    )
    Alarms(
        stack,
        "Alarms",
        watched=Monitored(scheduler, 30, dead_letter_queues(stack), ["eu-west-1"], ["vision"]),
    )
    return Template.from_stack(stack)


def test_alarm_emails_and_thresholds_come_from_context() -> None:
    template = _small_stack(
        {
            "berth:alarmEmail": "ops@example.com, oncall@example.com",
            "berth:oldestQueuedAlarmSeconds": "600",
            "berth:budgetAlarmPercent": 95,
        }
    )
    subs = template.find_resources("AWS::SNS::Subscription")
    assert sorted(s["Properties"]["Endpoint"] for s in subs.values()) == [
        "oncall@example.com",
        "ops@example.com",
    ]
    assert {s["Properties"]["Protocol"] for s in subs.values()} == {"email"}
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm", {"AlarmName": "Small-OldestQueuedJob", "Threshold": 600}
    )
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm", {"AlarmName": "Small-BudgetBurn-vision", "Threshold": 95}
    )
    template.has_resource_properties("AWS::CloudWatch::Alarm", {"AlarmName": "Small-WorkDlqDepth"})
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm", {"AlarmName": "Small-SchedulerPassNearTimeout", "Threshold": 24000}
    )
