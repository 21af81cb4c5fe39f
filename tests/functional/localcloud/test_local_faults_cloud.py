"""`POST /_berth/fault` on a running local cloud: partition, ddb-throttle and lambda-kill as the chaos
benchmark sends them (sqs-duplicate: test_moto_sqs; agent-kill: below, on stand-in agent processes, and
tests/e2e/test_real_agents.py on real ones)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from berth_tools.cli.fault_cmd import fault_url, send
from berth_tools.cli.main import app
from berth_tools.localcloud import faults
from berth_tools.localcloud.cloud import LocalCloud
from berth_tools.localcloud.moto_transport import InProcessTransport
from berth_tools.localcloud.process_agents import AgentProcess
from berth_tools.localcloud.state_dir import StateDir

from .helpers import call, sign


def _fault(cloud: LocalCloud, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
    assert cloud.state_dir is not None
    return send(fault_url(cloud.state_dir), body)


@pytest.fixture(autouse=True)
def _cleared(cloud: LocalCloud) -> Any:
    yield
    assert _fault(cloud, {"kind": "clear"})[0] == 200


def _cli(cloud: LocalCloud, *args: str) -> Any:
    assert cloud.state_dir is not None
    return CliRunner().invoke(app, ["local", "fault", "--state-dir", str(cloud.state_dir), *args])


def _get(cloud: LocalCloud, key: str, secret: str, query: str = "") -> tuple[int, Any]:
    url = f"{cloud.api_url}/v1/jobs{query}"
    status, _, body = call("GET", url, sign("GET", url, key, secret))
    return status, body


def test_a_partitioned_host_gets_503_from_the_api_until_healed(cloud: LocalCloud) -> None:
    host = cloud.host_identity("fault-h1")
    alice = cloud.profiles["alice"]
    before, _ = _get(cloud, host.access_key_id, host.secret_access_key)
    assert before != 503
    status, answer = _fault(cloud, {"kind": "partition", "host_id": "fault-h1"})
    assert status == 200 and answer["host_id"] == "fault-h1"
    assert _fault(cloud, None)[1]["faults"]["partitions"] == ["fault-h1"]
    status, body = _get(cloud, host.access_key_id, host.secret_access_key)
    assert status == 503 and "partition" in json.dumps(body), body
    assert _get(cloud, alice.access_key_id, alice.secret_access_key)[0] == 200  # others are served
    # its AWS calls still work: only Berth's API is cut off
    sts = boto3.client(
        "sts",
        endpoint_url=cloud.endpoint_url,
        region_name=cloud.region,
        aws_access_key_id=host.access_key_id,
        aws_secret_access_key=host.secret_access_key,
    )
    assert sts.get_caller_identity()["Arn"].endswith(":user/host-fault-h1")
    shown = _cli(cloud, "show")
    assert shown.exit_code == 0 and "partitioned: fault-h1" in shown.output, shown.output
    healed = _cli(cloud, "heal", "fault-h1")
    assert healed.exit_code == 0 and "partitioned" not in healed.output, healed.output
    assert _get(cloud, host.access_key_id, host.secret_access_key)[0] == before
    assert _cli(cloud, "ddb-throttle", "2").exit_code == 2  # bad input: 400
    assert _fault(cloud, {"kind": "partition", "host_id": "../x"})[0] == 400


def test_ddb_throttle_answers_throttling_on_both_ways_into_moto(cloud: LocalCloud) -> None:
    table = cloud.output("JobsTableName")
    no_retries = Config(retries={"max_attempts": 1, "mode": "standard"})
    server = cloud.session().client("dynamodb", endpoint_url=cloud.endpoint_url, config=no_retries)
    in_process = cloud.session().client("dynamodb", endpoint_url=cloud.endpoint_url, config=no_retries)
    transport = InProcessTransport(cloud.endpoint_url)
    in_process.meta.events.register("before-send", transport)
    server.scan(TableName=table, Limit=1)
    status, answer = _fault(cloud, {"kind": "ddb-throttle", "fraction": 1, "seed": 5})
    assert status == 200 and (answer["fraction"], answer["seed"]) == (1.0, 5)
    for client in (server, in_process):
        with pytest.raises(ClientError) as caught:
            client.scan(TableName=table, Limit=1)
        assert caught.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert transport.served > 0  # the in-process client's calls never left the process
    throttled = _fault(cloud, None)[1]["faults"]["ddb_throttle"]
    assert throttled["hits"] == throttled["calls"] >= 2
    assert _fault(cloud, {"kind": "clear"})[0] == 200
    for client in (server, in_process):
        client.scan(TableName=table, Limit=1)


def test_lambda_kill_ends_the_running_invocation_as_lambda_does(cloud: LocalCloud) -> None:
    alice = cloud.profiles["alice"]
    name = cloud.output("ApiFunctionName")
    assert cloud.runtime is not None
    results: list[tuple[int, Any]] = []
    slow = threading.Thread(
        target=lambda: results.append(_get(cloud, alice.access_key_id, alice.secret_access_key, "?sleep=60"))
    )
    slow.start()
    deadline = time.monotonic() + 30
    while cloud.runtime.busy(name) < 1:
        assert time.monotonic() < deadline, "the invocation never started"
        time.sleep(0.05)
    part = name[2:-2]  # any part of the name
    status, answer = _fault(cloud, {"kind": "lambda-kill", "function": part})
    assert status == 200, answer
    assert answer["kind"] == "lambda-kill" and answer["function"] == name
    slow.join(timeout=30)
    assert not slow.is_alive()
    assert results[0][0] == 502  # the front door's answer to a function error
    with pytest.raises(ProcessLookupError):
        os.kill(answer["pid"], 0)  # killed and reaped
    assert _get(cloud, alice.access_key_id, alice.secret_access_key)[0] == 200  # a fresh sandbox
    assert _fault(cloud, {"kind": "lambda-kill", "function": "NoSuchFunction"})[0] == 404


class _StandIn(AgentProcess):
    """An agent process that only sleeps (no control plane needed to see it killed and restarted)."""

    def start(self) -> AgentProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        return self


def test_agent_kill_sigkills_the_agent_and_starts_it_again(tmp_path: Path) -> None:
    local = LocalCloud(template={})
    local._state = StateDir(tmp_path / "state")
    local._state.root.mkdir(mode=0o700)
    agent = _StandIn(
        host_id="h1", gpu_type="A100", gpus=1, home=tmp_path / "h1", api_url="", endpoint_url="",
        region="us-east-1", artifacts_bucket="", data_bucket="", access_key=("k", "s"),
    )  # fmt: skip
    local.process_agents.append(agent.start())
    local.supervise_agents()  # as start() does: a failed agent is started again
    state = faults.FaultState()
    state.agent_kill_handler = local.kill_process_agent
    first = agent.pid
    answer = state.apply({"kind": "agent-kill", "host_id": "h1"})
    assert (answer["host_id"], answer["killed_pid"]) == ("h1", first)
    deadline = time.monotonic() + 30
    while not (agent.alive() and agent.pid != first):
        assert time.monotonic() < deadline, "the agent was not restarted"
        time.sleep(0.05)
    assert agent.process is not None and agent.process.returncode is None
    listed = json.loads((tmp_path / "state" / "agents.json").read_text())
    assert [(a["host_id"], a["pid"]) for a in listed] == [("h1", agent.pid)]
    with pytest.raises(faults.FaultError) as caught:
        state.apply({"kind": "agent-kill", "host_id": "h2"})
    assert caught.value.status == 404
    restarted = agent.process
    local._state = None
    local.stop()  # stops the restarted agent
    assert restarted.poll() is not None
    with pytest.raises(faults.FaultError):  # stopping: nothing is killed or restarted any more
        state.apply({"kind": "agent-kill", "host_id": "h1"})
