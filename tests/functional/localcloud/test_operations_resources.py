"""The stack's alarms, dashboard and alarm topic on the local cloud: what deploys, what is created
through the CloudWatch API (the alarms), what is skipped and declared so (``NOT_EMULATED_OPERATIONS``).
The deploy itself: test_real_template.py."""

from __future__ import annotations

import json
from pathlib import Path

from berth_tools.localcloud.cfn_alarms import take_alarms
from berth_tools.localcloud.cloudformation_deploy import NOT_EMULATED_OPERATIONS, prepare_template

TEMPLATE = Path(__file__).resolve().parents[3] / "cdk.out" / "Berth.template.json"
OPERATIONS_TYPES = {
    "AWS::CloudWatch::Alarm",
    "AWS::CloudWatch::Dashboard",
    "AWS::SNS::Topic",
    "AWS::SNS::TopicPolicy",
    "AWS::SNS::Subscription",
    "AWS::KMS::Key",
}


def test_operations_resources_deploy_or_are_declared_not_emulated() -> None:
    template = json.loads(TEMPLATE.read_text())
    present = {r["Type"] for r in template["Resources"].values()} & OPERATIONS_TYPES
    assert {"AWS::CloudWatch::Alarm", "AWS::CloudWatch::Dashboard", "AWS::SNS::Topic"} <= present
    prepared = prepare_template(template)
    skipped = set(prepared.skipped_types) & OPERATIONS_TYPES
    # Every operations resource moto cannot create is declared; the dashboard, topic and key deploy,
    # the alarms are taken out to be created through the CloudWatch API.
    assert skipped <= set(NOT_EMULATED_OPERATIONS)
    deployed = {"AWS::CloudWatch::Dashboard", "AWS::SNS::Topic", "AWS::KMS::Key", "AWS::CloudWatch::Alarm"}
    assert not skipped & deployed
    assert prepared.alarms and "cloudwatch-alarms" in prepared.applied_fixes
    assert all(len(why) > 30 for why in NOT_EMULATED_OPERATIONS.values())


def test_taking_the_alarms_leaves_their_arns_where_they_were_referenced() -> None:
    template = {
        "Resources": {
            "A1": {"Type": "AWS::CloudWatch::Alarm", "Properties": {"AlarmName": "S-A1", "Threshold": 1}},
            "Dash": {
                "Type": "AWS::CloudWatch::Dashboard",
                "DependsOn": ["A1"],
                "Properties": {"DashboardBody": {"Fn::Join": ["", [{"Fn::GetAtt": ["A1", "Arn"]}]]}},
            },
        },
        "Outputs": {"Name": {"Value": {"Ref": "A1"}}},
    }
    taken = take_alarms(template)
    assert taken == {"A1": {"AlarmName": "S-A1", "Threshold": 1}}
    assert set(template["Resources"]) == {"Dash"} and template["Resources"]["Dash"]["DependsOn"] == []
    assert template["Outputs"]["Name"]["Value"] == "S-A1"
    body = json.dumps(template["Resources"]["Dash"]["Properties"]["DashboardBody"])
    assert '"Fn::GetAtt"' not in body and '":alarm:", "S-A1"' in body
