"""The in-process Lambda runtime behind moto's Invoke API."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import boto3

from berth_tools.localcloud import moto_logs
from berth_tools.localcloud.cloud import LocalCloud


def _lambda(cloud: LocalCloud) -> Any:
    return cloud.session().client("lambda", endpoint_url=cloud.endpoint_url)


def test_invoke_runs_the_handler_with_the_functions_environment(cloud: LocalCloud) -> None:
    name = cloud.output("ApiFunctionName")
    result = _lambda(cloud).invoke(FunctionName=name, Payload=json.dumps({"direct": True}).encode())
    assert "FunctionError" not in result
    payload = json.loads(result["Payload"].read())
    assert payload["event"] == {"direct": True}
    assert payload["env"]["BERTH_JOBS_TABLE"] == cloud.output("JobsTableName")
    assert payload["env"]["AWS_ENDPOINT_URL"] == cloud.endpoint_url
    assert payload["env"]["AWS_REGION"] == "us-east-1"
    assert payload["env"]["_HANDLER"] == "localcloud_fake_handler.lambda_handler"
    ctx = payload["context"]
    assert ctx["function_name"] == name
    assert ctx["memory_limit_in_mb"] == 512
    assert ctx["invoked_function_arn"].endswith(f":function:{name}")
    assert 0 < ctx["remaining_ms"] <= 29_000
    assert ctx["log_group_name"] == cloud.stack.resources["ApiFunctionLogs0D7A2434"][1]  # type: ignore[union-attr]
    # the function's environment never leaks into the process
    assert os.environ.get("BERTH_JOBS_TABLE") != cloud.output("JobsTableName")


def test_the_handler_uses_the_execution_roles_temporary_credentials(cloud: LocalCloud) -> None:
    # the fake handler does not echo credentials; check the runtime's view of the environment instead
    from moto.awslambda.utils import get_backend

    assert cloud.runtime is not None
    fn = get_backend("123456789012", "us-east-1").get_function(cloud.output("ApiFunctionName"))
    env = cloud.runtime.function_environment(fn)
    assert env["AWS_SESSION_TOKEN"]
    sts = boto3.client(
        "sts",
        endpoint_url=cloud.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=env["AWS_SESSION_TOKEN"],
    )
    assert ":assumed-role/" in sts.get_caller_identity()["Arn"]


def test_exception_is_a_function_error_with_lambdas_payload(cloud: LocalCloud) -> None:
    result = _lambda(cloud).invoke(
        FunctionName=cloud.output("ApiFunctionName"),
        Payload=json.dumps({"path": "/x/boom"}).encode(),
        LogType="Tail",
    )
    assert result["FunctionError"] == "Unhandled"
    payload = json.loads(result["Payload"].read())
    assert payload["errorType"] == "RuntimeError"
    assert payload["errorMessage"] == "boom requested"
    assert payload["stackTrace"]
    tail = base64.b64decode(result["LogResult"]).decode()
    assert "START RequestId" in tail and "REPORT RequestId" in tail and "boom requested" in tail


def test_handler_output_goes_to_the_functions_log_group(cloud: LocalCloud) -> None:
    _lambda(cloud).invoke(
        FunctionName=cloud.output("ApiFunctionName"),
        Payload=json.dumps({"httpMethod": "GET", "path": "/logme"}),
    )
    logs = cloud.session().client("logs", endpoint_url=cloud.endpoint_url)
    group = cloud.stack.resources["ApiFunctionLogs0D7A2434"][1]  # type: ignore[union-attr]
    messages = [e["message"] for e in logs.filter_log_events(logGroupName=group)["events"]]
    assert "fake handler: GET /logme" in messages
    assert any(m.startswith("REPORT RequestId") for m in messages)
    # the group the function's LoggingConfig names is a function's group: its streams are bounded
    assert not group.startswith("/aws/lambda/") and moto_logs.is_function_group(group)


def test_timeout_is_enforced(cloud: LocalCloud) -> None:
    client = _lambda(cloud)
    name = cloud.output("ApiFunctionName")
    client.update_function_configuration(FunctionName=name, Timeout=1)
    try:
        started = time.monotonic()
        result = client.invoke(
            FunctionName=name,
            Payload=json.dumps({"httpMethod": "GET", "path": "/x", "queryStringParameters": {"sleep": "3"}}),
        )
        assert time.monotonic() - started < 2.5
        assert result["FunctionError"] == "Unhandled"
        payload = json.loads(result["Payload"].read())
        assert "Task timed out after 1.00 seconds" in payload["errorMessage"]
    finally:
        client.update_function_configuration(FunctionName=name, Timeout=29)
