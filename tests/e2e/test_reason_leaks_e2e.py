"""A job that prints its secret and fails leaves the value in its log only (issue 20, finding 5).

A real process agent runs an on-prem job of team vision that reads its secret (``secrets:``), prints
it on stderr as its last line and exits 3. The job FAILS with Berth's own reason (the exit code and
``see `berth logs <id>```); the value is in the job's log (so the test would see a leak) and nowhere
else Berth keeps or sends: no item of any DynamoDB table, no ``Berth Job State Change`` event on
the bus (the example rule's queue), nothing in the job's Step Functions execution history, no
control-plane function's log, no API answer.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.e2e.conftest import LocalCloudProcess, log_lines, start_local_cloud

VALUE = "leak-" + secrets.token_hex(12)
SCRIPT = """
import os, sys
print("starting", flush=True)
print("Error: the API refused token " + os.environ["TOKEN"], file=sys.stderr, flush=True)
sys.exit(3)
"""


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    lc = start_local_cloud(
        tmp_path_factory.mktemp("berth-leaks") / "state",
        "--agents",
        "1",
        "--gpus-per-agent",
        "1",
        "--gpu-type",
        "A100",
        "--agent-kind",
        "process",
    )
    try:
        lc.aws("secretsmanager").create_secret(Name="berth/vision/api-token", SecretString=VALUE)
        yield lc
    finally:
        status = lc.stop()
    assert status == 0, lc.log_tail()


def _wait(client: Any, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("COMPLETED", "FAILED", "CANCELED"):
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def _tables(cloud: LocalCloudProcess) -> dict[str, list[Any]]:
    ddb = cloud.aws("dynamodb")
    out: dict[str, list[Any]] = {}
    for name in ddb.list_tables()["TableNames"]:
        out[name] = [
            item for page in ddb.get_paginator("scan").paginate(TableName=name) for item in page["Items"]
        ]
    return out


def _bus_events(cloud: LocalCloudProcess, job_id: str) -> list[Any]:
    outputs = json.loads((cloud.state_dir / "outputs.json").read_text())
    sqs = cloud.aws("sqs")
    seen: list[Any] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(e["detail"].get("to") == "FAILED" for e in seen):
        got = sqs.receive_message(
            QueueUrl=outputs["JobEventsQueueUrl"], MaxNumberOfMessages=10, WaitTimeSeconds=1
        )
        seen += [
            e
            for m in got.get("Messages", [])
            if (e := json.loads(m["Body"]))["detail"].get("job_id") == job_id
        ]
    return seen


def _history(cloud: LocalCloudProcess, job_id: str) -> list[Any]:
    outputs = json.loads((cloud.state_dir / "outputs.json").read_text())
    arn = outputs["StateMachineArn"].replace(":stateMachine:", ":execution:") + ":" + job_id
    sfn = cloud.aws("stepfunctions")
    deadline = time.monotonic() + 20
    while sfn.describe_execution(executionArn=arn)["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.25)
    return [
        e
        for page in sfn.get_paginator("get_execution_history").paginate(executionArn=arn)
        for e in page["events"]
    ]


def _function_logs(cloud: LocalCloudProcess) -> list[str]:
    """Every control-plane log event (not the jobs' own groups)."""
    logs = cloud.aws("logs")
    out: list[str] = []
    for group in logs.describe_log_groups()["logGroups"]:
        name = group["logGroupName"]
        if name.startswith("/berth/jobs/"):
            continue
        for stream in logs.describe_log_streams(logGroupName=name)["logStreams"]:
            got = logs.get_log_events(
                logGroupName=name, logStreamName=stream["logStreamName"], startFromHead=True
            )
            out += [e["message"] for e in got["events"]]
    return out


def test_a_printed_secret_stays_in_the_jobs_log(cloud: LocalCloudProcess) -> None:
    alice = cloud.client("alice")
    spec = {
        "name": "leaky",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", SCRIPT],
        "resources": {"gpu_type": "A100", "gpus": 1},
        "secrets": {"TOKEN": "berth/vision/api-token"},
    }
    r = alice.post("/v1/jobs", json=spec)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    done = _wait(alice, job_id)
    assert done["status"] == "FAILED" and done["attempts"] == 1, done
    assert "NonZeroExit (permanent)" in done["reason"], done["reason"]
    assert f"exited with code 3; see `berth logs {job_id}`" in done["reason"], done["reason"]
    # The job did print it (so a leak would be seen below): its log holds it.
    assert any(VALUE in line for line in log_lines(alice, job_id, 1, 2)), "the job did not print its secret"

    kept = {
        "tables": _tables(cloud),
        "bus": _bus_events(cloud, job_id),
        "history": _history(cloud, job_id),
        "answers": [done, alice.get(f"/v1/jobs/{job_id}/events").json(), alice.get("/v1/jobs").json()],
    }
    assert kept["bus"] and kept["history"] and kept["tables"]
    for where, what in kept.items():
        assert VALUE not in json.dumps(what, default=str), where
    assert not [line for line in _function_logs(cloud) if VALUE in line]
