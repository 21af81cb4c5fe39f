"""The stack's alarms, dashboard and alarm topic on the local cloud: what deploys, what is skipped and
declared so (``NOT_EMULATED_OPERATIONS``). The deploy itself: test_deploy_and_state.py."""

from __future__ import annotations

import json
from pathlib import Path

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
    skipped = set(prepare_template(template).skipped_types) & OPERATIONS_TYPES
    # Every operations resource moto cannot create is declared; the dashboard, topic and key deploy.
    assert skipped <= set(NOT_EMULATED_OPERATIONS)
    assert not skipped & {"AWS::CloudWatch::Dashboard", "AWS::SNS::Topic", "AWS::KMS::Key"}
    assert all(len(why) > 30 for why in NOT_EMULATED_OPERATIONS.values())
