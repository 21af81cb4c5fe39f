"""`berth logs` and `berth metrics` against a real agent process: a `python3 -c` job's lines come
back in order (and `berth logs -f`, started while it runs, ends by itself once the job has ended),
and the agent's usage samples (CPU and RSS from /proc; simulated GPUs have no NVML reading) reach
`GET /v1/jobs/{id}/metrics`; another tenant gets 404."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.e2e.conftest import LocalCloudProcess, start_local_cloud

LINES = 30
SCRIPT = f"""
import sys, time
x = bytearray(40 * 1024 * 1024)
for i in range({LINES}):
    print(f"line {{i}}", flush=True)
    if i % 10 == 0:
        print(f"err {{i}}", file=sys.stderr, flush=True)
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    lc = start_local_cloud(
        tmp_path_factory.mktemp("berth-obs") / "state",
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
        yield lc
    finally:
        status = lc.stop()
    assert status == 0, lc.log_tail()


def _berth(cloud: LocalCloudProcess, *args: str, profile: str = "alice", timeout: float = 120) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", *args],
        env=cloud.cli_env(profile),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_logs_and_metrics_of_a_real_job(cloud: LocalCloudProcess) -> None:
    alice = cloud.client("alice")
    spec = {
        "name": "printer",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", SCRIPT],
        "resources": {"gpu_type": "A100", "gpus": 1},
    }
    r = alice.post("/v1/jobs", json=spec)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    follower = subprocess.Popen(
        [sys.executable, "-m", "berth_tools.cli.main", "logs", job_id, "-f", "--poll", "0.5"],
        env=cloud.cli_env("alice"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    out, err = follower.communicate(timeout=150)
    followed_s = time.monotonic() - started
    assert follower.returncode == 0, err
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "COMPLETED", job
    expected_out = [f"line {i}" for i in range(LINES)]
    followed = out.splitlines()
    assert [x for x in followed if x.startswith("line")] == expected_out, (followed, followed_s)
    assert [x for x in followed if x.startswith("err")] == [f"err {i}" for i in range(0, LINES, 10)]

    again = _berth(cloud, "logs", job_id)
    assert again.returncode == 0 and again.stdout.splitlines() == followed
    as_json = _berth(cloud, "logs", job_id, "--output", "json")
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(events) == len(followed) and {e["attempt"] for e in events} == {1}
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)

    page = alice.get(f"/v1/jobs/{job_id}/logs", params={"limit": 5}).json()
    assert len(page["events"]) == 5 and page["status"] == "COMPLETED" and page["next_token"]

    metrics = _berth(cloud, "metrics", job_id, "--output", "json")
    assert metrics.returncode == 0, metrics.stderr
    data = json.loads(metrics.stdout)
    assert data["attempt"] == 1 and data["summary"]["samples"] >= 1, data
    assert data["summary"]["rss_max_mib"] > 40, data  # the job's 40 MiB bytearray, read from /proc
    assert data["summary"]["gpu_util_avg"] is None  # simulated GPUs: no NVML reading
    assert _berth(cloud, "metrics", job_id).returncode == 0

    assert cloud.client("bob").get(f"/v1/jobs/{job_id}/logs").status == 404
    assert cloud.client("bob").get(f"/v1/jobs/{job_id}/metrics").status == 404
    assert _berth(cloud, "logs", job_id, profile="bob").returncode == 3  # not found
