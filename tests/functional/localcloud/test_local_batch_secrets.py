"""Local AWS Batch resolves a job definition's ``secrets`` as ECS does: with the definition's
execution role (assumed in moto's STS, its IAM policies evaluated), into the process's environment
only; a secret the role may not read, a missing one, or secrets without an execution role fail the job
before it runs with ECS's ``ResourceInitializationError`` (never a value in the reason or the logs)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from berth_tools.localcloud import local_batch
from berth_tools.localcloud.cloud import LocalCloud
from tests.functional.localcloud.test_local_batch import QUEUE, _client, create_batch_environment

ACCOUNT = "123456789012"
VISION_VALUE = "s3cr3t-vision-value"
NLP_VALUE = "s3cr3t-nlp-value"
PRINT_HASH = (
    "import hashlib, os; v = os.environ['TOKEN']; "
    "print('sha256', hashlib.sha256(v.encode()).hexdigest(), 'len', len(v))"
)


def _arn(name: str) -> str:
    return f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:{name}"


@pytest.fixture(scope="module")
def batch(cloud: LocalCloud) -> Iterator[Any]:
    create_batch_environment(cloud)
    iam, sm = _client(cloud, "iam"), _client(cloud, "secretsmanager")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "ecs-tasks.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    # As the stack creates it (infra/berth_infra/cloud_roles.py): its tenant's secrets only.
    iam.create_role(RoleName="Berth-exec-vision", AssumeRolePolicyDocument=json.dumps(trust))
    iam.put_role_policy(
        RoleName="Berth-exec-vision",
        PolicyName="own-secrets",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": "secretsmanager:GetSecretValue",
                        "Resource": _arn("berth/vision/*"),
                    }
                ],
            }
        ),
    )
    sm.create_secret(Name="berth/vision/token", SecretString=VISION_VALUE)
    sm.create_secret(Name="berth/nlp/token", SecretString=NLP_VALUE)
    yield _client(cloud, "batch")


def _run(batch: Any, name: str, secrets: list[dict[str, str]], exec_role: bool = True) -> dict[str, Any]:
    props: dict[str, Any] = {
        "image": "public.ecr.aws/docker/library/python:3.11-slim",
        "command": ["true"],
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
        "secrets": secrets,
    }
    if exec_role:
        props["executionRoleArn"] = f"arn:aws:iam::{ACCOUNT}:role/Berth-exec-vision"
    batch.register_job_definition(
        jobDefinitionName=f"berth-img-{name}", type="container", containerProperties=props
    )
    job_id = name.replace("_", "-")
    answer = batch.submit_job(
        jobName=f"{job_id}-a1",
        jobQueue=QUEUE,
        jobDefinition=f"berth-img-{name}",
        containerOverrides={
            "command": ["python3", "-c", PRINT_HASH],
            "environment": [
                {"name": "BERTH_JOB_ID", "value": job_id},
                {"name": "BERTH_ATTEMPT", "value": "1"},
                {"name": "BERTH_TENANT", "value": "vision"},
            ],
        },
    )
    import time

    deadline = time.monotonic() + 30
    while True:
        job: dict[str, Any] = batch.describe_jobs(jobs=[answer["jobId"]])["jobs"][0]
        if job["status"] in ("SUCCEEDED", "FAILED") or time.monotonic() > deadline:
            return job


def _lines(cloud: LocalCloud, job: dict[str, Any]) -> list[str]:
    """The job's output: its awslogs stream (the definitions here name no log group: Batch's default)."""
    stream = job["container"].get("logStreamName")
    if not stream:
        return []
    logs = _client(cloud, "logs")
    events = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream, startFromHead=True)
    return [e["message"] for e in events["events"]]


def test_the_tenants_secret_reaches_the_process_environment_only(cloud: LocalCloud, batch: Any) -> None:
    done = _run(batch, "s-ok", [{"name": "TOKEN", "valueFrom": _arn("berth/vision/token")}])
    assert done["status"] == "SUCCEEDED", done.get("statusReason")
    digest = hashlib.sha256(VISION_VALUE.encode()).hexdigest()
    assert _lines(cloud, done) == [f"sha256 {digest} len {len(VISION_VALUE)}"]
    assert VISION_VALUE not in json.dumps(done, default=str)


@pytest.mark.parametrize(
    ("name", "value_from", "exec_role", "why"),
    [
        ("s-other-tenant", _arn("berth/nlp/token"), True, "AccessDeniedException"),
        ("s-missing", _arn("berth/vision/missing"), True, "ResourceNotFoundException"),
        ("s-no-role", _arn("berth/vision/token"), False, "no executionRoleArn"),
    ],
)
def test_a_secret_the_execution_role_cannot_read_fails_the_job_before_it_runs(
    cloud: LocalCloud, batch: Any, name: str, value_from: str, exec_role: bool, why: str
) -> None:
    done = _run(batch, name, [{"name": "TOKEN", "valueFrom": value_from}], exec_role)
    assert done["status"] == "FAILED", done
    reason = done["statusReason"]
    assert reason.startswith("ResourceInitializationError: unable to pull secrets"), reason
    assert why in reason, reason
    assert "exitCode" not in done["container"], done["container"]
    assert _lines(cloud, done) == []  # the command never ran: no stream
    text = json.dumps(done, default=str)
    assert NLP_VALUE not in text and VISION_VALUE not in text
    assert local_batch.SECRETS_REASON.split(":")[0] == "ResourceInitializationError"
