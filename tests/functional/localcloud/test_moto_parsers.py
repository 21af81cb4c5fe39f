"""moto_events and moto_asl: EventBridge input paths and Step Functions programs built once, with the
same results as moto builds them per event and per execution."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from berth_tools.localcloud import moto_asl, moto_events

ROLE = "arn:aws:iam::123456789012:role/sfn"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    undo_events, undo_asl = moto_events.install(), moto_asl.install()
    try:
        with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
            yield
    finally:
        undo_asl()
        undo_events()


_INSTALL_UNDO = """
from moto.events.utils import EventTemplateParser
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
from berth_tools.localcloud import moto_asl, moto_events
parse, asl_parse = EventTemplateParser.parse, AmazonStateLanguageParser.parse
undo_events, undo_asl = moto_events.install(), moto_asl.install()
assert EventTemplateParser.parse is not parse and AmazonStateLanguageParser.parse is not asl_parse
moto_events.install()()  # a second install is a no-op (and so is its undo)
moto_asl.install()()
assert EventTemplateParser.parse is not parse
undo_asl()
undo_events()
assert EventTemplateParser.parse is parse and AmazonStateLanguageParser.parse is asl_parse
"""


def test_install_is_idempotent_and_undo_restores() -> None:
    # In a fresh interpreter: a local cloud started earlier in this process keeps the patches in place.
    done = subprocess.run([sys.executable, "-c", _INSTALL_UNDO], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _queue(name: str) -> tuple[Any, str, str]:
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return sqs, url, arn


def _bodies(sqs: Any, url: str, count: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < count:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
        assert messages, got
        got += [json.loads(m["Body"]) for m in messages]
    return got


def test_events_are_delivered_whole_and_transformed_as_moto_does(aws: None) -> None:
    events = boto3.client("events", region_name="us-east-1")
    sqs, whole_url, whole_arn = _queue("whole")
    _, shaped_url, shaped_arn = _queue("shaped")
    events.put_rule(Name="r", EventPattern=json.dumps({"source": ["berth"]}))
    events.put_targets(
        Rule="r",
        Targets=[
            {"Id": "whole", "Arn": whole_arn},
            {
                "Id": "shaped",
                "Arn": shaped_arn,
                "InputTransformer": {
                    "InputPathsMap": {
                        "job": "$.detail.job_id",
                        "to": "$.detail.to",
                        "missing": "$.detail.nope",
                    },
                    "InputTemplate": '{"job": "<job>", "to": "<to>", "missing": "<missing>"}',
                },
            },
        ],
    )
    before = moto_events.compiled.cache_info().hits
    for i in range(3):
        detail = {"job_id": f"j{i}", "to": "RUNNING"}
        events.put_events(Entries=[{"Source": "berth", "DetailType": "x", "Detail": json.dumps(detail)}])
    events.put_events(Entries=[{"Source": "other", "DetailType": "x", "Detail": "{}"}])  # matches no rule
    whole = _bodies(sqs, whole_url, 3)
    assert [e["detail"]["job_id"] for e in whole] == ["j0", "j1", "j2"]
    assert {e["source"] for e in whole} == {"berth"} and all(e["id"] and e["time"] for e in whole)
    assert _bodies(sqs, shaped_url, 3) == [
        {"job": f"j{i}", "to": "RUNNING", "missing": "<missing>"} for i in range(3)
    ]
    assert moto_events.compiled.cache_info().hits > before  # the second and third events reuse the paths


DEFINITION = {
    "StartAt": "Fan",
    "States": {
        "Fan": {
            "Type": "Map",
            "ItemsPath": "$.items",
            "ItemProcessor": {
                "StartAt": "Double",
                "States": {"Double": {"Type": "Pass", "Parameters": {"v.$": "$"}, "End": True}},
            },
            "ResultPath": "$.mapped",
            "Next": "Both",
        },
        "Both": {
            "Type": "Parallel",
            "Branches": [
                {"StartAt": "A", "States": {"A": {"Type": "Pass", "Result": "a", "End": True}}},
                {"StartAt": "B", "States": {"B": {"Type": "Pass", "Result": "b", "End": True}}},
            ],
            "ResultPath": "$.branches",
            "Next": "Pick",
        },
        "Pick": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.fail", "BooleanEquals": True, "Next": "Boom"}],
            "Default": "Done",
        },
        "Boom": {"Type": "Fail", "Error": "Asked", "Cause": "fail was true"},
        "Done": {"Type": "Succeed"},
    },
}


def _finish(sfn: Any, arn: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        described = sfn.describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            return dict(described)
        assert time.monotonic() < deadline, described
        time.sleep(0.05)


def test_concurrent_executions_share_one_program_and_keep_their_own_state(aws: None) -> None:
    sfn = boto3.client("stepfunctions", region_name="us-east-1")
    machine = sfn.create_state_machine(name="m", definition=json.dumps(DEFINITION), roleArn=ROLE)[
        "stateMachineArn"
    ]
    parsed = moto_asl.stats["parsed"]
    runs = {
        f"e{i}": sfn.start_execution(
            stateMachineArn=machine,
            name=f"e{i}",
            input=json.dumps({"items": list(range(i + 1)), "fail": i == 3}),
        )["executionArn"]
        for i in range(6)
    }
    results = {name: _finish(sfn, arn) for name, arn in runs.items()}
    assert moto_asl.stats["parsed"] == parsed  # parsed when created, never again
    for i in range(6):
        result = results[f"e{i}"]
        if i == 3:
            assert result["status"] == "FAILED" and result["error"] == "Asked"
            continue
        assert result["status"] == "SUCCEEDED", result
        output = json.loads(result["output"])
        assert output["mapped"] == [{"v": k} for k in range(i + 1)]
        assert output["branches"] == ["a", "b"]


def test_an_updated_definition_is_parsed_and_a_bad_one_refused_every_time(aws: None) -> None:
    sfn = boto3.client("stepfunctions", region_name="us-east-1")
    one = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Result": 1, "End": True}}}
    two = {"StartAt": "P", "States": {"P": {"Type": "Pass", "Result": 2, "End": True}}}
    machine = sfn.create_state_machine(name="u", definition=json.dumps(one), roleArn=ROLE)["stateMachineArn"]
    first = _finish(sfn, sfn.start_execution(stateMachineArn=machine, name="a")["executionArn"])
    sfn.update_state_machine(stateMachineArn=machine, definition=json.dumps(two))
    second = _finish(sfn, sfn.start_execution(stateMachineArn=machine, name="b")["executionArn"])
    assert (json.loads(first["output"]), json.loads(second["output"])) == (1, 2)
    bad = '{"StartAt": "X", "States": {"X": {"Type": "Nope"}}}'
    for _ in range(2):  # refused as moto refuses it (its error code is empty), and never cached
        with pytest.raises(ClientError):
            sfn.create_state_machine(name="bad", definition=bad, roleArn=ROLE)
        assert bad not in moto_asl._cache
