"""The agent's daemon, attempt runner and AWS I/O against moto's S3, SQS, CloudWatch Logs and Secrets
Manager (in-process), running a real code bundle as a real process. The agent API is a fake (the
control plane's side of the protocol is built elsewhere)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from moto import mock_aws

from berth.domain.storage import bundle_key
from berth_agent.attempt import AttemptRunner
from berth_agent.awsio import BotocoreIO
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.daemon import Daemon, SqsQueue
from berth_agent.executors import ProcessExecutor
from berth_agent.gpus import discover
from berth_agent.ledger import AttemptLedger
from berth_agent.staging import ObjectCache
from berth_tools.bundle import pack

REGION = "us-east-1"
CREDS = {"AccessKeyId": "ASIAJOBTESTING", "SecretAccessKey": "testing", "SessionToken": "testing"}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # moto's mock, never a server's
    with mock_aws():
        session = botocore.session.Session()
        yield {
            n: session.create_client(n, region_name=REGION) for n in ("s3", "sqs", "logs", "secretsmanager")
        }


class FakeAgentApi:
    def __init__(self, spec: dict[str, Any], queue_url: str, gpus: list[str]) -> None:
        self.spec, self.queue_url, self.gpus = spec, queue_url, gpus
        self.reports: list[dict[str, Any]] = []
        self.done = threading.Event()

    def register(self, inventory: dict[str, Any], agent_version: str = "x") -> Any:
        self.inventory = inventory
        return {
            "host_id": inventory["host_id"],
            "queue_url": self.queue_url,
            "heartbeat_s": 0.2,
            "lease_s": 60,
        }

    def heartbeat(self, *, healthy: bool, draining: bool, attempts: list[dict[str, Any]], **kw: Any) -> Any:
        return {"directives": []}

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return {
            "job_id": job_id,
            "attempt": attempt,
            "tenant": "vision",
            "spec": self.spec,
            "gpu_ids": self.gpus,
        }

    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return CREDS

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        self.reports.append({"event": event, **kw})
        if event in ("succeeded", "failed", "canceled"):
            self.done.set()
        return {"directive": None}


def test_a_bundle_job_from_the_queue_to_logs_and_outputs(aws: dict[str, Any], tmp_path: Path) -> None:
    s3, sqs, logs, secrets = aws["s3"], aws["sqs"], aws["logs"], aws["secretsmanager"]
    for bucket in ("berth-artifacts", "berth-data"):
        s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket="berth-data", VersioningConfiguration={"Status": "Enabled"})
    src = tmp_path / "code"
    src.mkdir()
    (src / "train.py").write_text(
        "import os\n"
        "rows = open('data/in/rows.csv').read().split()\n"
        "e = os.environ\n"
        "print('rows', len(rows), 'gpus', e['CUDA_VISIBLE_DEVICES'], 'key', e['WANDB_API_KEY'])\n"
        "open(os.path.join(os.environ['BERTH_OUTPUT_DIR'], 'result.txt'), 'w').write('ok')\n"
    )
    bundle = pack(src)
    s3.put_object(Bucket="berth-artifacts", Key=bundle_key("vision", bundle.digest), Body=bundle.data)
    s3.put_object(Bucket="berth-data", Key="vision/sets/rows.csv", Body=b"a\nb\nc\n")
    logs.create_log_group(logGroupName="/berth/jobs/vision")
    secrets.create_secret(Name="berth/vision/wandb", SecretString="wandb-key")
    queue_url = sqs.create_queue(QueueName="berth-host-h1")["QueueUrl"]

    spec = {
        "name": "train",
        "code": bundle.code,
        "command": [sys.executable, "train.py"],
        "data": [{"source": "s3://berth-data/vision/sets/rows.csv", "mount": "/data/in"}],
        "secrets": {"WANDB_API_KEY": "berth/vision/wandb"},
        "resources": {"gpu_type": "H100", "gpus": 1},
    }
    work = tmp_path / "work"
    cfg = AgentConfig(
        api_url="http://unused",
        pool="lab",
        host_id="h1",
        work_dir=work,
        cache_dir=tmp_path / "cache",
        gpus={"discovery": "simulated", "simulated": {"gpu_type": "H100", "count": 2}},  # type: ignore[arg-type]
        limits=JobLimits(uid_range=None),
    )
    work.mkdir()
    inventory = discover(cfg.gpus, cfg.host_id)
    api = FakeAgentApi(spec, queue_url, [inventory.healthy_uuids[1]])
    cache = ObjectCache(cfg.cache_dir, cfg.cache_max_bytes)
    runner = AttemptRunner(
        config=cfg,
        inventory=inventory,
        api=api,
        executor=ProcessExecutor(),
        ledger=AttemptLedger(work),
        io_for=lambda creds: BotocoreIO.for_credentials(
            creds, region=REGION, cache=cache, artifacts_bucket="berth-artifacts", data_bucket="berth-data"
        ),
        sync_interval_s=0.5,
    )
    daemon = Daemon(
        config=cfg,
        inventory=inventory,
        api=api,
        runner=runner,
        queue_for=lambda url: SqsQueue(sqs, url),
        ledger=AttemptLedger(work),
        poll_wait_s=1,
    )
    message = {
        "protocol": 1,
        "kind": "run",
        "job_id": "j-1",
        "attempt": 1,
        "fencing_token": "tok",
        "rank": 0,
        "world_size": 1,
        "gpu_ids": api.gpus,
        "claim_by": "2030-01-01T00:00:00Z",
    }
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(message))
    t = threading.Thread(target=daemon.run, kwargs={"install_signals": False})
    t.start()
    try:
        assert api.done.wait(30), api.reports
    finally:
        daemon.on_sigterm()
        t.join(10)
    assert not t.is_alive()
    assert [r["event"] for r in api.reports] == ["started", "succeeded"], api.reports
    events = logs.get_log_events(logGroupName="/berth/jobs/vision", logStreamName="j-1/1")["events"]
    assert [e["message"] for e in events] == ["rows 3 gpus GPU-sim-h1-1 key wandb-key"]
    out = s3.get_object(Bucket="berth-data", Key="vision/jobs/j-1/outputs/result.txt")["Body"].read()
    assert out == b"ok"
    time.sleep(0.1)
    assert "Messages" not in sqs.receive_message(
        QueueUrl=queue_url, WaitTimeSeconds=0
    )  # deleted after the claim
    assert list(work.iterdir()) == [work / ".attempts"] and not list((work / ".attempts").iterdir())
