"""Real `berth-agent` processes (`berth local up --agent-kind process`) where the process matters:
a job flooding stdout through the real agent to CloudWatch Logs (complete, in order, the agent's
memory bounded), and SIGTERM draining a real agent (its job finishes, it exits, and the control
plane places nothing more on it). The protocol races (claims, duplicates, restart, gangs, second
SIGTERM) are decided by the control plane's services and tested against them with real job
processes in tests/unit/agent/test_protocol_races.py."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from tests.e2e.conftest import LocalCloudProcess, start_local_cloud

FLOOD_LINES = 30_000  # a burst within the agent's 8 MiB log buffer: every line must arrive


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    cloud = start_local_cloud(
        tmp_path_factory.mktemp("berth-hardening") / "state",
        "--agents",
        "2",
        "--gpus-per-agent",
        "1",
        "--gpu-type",
        "A100",
        "--agent-kind",
        "process",
    )
    try:
        yield cloud
    finally:
        status = cloud.stop()
    assert status == 0, cloud.log_tail()


def _agents(cloud: LocalCloudProcess) -> list[dict[str, Any]]:
    return list(json.loads((cloud.state_dir / "agents.json").read_text()))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _wait(client: Any, job_id: str, statuses: tuple[str, ...], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def _logs(cloud: LocalCloudProcess) -> Any:
    creds = cloud.credentials("admin")
    return boto3.client(
        "logs",
        endpoint_url=cloud.env["AWS_ENDPOINT_URL"],
        region_name=cloud.region,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
    )


def _all_events(logs: Any, group: str, stream: str) -> list[str]:
    out: list[str] = []
    token = None
    while True:
        kw: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        if token:
            kw["nextToken"] = token
        page = logs.get_log_events(**kw)
        out += [e["message"] for e in page["events"]]
        if page["nextForwardToken"] == token or not page["events"]:
            return out
        token = page["nextForwardToken"]


def test_a_job_flooding_stdout_through_a_real_agent(cloud: LocalCloudProcess) -> None:
    alice = cloud.client("alice")
    before = {a["host_id"]: _peak_rss_kib(a["pid"]) for a in _agents(cloud)}
    spec = {
        "name": "flood",
        "image": "python:3.11-slim",
        "command": [
            "python3",
            "-c",
            f"import sys\nsys.stdout.writelines(f'line {{i}}\\n' for i in range({FLOOD_LINES}))",
        ],
        "resources": {"gpu_type": "A100", "gpus": 1},
    }
    r = alice.post("/v1/jobs", json=spec)
    assert r.status == 201, r.text
    job = _wait(alice, r.json()["id"], ("COMPLETED", "FAILED"))
    assert job["status"] == "COMPLETED", job
    host = job["placement"]["hosts"][0]["host_id"]
    messages = _all_events(_logs(cloud), "/berth/jobs/vision", f"{job['id']}/1")
    assert messages == [f"line {i}" for i in range(FLOOD_LINES)]
    (agent,) = [a for a in _agents(cloud) if a["host_id"] == host]
    grown_mib = (_peak_rss_kib(agent["pid"]) - before[host]) / 1024
    print(f"agent peak RSS grew {grown_mib:.1f} MiB for {FLOOD_LINES} lines")
    assert grown_mib < 48, grown_mib  # the log buffer is bounded at 8 MiB (plus a batch in flight)


def test_sigterm_drains_a_real_agent_and_no_new_work_goes_there(
    cloud: LocalCloudProcess, job_dir: Path
) -> None:
    alice = cloud.client("alice")
    marker = job_dir / "marks"
    script = (
        "import os, time\n"
        "open(os.environ['MARK'], 'a').write('start\\n')\n"
        "time.sleep(3)\n"
        "open(os.environ['MARK'], 'a').write('end\\n')\n"
    )
    spec = {
        "name": "drained",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", script],
        "resources": {"gpu_type": "A100", "gpus": 1},
        "env": {"MARK": str(marker)},
    }
    r = alice.post("/v1/jobs", json=spec)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    running = _wait(alice, job_id, ("RUNNING",))
    host = running["placement"]["hosts"][0]["host_id"]
    (agent,) = [a for a in _agents(cloud) if a["host_id"] == host]
    os.kill(agent["pid"], signal.SIGTERM)
    done = _wait(alice, job_id, ("COMPLETED", "FAILED", "CANCELED"), timeout=30)
    assert done["status"] == "COMPLETED" and done["attempts"] == 1, done
    assert marker.read_text().split() == ["start", "end"]  # it ran to its end, once
    deadline = time.monotonic() + 15
    while _alive(agent["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(agent["pid"]), "the drained agent did not exit"
    # its last heartbeat said draining: its host's lease is still valid, but nothing goes there
    hosts = {h["host_id"]: h for h in alice.get("/v1/capacity").json()["hosts"]}
    assert hosts[host]["draining"] is True and hosts[host]["alive"] is True, hosts[host]
    spec["env"] = {"MARK": str(job_dir / "next")}
    r = alice.post("/v1/jobs", json=spec)
    nxt = _wait(alice, r.json()["id"], ("RUNNING", "COMPLETED"), timeout=60)
    assert nxt["placement"]["hosts"][0]["host_id"] != host, nxt
