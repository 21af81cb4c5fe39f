"""The stack's CloudWatch alarms on the local cloud. moto's CloudFormation does not implement
``AWS::CloudWatch::Alarm``, but its CloudWatch API stores alarms: the deploy takes them out of the
template (``take_alarms``; a reference to one, such as the dashboard's alarm widget, becomes the ARN
CloudFormation would give it) and creates them with ``PutMetricAlarm`` once the stack is up
(``create_alarms``), so ``aws cloudwatch describe-alarms`` answers locally as on AWS. Nothing
evaluates them: they stay ``INSUFFICIENT_DATA``, and the metrics are EMF lines in the log groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3

ALARM = "AWS::CloudWatch::Alarm"
#: Template properties that PutMetricAlarm takes as they are (after resolving references).
_PASSED = (
    "AlarmName",
    "AlarmDescription",
    "ActionsEnabled",
    "OKActions",
    "AlarmActions",
    "InsufficientDataActions",
    "MetricName",
    "Namespace",
    "Statistic",
    "ExtendedStatistic",
    "Dimensions",
    "Period",
    "Unit",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "Metrics",
)


def _alarm_arn(name: str) -> dict[str, Any]:
    return {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":cloudwatch:", {"Ref": "AWS::Region"}, ":",
             {"Ref": "AWS::AccountId"}, ":alarm:", name],
        ]
    }  # fmt: skip


def _swap(node: Any, names: dict[str, str]) -> Any:
    """References to a taken alarm: ``Ref`` is its name, ``Fn::GetAtt [id, Arn]`` its ARN."""
    if isinstance(node, list):
        return [_swap(n, names) for n in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("Ref")
    if isinstance(ref, str) and ref in names and len(node) == 1:
        return names[ref]
    get_att = node.get("Fn::GetAtt")
    if isinstance(get_att, list) and len(get_att) == 2 and get_att[0] in names and len(node) == 1:
        return _alarm_arn(names[get_att[0]])
    return {k: _swap(v, names) for k, v in node.items()}


def take_alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Remove the alarms (logical id -> properties) from ``template``, in place. Each must have a
    literal ``AlarmName`` (Berth's do), since nothing else could name it before it exists."""
    resources: dict[str, Any] = template.get("Resources", {})
    taken = {lid: res.get("Properties", {}) for lid, res in resources.items() if res.get("Type") == ALARM}
    names: dict[str, str] = {}
    for lid, props in taken.items():
        name = props.get("AlarmName")
        if not isinstance(name, str):
            raise ValueError(f"alarm {lid} has no literal AlarmName; the local cloud cannot create it")
        names[lid] = name
        del resources[lid]
    for res in resources.values():
        depends = res.get("DependsOn")
        if isinstance(depends, str):
            depends = [depends]
        if isinstance(depends, list) and any(d in taken for d in depends):
            res["DependsOn"] = [d for d in depends if d not in taken]
    for key in list(template):
        template[key] = _swap(template[key], names)
    return taken


def create_alarms(
    session: boto3.session.Session,
    endpoint_url: str,
    alarms: dict[str, dict[str, Any]],
    resolve: Callable[[Any], Any],
) -> dict[str, str]:
    """PutMetricAlarm for each taken alarm, references resolved against the deployed stack; returns
    logical id -> alarm name."""
    cloudwatch = session.client("cloudwatch", endpoint_url=endpoint_url)
    created: dict[str, str] = {}
    for lid, props in alarms.items():
        request = {key: resolve(props[key]) for key in _PASSED if key in props}
        request["Threshold"] = float(request["Threshold"])
        cloudwatch.put_metric_alarm(**request)
        created[lid] = str(request["AlarmName"])
    return created
