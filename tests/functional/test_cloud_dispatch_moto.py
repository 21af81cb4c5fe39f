"""The cloud branch's adapters on moto: AWS Batch (a compute environment and the queue created
directly; ``batch.use_docker: false`` marks jobs SUCCEEDED at once), the FIFO submit queue, the jobs
table and the circuits item. Submit -> Batch job -> events -> the token answered; redelivery; one
job definition per image; the SQS handler; AWS errors translated."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from berth.domain.cloud import (
    BatchStatus,
    CloudRejected,
    CloudSettings,
    CloudThrottled,
    CloudUnavailable,
    SubmitRequest,
    job_definition_name,
)
from berth.domain.job import Job, iso, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement
from berth.domain.status import JobStatus
from berth.domain.storage import job_checkpoint_prefix
from berth.logic.cloud_dispatch import CloudDispatchService
from tests.functional.conftest import BUCKETS, EVENTS, TABLES, Calls, cold_start, create_tables

REGION = "us-east-1"
QUEUE = f"berth-{REGION}-g5_xlarge-ondemand"
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


class Tokens:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def succeed(self, token: str, output: dict[str, Any]) -> bool:
        self.calls.append(("succeed", token, output))
        return True

    def fail(self, token: str, error: str, cause: str) -> bool:
        self.calls.append(("fail", token, error))
        return True

    def heartbeat(self, token: str) -> bool:
        return True


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[CloudDispatchService, Tokens, str]]:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "POWERTOOLS_SERVICE_NAME": "berth-batch-submit",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "POWERTOOLS_METRICS_NAMESPACE": "Berth",
        **TABLES,
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws(config={"batch": {"use_docker": False}}):
        from berth.dal.batch import BotoBatchGateway, RateLimiter, SqsSubmitQueue
        from berth.dal.circuits import DynamoCircuitRepository
        from berth.dal.jobs import DynamoJobRepository

        create_tables(boto3.client("dynamodb", region_name=REGION))
        role = boto3.client("iam").create_role(RoleName="batch-service", AssumeRolePolicyDocument="{}")
        batch = boto3.client("batch", region_name=REGION)
        ce = batch.create_compute_environment(
            computeEnvironmentName=QUEUE, type="UNMANAGED", state="ENABLED", serviceRole=role["Role"]["Arn"]
        )
        batch.create_job_queue(
            jobQueueName=QUEUE,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}],
        )
        url = boto3.client("sqs", region_name=REGION).create_queue(
            QueueName="berth-submit.fifo", Attributes={"FifoQueue": "true"}
        )["QueueUrl"]
        tokens = Tokens()
        service = CloudDispatchService(
            jobs=DynamoJobRepository(
                TABLES["BERTH_JOBS_TABLE"], TABLES["BERTH_JOB_EVENTS_TABLE"], TABLES["BERTH_TENANTS_TABLE"]
            ),
            tokens=tokens,
            batch=BotoBatchGateway("", RateLimiter(1000.0)),
            submits=SqsSubmitQueue(url),
            circuits=DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"]),
            clock=lambda: NOW,
            settings=CloudSettings(artifacts_bucket="art", data_bucket="data", account="123456789012"),
        )
        yield service, tokens, url


def _placed(service: CloudDispatchService, image: str = "busybox") -> Job:
    spec = JobSpec.model_validate(
        {"name": "t", "image": image, "command": ["true"], "resources": {"gpu_type": "A10G", "gpus": 1}}
    )
    job, event = new_job(new_job_id(NOW), "vision", "alice", spec, NOW)
    service.jobs.create(job, event, max_active=100)
    placement = CloudPlacement(region=REGION, queue=QUEUE, instance_type="g5.xlarge", gpu_type="A10G")
    placed, event = job.transition(
        JobStatus.STARTING,
        "placed",
        NOW,
        site=placement.site,
        placement=placement,
        attempts=1,
        run=job.run.with_attempt(fencing_token="f"),
    )
    service.jobs.save(placed, event)
    return placed


def _receive(url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", region_name=REGION)
    return sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]).get(
        "Messages", []
    )


def _wait_for(batch: Any, job_id: str, status: str) -> dict[str, Any]:
    for _ in range(50):
        (found,) = batch.describe_jobs(jobs=[job_id])["jobs"]
        if found["status"] == status:
            return dict(found)
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never reached {status}")


def test_dispatch_submit_event_answers_the_token(cloud: tuple[CloudDispatchService, Tokens, str]) -> None:
    service, tokens, url = cloud
    job = _placed(service)
    service.dispatch(job.id, 1, "tok")
    (message,) = _receive(url)
    assert message["Attributes"]["MessageGroupId"] == job.id
    request = SubmitRequest.model_validate_json(message["Body"])
    assert service.submit(request) == "submitted"
    # Redelivered (the delete was lost): found, not submitted again.
    assert service.submit(request) == "exists"
    batch = boto3.client("batch", region_name=REGION)
    listed = batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": [f"{job.id}-a1"]}])
    (summary,) = listed["jobSummaryList"]
    stored = service.jobs.get(job.id)
    assert stored is not None and stored.run.attempt.batch_job_id == summary["jobId"]
    described = _wait_for(batch, summary["jobId"], "SUCCEEDED")
    env = {e["name"]: e["value"] for e in described["container"]["environment"]}
    assert env["BERTH_JOB_ID"] == job.id and env["BERTH_ATTEMPT"] == "1" and "BERTH_LAUNCH" in env
    assert described["tags"]["BERTH_TENANT"] == "vision"
    assert described["timeout"] == {"attemptDurationSeconds": job.spec.timeout_minutes * 60}
    # The state-change event names the job; the service re-reads both sides.
    assert service.on_event(summary["jobId"], f"{job.id}-a1") == "succeeded"
    assert ("succeed", "tok", {"result": "succeeded", "exit_code": 0}) in tokens.calls


def test_one_job_definition_per_image(cloud: tuple[CloudDispatchService, Tokens, str]) -> None:
    service, _, _ = cloud
    for image in ("busybox", "busybox", "python:3.11"):
        job = _placed(service, image)
        service.dispatch(job.id, 1, f"tok-{job.id}")
        assert service.submit(SubmitRequest(job_id=job.id, attempt=1)) == "submitted"
    batch = boto3.client("batch", region_name=REGION)
    for image, count in (("busybox", 1), ("python:3.11", 1)):
        name = job_definition_name(image, "vision")
        found = batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
        assert len(found) == count
        assert found[0]["containerProperties"]["image"] == image
        assert found[0]["containerProperties"]["jobRoleArn"].endswith(":role/Berth-job-vision")


def test_a_missing_queue_fails_the_attempt_and_feeds_the_region_circuit(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    service, tokens, _ = cloud
    job = _placed(service)
    stored = service.jobs.get(job.id)
    assert stored is not None
    placement = CloudPlacement(
        region=REGION, queue="berth-nowhere", instance_type="g5.xlarge", gpu_type="A10G"
    )
    service.jobs.update(stored.updated(stored.updated_at, placement=placement))
    service.dispatch(job.id, 1, "tok")
    assert service.submit(SubmitRequest(job_id=job.id, attempt=1)) == "failed"
    assert ("fail", "tok", "Berth.CloudApiError") in tokens.calls
    (entry,) = service.circuits.list()
    assert (entry.region, entry.instance_type, len(entry.failures)) == (REGION, "*", 1)


class Ctx:
    """The Lambda context the handlers are invoked with."""

    function_name, memory_limit_in_mb, aws_request_id = "f", 128, "req"
    invoked_function_arn = f"arn:aws:lambda:{REGION}:123456789012:function:f"


def test_the_submit_handler_processes_sqs_records(
    cloud: tuple[CloudDispatchService, Tokens, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.handlers import batch_submit

    service, _, url = cloud
    job = _placed(service)
    service.dispatch(job.id, 1, "tok")
    (message,) = _receive(url)
    monkeypatch.setattr(batch_submit, "cloud_dispatch_service", lambda: service)
    (record,) = json.loads((EVENTS / "sqs_batch_submit_request.json").read_text())["Records"]
    record.update(body=message["Body"], attributes={**record["attributes"], **message["Attributes"]})
    bad = {**record, "messageId": "bad", "body": "{not json"}

    out = batch_submit.lambda_handler({"Records": [record, bad]}, Ctx())  # type: ignore[arg-type]
    assert out == {"batchItemFailures": []}  # a malformed request can never succeed: logged, dropped
    stored = service.jobs.get(job.id)
    assert stored is not None and stored.run.attempt.batch_job_id


def test_the_dispatchs_first_delivery_makes_no_listjobs(
    cloud: tuple[CloudDispatchService, Tokens, str], monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    """The dispatch marks its request ``berth-first``; received once (as Lambda's SQS event carries it,
    through the local cloud's event source), the handler submits with no ListJobs. Received again (the
    delete was lost), nothing is submitted again: one Batch job."""
    from berth.handlers import batch_submit
    from berth_tools.localcloud.event_sources import lambda_message_attributes

    service, _, url = cloud
    job = _placed(service)
    service.dispatch(job.id, 1, "tok")
    sqs = boto3.client("sqs", region_name=REGION)
    (message,) = sqs.receive_message(
        QueueUrl=url, AttributeNames=["All"], MessageAttributeNames=["All"], VisibilityTimeout=0
    )["Messages"]
    monkeypatch.setattr(batch_submit, "cloud_dispatch_service", lambda: service)
    calls.clear()

    def deliver(m: dict[str, Any]) -> dict[str, Any]:
        (record,) = json.loads((EVENTS / "sqs_batch_submit_request.json").read_text())["Records"]
        record.update(
            body=m["Body"],
            attributes={**record["attributes"], **m["Attributes"]},
            messageAttributes=lambda_message_attributes(m.get("MessageAttributes") or {}),
        )
        return batch_submit.lambda_handler({"Records": [record]}, Ctx())  # type: ignore[arg-type]

    assert deliver(message) == {"batchItemFailures": []}
    assert "ListJobs" not in calls.operations() and calls.ops()["SubmitJob"] == 1
    # the same message again (ApproximateReceiveCount 2): looked up, found, not submitted again
    (again,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"], MessageAttributeNames=["All"])[
        "Messages"
    ]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    calls.clear()
    assert deliver(again) == {"batchItemFailures": []}
    # the job's record says it exists (a crash before it: unit tests)
    assert "SubmitJob" not in calls.operations()
    batch = boto3.client("batch", region_name=REGION)
    listed = batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": [f"{job.id}-a1"]}])
    assert len(listed["jobSummaryList"]) == 1


def _succeeded_event(
    service: CloudDispatchService, job: Job, monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, dict[str, Any], dict[str, Any]]:
    """Dispatch and submit ``job``'s attempt 1 until Batch says SUCCEEDED, point the events handler
    at ``service``: (the job as stored with its Batch job id, the forwarded event, its SQS record)."""
    from berth.handlers import batch_events

    service.dispatch(job.id, 1, "tok")
    service.submit(SubmitRequest(job_id=job.id, attempt=1))
    stored = service.jobs.get(job.id)
    assert stored is not None and stored.run.attempt.batch_job_id
    _wait_for(boto3.client("batch", region_name=REGION), stored.run.attempt.batch_job_id, "SUCCEEDED")
    monkeypatch.setattr(batch_events, "cloud_dispatch_service", lambda: service)
    sample = json.loads((EVENTS / "eventbridge_batch_job_state_change.json").read_text())
    sample["detail"].update(jobId=stored.run.attempt.batch_job_id, jobName=f"{job.id}-a1", status="SUCCEEDED")
    record = {
        "messageId": "m1",
        "receiptHandle": "r",
        "body": json.dumps(sample),
        "attributes": {},
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:{REGION}:123456789012:berth-batch-events",
        "awsRegion": REGION,
    }
    return stored, sample, record


def test_the_events_handler_reads_the_forwarded_event(
    cloud: tuple[CloudDispatchService, Tokens, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.handlers import batch_events

    service, tokens, _ = cloud
    job = _placed(service)
    stored, sample, record = _succeeded_event(service, job, monkeypatch)

    # The same Batch job's earlier event in the same SQS batch, and a record that is no event at all.
    early = json.loads(json.dumps(sample))
    early["detail"]["status"] = "RUNNING"
    records = [
        {**record, "messageId": "m0", "body": json.dumps(early)},
        record,
        {**record, "messageId": "junk", "body": "{not json"},
    ]
    assert batch_events.lambda_handler({"Records": records}, Ctx()) == {"batchItemFailures": []}  # type: ignore[arg-type]
    assert tokens.calls == [("succeed", "tok", {"result": "succeeded", "exit_code": 0})]  # answered once
    # the attempt's log stream is recorded from DescribeJobs' container.logStreamName (the real adapter
    # parses it), never from the event's own copy
    batch = boto3.client("batch", region_name=REGION)
    described = batch.describe_jobs(jobs=[stored.run.attempt.batch_job_id])["jobs"][0]["container"][
        "logStreamName"
    ]
    after = service.jobs.get(job.id)
    assert after is not None and after.run.log_stream_of(1) == described
    assert described != sample["detail"]["container"]["logStreamName"]


def test_the_end_of_an_attempt_records_its_checkpoint_from_the_data_bucket(
    cloud: tuple[CloudDispatchService, Tokens, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the events handler: the SUCCEEDED event lists the job's checkpoint prefix on S3 once
    and keeps the newest object's time and the objects' total size on the job."""
    from berth.dal.checkpoints import S3CheckpointStore
    from berth.handlers import batch_events

    service, tokens, _ = cloud
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="berth-data")
    # a clock a day ahead: the objects' LastModified (now) is not clamped to it
    later = datetime.now(UTC) + timedelta(days=1)
    service = dataclasses.replace(service, checkpoints=S3CheckpointStore("berth-data"), clock=lambda: later)
    job = _placed(service)
    prefix = job_checkpoint_prefix(job.tenant, job.id)
    for key, size in (("step-1/model.pt", 300), ("step-1/optim.pt", 500), ("latest", 6)):
        s3.put_object(Bucket="berth-data", Key=prefix + key, Body=b"x" * size)
    s3.put_object(Bucket="berth-data", Key=f"vision/jobs/{job.id}/outputs/model.pt", Body=b"x" * 99)
    newest = max(
        o["LastModified"] for o in s3.list_objects_v2(Bucket="berth-data", Prefix=prefix)["Contents"]
    )
    _, _, record = _succeeded_event(service, job, monkeypatch)
    assert batch_events.lambda_handler({"Records": [record]}, Ctx()) == {"batchItemFailures": []}  # type: ignore[arg-type]
    assert tokens.calls == [("succeed", "tok", {"result": "succeeded", "exit_code": 0})]
    after = service.jobs.get(job.id)
    assert after is not None
    assert after.checkpoint() == {"at": iso(newest), "size_bytes": 806, "attempt": 1}


def test_the_events_functions_dispatcher_reads_checkpoints_from_the_data_bucket(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.dal.checkpoints import S3CheckpointStore
    from berth.handlers import runtime

    monkeypatch.setenv(
        "BERTH_BATCH_SUBMIT_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/berth-submit.fifo"
    )
    cold_start()
    service = runtime.cloud_dispatch_service()
    assert service is not None and isinstance(service.checkpoints, S3CheckpointStore)
    assert service.checkpoints.bucket == BUCKETS["BERTH_DATA_BUCKET"]


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "SubmitJob"
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("TooManyRequestsException", 429, CloudThrottled),
        ("ThrottlingException", 400, CloudThrottled),
        ("ServerException", 500, CloudUnavailable),
        ("ServiceUnavailable", 503, CloudUnavailable),
        ("ClientException", 400, CloudRejected),
    ],
)
def test_aws_errors_are_translated(code: str, status: int, expected: type[Exception]) -> None:
    from berth.dal.batch import _translated

    with pytest.raises(expected) as raised, _translated("SubmitJob", REGION):
        raise _client_error(code, status)
    assert raised.value.region == REGION  # type: ignore[attr-defined]


def test_the_rate_limiter_keeps_to_its_rate() -> None:
    from berth.dal.batch import RateLimiter

    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    limiter = RateLimiter(40.0, burst=1, clock=lambda: now[0], sleep=sleep)
    for _ in range(200):
        limiter.acquire()
    # 200 calls at 40/s with a burst of 1: the first is free, the rest spaced 25 ms apart.
    assert now[0] == pytest.approx(199 / 40.0)
    assert BatchStatus.RUNNABLE.is_queued and not BatchStatus.RUNNING.is_queued


def test_submits_and_terminations_act_in_a_tenant_tagged_session(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    from berth.dal.batch import BotoBatchGateway, RateLimiter

    service, _, _ = cloud
    role = boto3.client("iam").create_role(RoleName="Berth-BatchSubmitRole", AssumeRolePolicyDocument="{}")
    gateway = BotoBatchGateway(role["Role"]["Arn"], RateLimiter(1000.0))
    tenant_service = dataclasses.replace(service, batch=gateway)
    job = _placed(service)
    tenant_service.dispatch(job.id, 1, "tok")
    assert tenant_service.submit(SubmitRequest(job_id=job.id, attempt=1)) == "submitted"
    session, _expires = gateway._sessions["vision"]
    identity = session.client("sts", region_name=REGION).get_caller_identity()
    assert ":assumed-role/Berth-BatchSubmitRole/berth-submit-vision" in identity["Arn"]
    stored = service.jobs.get(job.id)
    assert stored is not None and stored.run.attempt.batch_job_id
    gateway.terminate(REGION, stored.run.attempt.batch_job_id, "Berth: canceled", "vision")


def test_submits_keep_under_the_configured_rate(cloud: tuple[CloudDispatchService, Tokens, str]) -> None:
    """60 attempts through the real adapters at a 40/s limit: never faster, each submitted once."""
    from berth.dal.batch import BotoBatchGateway, RateLimiter

    service, _, _ = cloud
    limited = dataclasses.replace(service, batch=BotoBatchGateway("", RateLimiter(40.0, burst=1)))
    jobs = [_placed(service) for _ in range(60)]
    for j in jobs:
        limited.dispatch(j.id, 1, f"tok-{j.id}")
    t0 = time.perf_counter()
    outcomes = [limited.submit(SubmitRequest(job_id=j.id, attempt=1)) for j in jobs]
    elapsed = time.perf_counter() - t0
    assert outcomes == ["submitted"] * 60
    # the first goes at once (burst 1), then one per 1/40 s: 59 intervals
    assert 59 / elapsed <= 40.0
    assert [limited.submit(SubmitRequest(job_id=j.id, attempt=1)) for j in jobs[:5]] == ["exists"] * 5


def test_secrets_live_in_a_definition_per_secret_set_with_the_tenants_execution_role(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    service, _, _ = cloud
    service = dataclasses.replace(service, settings=dataclasses.replace(service.settings, home_region=REGION))
    sets = ({"TOKEN": "berth/vision/a"}, {"TOKEN": "berth/vision/a"}, {"TOKEN": "berth/vision/b"})
    for secrets in sets:
        job = _placed(service)
        stored = service.jobs.get(job.id)
        assert stored is not None
        spec = stored.spec.model_copy(update={"secrets": secrets})
        service.jobs.update(stored.updated(stored.updated_at, spec=spec))
        service.dispatch(job.id, 1, f"tok-{job.id}")
        assert service.submit(SubmitRequest(job_id=job.id, attempt=1)) == "submitted"
        (batch_job,) = boto3.client("batch", region_name=REGION).describe_jobs(
            jobs=[str(service.jobs.get(job.id).run.attempt.batch_job_id)]  # type: ignore[union-attr]
        )["jobs"]
        # SubmitJob carries no secret: the variable is not among the overrides
        assert "TOKEN" not in {e["name"] for e in batch_job["container"].get("environment", [])}
    batch = boto3.client("batch", region_name=REGION)
    found = [
        d
        for d in batch.describe_job_definitions(status="ACTIVE")["jobDefinitions"]
        if d["containerProperties"].get("secrets")
    ]
    assert len(found) == 2  # one per secret set, reused by the second job of set a
    for d in found:
        props = d["containerProperties"]
        assert props["executionRoleArn"] == "arn:aws:iam::123456789012:role/Berth-exec-vision"
        assert props["jobRoleArn"].endswith(":role/Berth-job-vision")
        (secret,) = props["secrets"]
        assert secret["name"] == "TOKEN"
        assert secret["valueFrom"] in {
            f"arn:aws:secretsmanager:{REGION}:123456789012:secret:berth/vision/{n}" for n in ("a", "b")
        }
        assert d["tags"] == {"berth:tenant": "vision"}


def test_a_group_of_array_tasks_is_one_array_job_on_batch(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    from berth.domain.arrays import task_id, task_spec
    from berth.domain.cloud import expected_batch_name
    from berth.domain.placement import BatchGroup

    service, tokens, url = cloud
    array_id = new_job_id(NOW)
    base = JobSpec.model_validate(
        {
            "name": "sweep",
            "code": "sha256:" + "b" * 64,
            "command": ["python", "train.py", "{lr}"],
            "resources": {"gpu_type": "A10G", "gpus": 1},
            "array": {"size": 3},
        }
    )
    group = BatchGroup(first=0, size=3)
    placement = CloudPlacement(
        region=REGION, queue=QUEUE, instance_type="g5.xlarge", gpu_type="A10G", group=group
    )
    tasks = []
    for i in range(3):
        job, event = new_job(
            task_id(array_id, i), "vision", "alice", task_spec(base, array_id, i, 3, {"lr": i}), NOW
        )
        service.jobs.create(job, event, max_active=100)
        placed, event = job.transition(
            JobStatus.STARTING,
            "placed",
            NOW,
            site=placement.site,
            placement=placement,
            attempts=1,
            run=job.run.with_attempt(fencing_token="f"),
        )
        service.jobs.save(placed, event)
        service.dispatch(placed.id, 1, f"tok-{i}")
        tasks.append(placed)
    name = expected_batch_name(tasks[0])
    messages = _receive(url)
    assert {m["Attributes"]["MessageGroupId"] for m in messages} == {name}
    outcomes = [service.submit(SubmitRequest.model_validate_json(m["Body"])) for m in messages]
    assert outcomes == ["submitted"] * len(messages)
    batch = boto3.client("batch", region_name=REGION)
    listed = batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": [name]}])[
        "jobSummaryList"
    ]
    parents = [j for j in listed if ":" not in j["jobId"]]
    assert len(parents) == 1  # one SubmitJob for the group
    (found,) = service.batch.find(REGION, QUEUE, name)  # the parent only, never its children
    assert found.batch_job_id == parents[0]["jobId"]
    stored = [service.jobs.get(t.id) for t in tasks[: len(messages)]]
    assert [s.run.attempt.batch_job_id for s in stored if s] == [
        f"{found.batch_job_id}:{k}" for k in range(len(messages))
    ]
    child = f"{found.batch_job_id}:0"
    _wait_for(batch, child, "SUCCEEDED")
    assert service.on_event(child, name, BatchStatus.SUCCEEDED) == "succeeded"
    assert ("succeed", "tok-0", {"result": "succeeded", "exit_code": 0}) in tokens.calls


# -- SubmitJob is sent again only when it surely did nothing ------------------------------------------


def _gateway_and_request(service: CloudDispatchService) -> tuple[Any, Any, Any]:
    from berth.dal.batch import BotoBatchGateway, RateLimiter
    from berth.domain.cloud import submission

    gateway = BotoBatchGateway("", RateLimiter(1000.0), sleep=lambda _s: None)
    job = _placed(service)
    assert isinstance(job.placement, CloudPlacement)
    request = submission(job, job.placement, service.settings)
    client = gateway._for_tenant(REGION, "vision", submitting=True)
    return gateway, request, client


def _named(name: str) -> list[dict[str, Any]]:
    listed = boto3.client("batch", region_name=REGION).list_jobs(
        jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": [name]}]
    )["jobSummaryList"]
    return [j for j in listed if ":" not in j["jobId"]]


def test_a_submit_whose_answer_was_lost_is_found_by_name_not_sent_again(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    from botocore.exceptions import ReadTimeoutError

    service, _, _ = cloud
    gateway, request, client = _gateway_and_request(service)
    sent = {"n": 0}

    def lose_the_answer(**_: Any) -> None:
        sent["n"] += 1
        if sent["n"] == 1:
            raise ReadTimeoutError(endpoint_url="https://batch")  # Batch created the job; we never heard

    client.meta.events.register("after-call.batch.SubmitJob", lose_the_answer)
    batch_id = gateway.submit(request)
    assert sent["n"] == 1 and [j["jobId"] for j in _named(request.name)] == [batch_id]


def test_an_unknown_outcome_with_no_job_goes_back_to_the_queue(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    from botocore.exceptions import ReadTimeoutError

    from berth.domain.cloud import CloudOutcomeUnknown

    service, _, _ = cloud
    gateway, request, client = _gateway_and_request(service)

    def no_answer(**_: Any) -> None:
        raise ReadTimeoutError(endpoint_url="https://batch")

    client.meta.events.register("before-send.batch.SubmitJob", no_answer)
    with pytest.raises(CloudOutcomeUnknown):
        gateway.submit(request)
    assert _named(request.name) == []  # and nothing was sent twice


@pytest.mark.parametrize("refusal", ["throttled", "unreachable"])
def test_a_surely_refused_submit_is_sent_again(
    cloud: tuple[CloudDispatchService, Tokens, str], refusal: str
) -> None:
    from botocore.exceptions import EndpointConnectionError

    service, _, _ = cloud
    gateway, request, client = _gateway_and_request(service)
    tries = {"n": 0}

    def refuse_once(**_: Any) -> None:
        tries["n"] += 1
        if tries["n"] > 1:
            return
        if refusal == "unreachable":
            raise EndpointConnectionError(endpoint_url="https://batch")
        raise _client_error("TooManyRequestsException", 429)

    client.meta.events.register("before-send.batch.SubmitJob", refuse_once)
    batch_id = gateway.submit(request)
    assert tries["n"] == 2 and [j["jobId"] for j in _named(request.name)] == [batch_id]


def test_the_dispatcher_leaves_an_unknown_outcome_on_the_queue(
    cloud: tuple[CloudDispatchService, Tokens, str],
) -> None:
    from berth.domain.cloud import CloudOutcomeUnknown

    service, tokens, _ = cloud
    job = _placed(service)
    service.dispatch(job.id, 1, "tok")

    class _Unknown:
        def find(self, *a: Any) -> list[Any]:
            return []

        def submit(self, request: Any) -> str:
            raise CloudOutcomeUnknown("SubmitJob: no answer", REGION)

    unsure = dataclasses.replace(service, batch=_Unknown())  # type: ignore[arg-type]
    with pytest.raises(CloudOutcomeUnknown):
        unsure.submit(SubmitRequest(job_id=job.id, attempt=1))
    assert not [c for c in tokens.calls if c[0] == "fail"]  # the attempt is not failed
    assert service.jobs.get(job.id).run.attempt.batch_job_id is None  # type: ignore[union-attr]
    assert service.submit(SubmitRequest(job_id=job.id, attempt=1)) == "submitted"  # the redelivery
