"""A gang in the cloud end to end (the session's local cloud): a 2-node code-bundle job placed in the
cloud runs as one Batch multi-node parallel job whose two ranks connect over TCP and complete; a rank
that is killed fails the whole gang (the control plane ends it on the node's Batch event)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from tests.e2e.conftest import LocalCloudProcess, log_lines

#: Rank 0 serves MASTER_PORT; the other ranks connect to MASTER_ADDR. With KILL_RANK, that rank
#: SIGKILLs itself once connected and rank 0 hangs (as a collective would) until the gang is ended.
RANKS = """
import os, signal, socket, time
rank, world = int(os.environ["BERTH_RANK"]), int(os.environ["BERTH_WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server(("0.0.0.0", port))
    conn, _ = server.accept()
    heard = conn.recv(64).decode()
    if not heard:  # the peer died: hang, as a collective would, until the gang is ended
        time.sleep(600)
    print("rank 0 heard", heard, flush=True)
else:
    for _ in range(600):
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    if os.environ.get("KILL_RANK") == str(rank):
        print(f"rank {rank} of {world} is killed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    conn.sendall(f"rank {rank} of {world}".encode())
"""
ENDED = ("COMPLETED", "FAILED", "CANCELED")


def _submit(cloud: LocalCloudProcess, tmp_path: Path, **env: str) -> str:
    code = tmp_path / "gang"
    code.mkdir()
    (code / "ranks.py").write_text(RANKS)
    spec = {
        "name": "e2e-gang",
        "code": "./gang",
        "command": ["python3", "ranks.py"],
        "env": env,
        "resources": {"gpu_type": "A10G", "gpus": 2, "nodes": 2, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "cloud"},
        "retry": {"max_attempts": 1},
        "timeout_minutes": 10,
    }
    (tmp_path / "gang.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "berth_tools.cli.main",
            "submit",
            "-f",
            str(tmp_path / "gang.yaml"),
            "-o",
            "json",
        ],
        env=cloud.cli_env("alice"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["id"])


def _wait(
    cloud: LocalCloudProcess, job_id: str, statuses: tuple[str, ...], timeout: float = 180
) -> dict[str, Any]:
    alice = cloud.client("alice")
    deadline = time.monotonic() + timeout  # a hang guard, not a speed target
    while True:
        job: dict[str, Any] = alice.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def test_a_two_node_cloud_gang_connects_and_completes(local_cloud: LocalCloudProcess, tmp_path: Path) -> None:
    job_id = _submit(local_cloud, tmp_path)
    job = _wait(local_cloud, job_id, ENDED)
    assert job["status"] == "COMPLETED", job
    placement = job["placement"]
    assert job["site"] == "cloud" and placement["instances"] == 2 and placement["spot"] is False, placement
    assert placement["queue"].endswith("-ondemand")
    lines = log_lines(local_cloud.client("alice"), job_id, 1, 2, timeout=30)
    assert "rank 0 heard rank 1 of 2" in lines, lines  # the gang's stream is its main node's


def test_killing_one_rank_fails_the_gang(local_cloud: LocalCloudProcess, tmp_path: Path) -> None:
    job_id = _submit(local_cloud, tmp_path, KILL_RANK="1")
    _wait(local_cloud, job_id, ("RUNNING", *ENDED))
    running_at = time.monotonic()
    job = _wait(local_cloud, job_id, ENDED)
    print(f"gang failed {time.monotonic() - running_at:.1f} s after it was seen RUNNING")
    assert job["status"] == "FAILED", job
    assert "gang node 1 exited with code 137" in job["reason"], job
    # Logs per rank: rank 1's own stream (its Batch node's), through the API and `berth logs --rank`.
    alice, deadline = local_cloud.client("alice"), time.monotonic() + 30  # a hang guard
    while True:
        r = alice.get(f"/v1/jobs/{job_id}/logs", params={"rank": "1"})
        assert r.status == 200, r.text
        if "rank 1 of 2 is killed" in [e["message"] for e in r.json()["events"]]:
            break
        assert time.monotonic() < deadline, json.dumps(r.json())
        time.sleep(0.25)
    out = subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", "logs", job_id, "--rank", "1"],
        env=local_cloud.cli_env("alice"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and "rank 1 of 2 is killed" in out.stdout.splitlines(), out
    assert alice.get(f"/v1/jobs/{job_id}/logs", params={"rank": "2"}).status == 422
