"""Local AWS Batch on a running local cloud: jobs of berth-* queues really run, and faults bite.

The compute environment, queue and job definition are created here with boto3 (as the regional
stacks will deploy them); every call goes through the moto server, as a client's would.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from berth_tools.cli.main import app
from berth_tools.localcloud import faults, local_batch, metering
from berth_tools.localcloud.cloud import LocalCloud

REGION = "us-east-1"
QUEUE = "berth-us-east-1-g5_xlarge-ondemand"
DEFINITION = "berth-img-test"
#: A definition without a logConfiguration: Batch's defaults (`/aws/batch/job`, `<definition>/default/...`).
PLAIN_DEFINITION = "plain-test"
GROUP = "/berth/jobs/vision"
#: `container.logStreamName` as the awslogs driver names it: `<prefix>/default/<32-hex ECS task id>`.
TASK_STREAM = r"batch/default/[0-9a-f]{32}"
INSTANCE_TYPE = "g5.xlarge"


@dataclass
class Batch:
    cloud: LocalCloud
    batch: Any
    logs: Any
    sqs: Any
    s3: Any
    events_queue_url: str
    role_arn: str

    def submit(
        self,
        name: str,
        command: list[str],
        *,
        tenant: str = "vision",
        vcpus: int = 1,
        env: dict[str, str] | None = None,
        timeout_s: int | None = None,
        definition: str = DEFINITION,
    ) -> str:
        job_id, _, attempt = name.rpartition("-a")
        variables = {"BERTH_JOB_ID": job_id, "BERTH_ATTEMPT": attempt, "BERTH_TENANT": tenant, **(env or {})}
        kwargs: dict[str, Any] = {}
        if timeout_s is not None:
            kwargs["timeout"] = {"attemptDurationSeconds": timeout_s}
        answer = self.batch.submit_job(
            jobName=name,
            jobQueue=QUEUE,
            jobDefinition=definition,
            containerOverrides={
                "command": command,
                "environment": [{"name": k, "value": v} for k, v in variables.items()],
                "resourceRequirements": [{"type": "VCPU", "value": str(vcpus)}],
            },
            tags={"BERTH_JOB_ID": job_id},
            **kwargs,
        )
        return str(answer["jobId"])

    def describe(self, batch_job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self.batch.describe_jobs(jobs=[batch_job_id])["jobs"][0]
        return job

    def wait(
        self, batch_job_id: str, until: Callable[[dict[str, Any]], bool], timeout_s: float = 30
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.describe(batch_job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {batch_job_id} still {job['status']}: {job.get('statusReason')}")
            time.sleep(0.1)

    def done(self, batch_job_id: str, timeout_s: float = 30) -> dict[str, Any]:
        return self.wait(batch_job_id, lambda j: j["status"] in ("SUCCEEDED", "FAILED"), timeout_s)

    def output(self, batch_job_id: str, group: str = GROUP) -> list[str]:
        """The job's output, read where DescribeJobs says the awslogs driver wrote it."""
        stream = self.describe(batch_job_id)["container"]["logStreamName"]
        return self.log_lines(group, stream)

    def log_lines(self, group: str, stream: str) -> list[str]:
        events = self.logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True)[
            "events"
        ]
        return [e["message"] for e in events]

    def events_of(self, batch_job_id: str, timeout_s: float = 10) -> list[dict[str, Any]]:
        """Drain the rule's queue until the job's final event arrived; the job's events in order."""
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = self.sqs.receive_message(QueueUrl=self.events_queue_url, MaxNumberOfMessages=10)
            for message in answer.get("Messages", []):
                event = json.loads(message["Body"])
                self.sqs.delete_message(
                    QueueUrl=self.events_queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
                if event["detail"]["jobId"] == batch_job_id:
                    found.append(event)
            if found and found[-1]["detail"]["status"] in ("SUCCEEDED", "FAILED"):
                return found
        return found


def _client(cloud: LocalCloud, service: str, region: str = REGION) -> Any:
    session = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name=region
    )
    return session.client(
        service,
        endpoint_url=cloud.endpoint_url,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


def create_batch_environment(cloud: LocalCloud, region: str = REGION, max_vcpus: int = 2) -> str:
    """A VPC, a compute environment, a `berth-*` queue and a job definition, as the regional stack has."""
    ec2, iam, batch = (_client(cloud, s, region) for s in ("ec2", "iam", "batch"))
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"batch-{region}", Description="batch", VpcId=vpc)["GroupId"]
    trust = json.dumps({"Version": "2012-10-17", "Statement": []})
    suffix = region.replace("-", "")
    service_role = iam.create_role(RoleName=f"batch-service-{suffix}", AssumeRolePolicyDocument=trust)["Role"]
    profile = iam.create_instance_profile(InstanceProfileName=f"batch-instance-{suffix}")["InstanceProfile"]
    job_role = iam.create_role(RoleName=f"Berth-job-vision-{suffix}", AssumeRolePolicyDocument=trust)["Role"]
    ce = batch.create_compute_environment(
        computeEnvironmentName=QUEUE,
        type="MANAGED",
        state="ENABLED",
        computeResources={
            "type": "EC2",
            "minvCpus": 0,
            "maxvCpus": max_vcpus,
            "instanceTypes": [INSTANCE_TYPE],
            "subnets": [subnet],
            "securityGroupIds": [group],
            "instanceRole": profile["Arn"],
        },
        serviceRole=service_role["Arn"],
    )
    batch.create_job_queue(
        jobQueueName=QUEUE,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}],
    )
    batch.register_job_definition(
        jobDefinitionName=DEFINITION,
        type="container",
        containerProperties={
            "image": "public.ecr.aws/docker/library/python:3.11-slim",
            "command": ["true"],
            "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
            "jobRoleArn": job_role["Arn"],
            "environment": [{"name": "FROM_DEFINITION", "value": "yes"}],
            # as the dispatcher registers it (berth.dal.batch): the tenant's group, prefix "batch"
            "logConfiguration": {
                "logDriver": "awslogs",
                "options": {"awslogs-group": GROUP, "awslogs-stream-prefix": "batch"},
            },
        },
    )
    batch.register_job_definition(
        jobDefinitionName=PLAIN_DEFINITION,
        type="container",
        containerProperties={
            "image": "public.ecr.aws/docker/library/python:3.11-slim",
            "command": ["true"],
            "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
        },
    )
    return str(job_role["Arn"])


@pytest.fixture(scope="module")
def lb(cloud: LocalCloud) -> Iterator[Batch]:
    role_arn = create_batch_environment(cloud)
    sqs, events = _client(cloud, "sqs"), _client(cloud, "events")
    queue_url = sqs.create_queue(QueueName="batch-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(
        Name="batch-state",
        EventPattern=json.dumps({"source": ["aws.batch"], "detail-type": ["Batch Job State Change"]}),
    )
    events.put_targets(Rule="batch-state", Targets=[{"Id": "q", "Arn": queue_arn}])
    yield Batch(
        cloud,
        _client(cloud, "batch"),
        _client(cloud, "logs"),
        sqs,
        _client(cloud, "s3"),
        queue_url,
        role_arn,
    )
    faults.FAULTS.clear()


def _fault(cloud: LocalCloud, *args: str) -> Any:
    assert cloud.state_dir is not None
    return CliRunner().invoke(app, ["local", "fault", "--state-dir", str(cloud.state_dir), *args])


def test_a_job_runs_as_a_process_with_logs_and_events_as_on_aws(lb: Batch) -> None:
    job = lb.submit(
        "j-ok-a1",
        ["python3", "-c", "import os; print('hello'); print('from', os.environ['FROM_DEFINITION'])"],
    )
    done = lb.done(job)
    assert done["status"] == "SUCCEEDED", done.get("statusReason")
    assert done["container"]["exitCode"] == 0
    assert done["attempts"][0]["container"]["exitCode"] == 0
    assert done["startedAt"] <= done["stoppedAt"]
    stream = done["container"]["logStreamName"]
    assert re.fullmatch(TASK_STREAM, stream), stream
    assert done["attempts"][0]["container"]["logStreamName"] == stream
    task_arn = done["attempts"][0]["container"]["taskArn"]
    assert task_arn.startswith(f"arn:aws:ecs:{REGION}:123456789012:task/") and task_arn.endswith(stream[-32:])
    assert lb.log_lines(GROUP, stream) == ["hello", "from yes"]
    names = [s["logStreamName"] for s in lb.logs.describe_log_streams(logGroupName=GROUP)["logStreams"]]
    assert not [n for n in names if n.startswith("j-ok/")]  # nothing under Berth's on-prem names
    events = lb.events_of(job)
    assert [e["detail"]["status"] for e in events] == [
        "SUBMITTED",
        "PENDING",
        "RUNNABLE",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ]
    final = events[-1]
    assert final["source"] == "aws.batch" and final["detail-type"] == "Batch Job State Change"
    detail = final["detail"]
    assert detail["jobName"] == "j-ok-a1"
    assert detail["jobQueue"] == f"arn:aws:batch:{REGION}:123456789012:job-queue/{QUEUE}"
    assert detail["container"]["exitCode"] == 0 and detail["attempts"][0]["container"]["exitCode"] == 0
    # the stream is in the events from RUNNING on (what the control plane records), never before
    named = [e["detail"]["container"].get("logStreamName") for e in events]
    assert named == [None, None, None, None, stream, stream], named


def test_a_definition_without_log_configuration_uses_batchs_default_names(lb: Batch) -> None:
    job = lb.submit("j-plain-a1", ["python3", "-c", "print('plain')"], definition=PLAIN_DEFINITION)
    done = lb.done(job)
    assert done["status"] == "SUCCEEDED", done.get("statusReason")
    stream = done["container"]["logStreamName"]
    assert re.fullmatch(rf"{PLAIN_DEFINITION}/default/[0-9a-f]{{32}}", stream), stream
    assert lb.log_lines(local_batch.DEFAULT_LOG_GROUP, stream) == ["plain"]


def test_each_run_gets_its_own_stream(lb: Batch) -> None:
    first, second = (lb.submit(f"j-twice-a{n}", ["python3", "-c", f"print({n})"]) for n in (1, 2))
    streams = {lb.done(job)["container"]["logStreamName"] for job in (first, second)}
    assert len(streams) == 2
    assert (lb.output(first), lb.output(second)) == (["1"], ["2"])


def test_a_nonzero_exit_fails_the_job_with_its_exit_code(lb: Batch) -> None:
    job = lb.submit("j-three-a2", ["python3", "-c", "import sys; print('bye', file=sys.stderr); sys.exit(3)"])
    done = lb.done(job)
    assert (done["status"], done["container"]["exitCode"]) == ("FAILED", 3)
    assert done["statusReason"] == local_batch.EXIT_REASON
    assert lb.output(job) == ["bye"]


def test_the_job_gets_a_clean_environment_with_its_role_credentials(lb: Batch) -> None:
    script = "import os, json; print(json.dumps(sorted(os.environ)))"
    job = lb.submit("j-env-a1", ["python3", "-c", script])
    assert lb.done(job)["status"] == "SUCCEEDED"
    names = set(json.loads(lb.output(job)[0]))
    assert {
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_BATCH_JOB_ID",
        "BERTH_TENANT",
    } <= names
    assert not names & {"MOTO_PORT", "PYTHONPATH", "VIRTUAL_ENV"}  # nothing of the local cloud's process


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason=f"the local cloud runs as uid {os.geteuid()}, not root: Batch jobs then run as that same user "
    "(no uid to switch to); docs/local-cloud.md, 'What a job can reach'",
)
def test_a_job_runs_as_a_uid_of_its_own_and_cannot_read_the_state_dir(lb: Batch) -> None:
    assert lb.cloud.state_dir is not None
    credentials = lb.cloud.state_dir.resolve() / "aws" / "credentials"
    script = (
        "import json, os\n"
        "def attempt(fn):\n"
        "    try:\n        fn(); return 'allowed'\n"
        "    except PermissionError:\n        return 'denied'\n"
        f"print(json.dumps({{'uid': os.getuid(), 'groups': os.getgroups(), "
        f"'credentials': attempt(lambda: open({str(credentials)!r}).read()), "
        f"'root': attempt(lambda: os.listdir({str(local_batch.current().work_root)!r})), "  # type: ignore[union-attr]
        "'own': attempt(lambda: open('x', 'w').write('x'))}))"
    )
    job = lb.submit("j-uid-a1", ["python3", "-c", script])
    assert lb.done(job)["status"] == "SUCCEEDED", lb.output(job)
    seen = json.loads(lb.output(job)[0])
    assert seen["uid"] != 0 and seen["groups"] == [], seen
    assert (seen["credentials"], seen["root"], seen["own"]) == ("denied", "denied", "allowed"), seen


def test_terminate_job_kills_the_process_group(lb: Batch) -> None:
    job = lb.submit("j-term-a1", ["python3", "-c", "import time; print('up', flush=True); time.sleep(120)"])
    lb.wait(job, lambda j: j["status"] == "RUNNING")
    started = time.monotonic()
    lb.batch.terminate_job(jobId=job, reason="stopped by the test")
    done = lb.done(job, timeout_s=15)
    assert time.monotonic() - started < 10
    assert (done["status"], done["statusReason"]) == ("FAILED", "stopped by the test")
    assert done["container"]["exitCode"] in (143, 137)


def test_attempt_duration_is_enforced(lb: Batch) -> None:
    job = lb.submit("j-slow-a1", ["python3", "-c", "import time; time.sleep(120)"], timeout_s=1)
    done = lb.done(job, timeout_s=20)
    assert (done["status"], done["statusReason"]) == ("FAILED", local_batch.TIMEOUT_REASON)


def test_jobs_wait_runnable_while_the_compute_environment_is_full(lb: Batch) -> None:
    first = lb.submit("j-big1-a1", ["python3", "-c", "import time; time.sleep(120)"], vcpus=2)
    lb.wait(first, lambda j: j["status"] == "RUNNING")
    second = lb.submit("j-big2-a1", ["python3", "-c", "print('second')"], vcpus=2)
    lb.wait(second, lambda j: j["status"] == "RUNNABLE")
    time.sleep(1.0)
    assert lb.describe(second)["status"] == "RUNNABLE"  # maxvCpus 2: no room until the first ends
    lb.batch.terminate_job(jobId=first, reason="make room")
    assert lb.done(second)["status"] == "SUCCEEDED"


def test_region_outage_answers_503_for_batch_and_ec2_until_cleared(lb: Batch) -> None:
    result = _fault(lb.cloud, "region-outage", REGION)
    assert result.exit_code == 0, result.output
    assert "us-east-1" in result.output
    try:
        for call in (
            lambda: lb.batch.describe_job_queues(),
            lambda: _client(lb.cloud, "ec2").describe_vpcs(),
        ):
            with pytest.raises(ClientError) as caught:
                call()
            assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
            assert caught.value.response["Error"]["Code"] == "ServiceUnavailable"
        _client(lb.cloud, "batch", "eu-west-1").describe_job_queues()  # another region is up
        lb.sqs.get_queue_attributes(QueueUrl=lb.events_queue_url)  # other services are up
    finally:
        assert _fault(lb.cloud, "clear").exit_code == 0
    assert lb.batch.describe_job_queues()["jobQueues"]


def test_capacity_fault_keeps_jobs_runnable_with_a_reason_until_cleared(lb: Batch) -> None:
    runner = local_batch.current()
    assert runner is not None
    saved, runner.factor = runner.factor, 10.0  # the capacity reason after 0.5 s
    try:
        assert _fault(lb.cloud, "capacity", REGION, INSTANCE_TYPE).exit_code == 0
        job = lb.submit("j-cap-a1", ["python3", "-c", "print('finally')"])
        stuck = lb.wait(job, lambda j: j.get("statusReason", "").startswith("CAPACITY:"), timeout_s=10)
        assert stuck["status"] == "RUNNABLE"
        assert INSTANCE_TYPE in stuck["statusReason"]
        assert _fault(lb.cloud, "clear").exit_code == 0
        done = lb.done(job)
        assert done["status"] == "SUCCEEDED" and done["statusReason"] == local_batch.EXIT_REASON
    finally:
        runner.factor = saved
        faults.FAULTS.clear()


def test_spot_interrupt_fails_the_running_attempt_with_the_host_terminated_reason(lb: Batch) -> None:
    job = lb.submit("j-spot-a2", ["python3", "-c", "import time; time.sleep(120)"])
    lb.wait(job, lambda j: j["status"] == "RUNNING")
    result = _fault(lb.cloud, "spot-interrupt", "j-spot")
    assert result.exit_code == 0, result.output
    done = lb.done(job, timeout_s=10)
    assert (done["status"], done["statusReason"]) == ("FAILED", local_batch.SPOT_REASON)
    missing = _fault(lb.cloud, "spot-interrupt", "j-nothing")
    assert missing.exit_code == 1 and "no running Batch job" in missing.output


def test_bad_fault_requests_are_refused(lb: Batch) -> None:
    assert _fault(lb.cloud, "capacity", REGION).exit_code == 2  # missing the instance type
    assert _fault(lb.cloud, "region-outage", "not a region").exit_code == 2
    assert faults.FAULTS.snapshot() == faults.FaultState().snapshot()  # none in force


def test_a_code_bundle_job_runs_through_the_launcher(lb: Batch) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = (
            b"import os, pathlib\nprint('trained')\n"
            b"pathlib.Path(os.environ['BERTH_OUTPUT_DIR'], 'model.txt').write_text('w')\n"
        )
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bundle = buf.getvalue()
    digest = hashlib.sha256(bundle).hexdigest()
    lb.s3.create_bucket(Bucket="berth-artifacts-test")
    lb.s3.create_bucket(Bucket="berth-data-test")
    lb.s3.put_object(Bucket="berth-artifacts-test", Key=f"bundles/vision/sha256/{digest}.tar.gz", Body=bundle)
    spec = {
        "job_id": "j-code",
        "attempt": 1,
        "tenant": "vision",
        "command": ["python3", "train.py"],
        "env": {},
        "code": {
            "uri": f"s3://berth-artifacts-test/bundles/vision/sha256/{digest}.tar.gz",
            "digest": f"sha256:{digest}",
        },
        "data": [],
        "outputs": {"bucket": "berth-data-test", "prefix": "vision/jobs/j-code/outputs/"},
        "checkpoint_prefix": "vision/jobs/j-code/checkpoints/",
        "timeout_s": 60,
        "aws_region": REGION,
        "endpoint_url": lb.cloud.endpoint_url,
    }
    job = lb.submit(
        "j-code-a1", ["python", "-m", "berth_agent.launch"], env={"BERTH_LAUNCH": json.dumps(spec)}
    )
    done = lb.done(job, timeout_s=60)
    assert done["status"] == "SUCCEEDED", lb.output(job)
    assert "trained" in lb.output(job)
    body = lb.s3.get_object(Bucket="berth-data-test", Key="vision/jobs/j-code/outputs/model.txt")[
        "Body"
    ].read()
    assert body == b"w"


def test_other_queues_keep_motos_behaviour(lb: Batch) -> None:
    batch = lb.batch
    ce = batch.describe_compute_environments(computeEnvironments=[QUEUE])["computeEnvironments"][0]
    batch.create_job_queue(
        jobQueueName="other-queue",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}],
    )
    marker = f"{sys.executable} never runs"
    job = batch.submit_job(
        jobName="other",
        jobQueue="other-queue",
        jobDefinition=DEFINITION,
        containerOverrides={"command": [marker]},
    )["jobId"]
    assert lb.describe(job)["status"] == "SUCCEEDED"  # moto's docker-less backend: at once, nothing run


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_terminating_a_launcher_job_leaves_no_process_behind(lb: Batch) -> None:
    marker = f"berth-orphan-check-{time.time_ns()}"
    spec = {
        "job_id": "j-orphan",
        "attempt": 1,
        "tenant": "vision",
        "command": ["python3", "-c", f"import time; time.sleep(300)  # {marker}"],
        "timeout_s": 600,
        "aws_region": REGION,
        "endpoint_url": lb.cloud.endpoint_url,
    }
    job = lb.submit(
        "j-orphan-a1", ["python", "-m", "berth_agent.launch"], env={"BERTH_LAUNCH": json.dumps(spec)}
    )
    lb.wait(job, lambda j: j["status"] == "RUNNING")
    deadline = time.monotonic() + 20
    while not _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker), "the launcher never started the command"
    lb.batch.terminate_job(jobId=job, reason="orphan check")
    assert lb.done(job, timeout_s=15)["status"] == "FAILED"
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == []


def test_a_detached_process_ends_with_its_container(lb: Batch) -> None:
    """On AWS every process of a container ends with it (its PID namespace): a daemon the job leaves
    behind (setsid and a double fork) does not outlive the local stand-in either."""
    marker = f"berth-detached-check-{time.time_ns()}"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execvp('python3', ['python3', '-c', 'import time; time.sleep(300)  # {marker}'])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "time.sleep(1)\n"
    )
    job = lb.submit("j-detached-a1", ["python3", "-c", code])
    deadline = time.monotonic() + 20
    while not _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker), "the job never detached its daemon"
    assert lb.done(job)["status"] == "SUCCEEDED"
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == []


def test_batchs_own_events_and_job_logs_are_not_on_the_control_planes_bill(lb: Batch) -> None:
    metering.METER.reset()
    job = lb.submit("j-bill-a1", ["python3", "-c", "print('x')"])
    lb.done(job)
    requests = metering.METER.snapshot()["requests"]
    assert "PutEvents" not in requests.get("events", {})
    assert "PutLogEvents" not in requests.get("logs", {})
    assert any("submitjob" in op.lower() for op in requests["batch"])  # the client's own call counts


def test_a_job_larger_than_the_compute_environment_stays_runnable_with_aws_reason(lb: Batch) -> None:
    job = lb.submit("j-huge-a1", ["python3", "-c", "print('never')"], vcpus=64)
    stuck = lb.wait(job, lambda j: j.get("statusReason", "").startswith("MISCONFIGURATION:"), timeout_s=10)
    assert stuck["status"] == "RUNNABLE"
    lb.batch.cancel_job(jobId=job, reason="too big")
    done = lb.done(job, timeout_s=10)
    assert (done["status"], done["statusReason"]) == ("FAILED", "too big")


def test_an_array_jobs_children_run_each_with_its_index(lb: Batch) -> None:
    answer = lb.batch.submit_job(
        jobName="j-arr_0-2-g1",
        jobQueue=QUEUE,
        jobDefinition=DEFINITION,
        arrayProperties={"size": 3},
        containerOverrides={
            "command": [
                "python3",
                "-c",
                "import os; print('child', os.environ['AWS_BATCH_JOB_ARRAY_INDEX'])",
            ],
            "resourceRequirements": [{"type": "VCPU", "value": "1"}],
        },
    )
    parent = str(answer["jobId"])
    outputs = [lb.output(lb.done(f"{parent}:{k}")["jobId"]) for k in range(3)]
    assert outputs == [["child 0"], ["child 1"], ["child 2"]]
    # ListJobs by name, as the dispatcher asks, finds the parent (the emulator lists children too)
    listed = lb.batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["j-arr_0-2-g1"]}])
    assert parent in [j["jobId"] for j in listed["jobSummaryList"]]


def test_no_more_containers_run_at_once_than_the_machine_allows(lb: Batch) -> None:
    runner = local_batch.current()
    assert runner is not None
    saved, runner.max_running = runner.max_running, 1
    try:
        first = lb.submit("j-cap1-a1", ["python3", "-c", "import time; time.sleep(120)"])
        lb.wait(first, lambda j: j["status"] == "RUNNING")
        second = lb.submit("j-cap2-a1", ["python3", "-c", "print('second')"])  # the vCPUs would fit
        lb.wait(second, lambda j: j["status"] == "RUNNABLE")
        time.sleep(1.0)
        assert lb.describe(second)["status"] == "RUNNABLE"
        lb.batch.terminate_job(jobId=first, reason="make room")
        assert lb.done(second)["status"] == "SUCCEEDED"
    finally:
        runner.max_running = saved


def test_the_machines_container_limit_comes_from_the_environment() -> None:
    assert local_batch.local_max_running({"BERTH_LOCAL_BATCH_MAX_RUNNING": "3"}) == 3
    assert local_batch.local_max_running({"BERTH_LOCAL_BATCH_MAX_RUNNING": "none"}) >= 8
    assert local_batch.local_max_running({}) >= 8
