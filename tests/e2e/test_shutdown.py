"""Ctrl-C of `berth local up` stops everything it started: the functions' threads, the agents, the jobs
they run and the local AWS Batch's job processes, with jobs running (issue 19).

The test polls until the whole process tree is gone and asserts nothing is left; it asserts no time
bound (the seconds it took are printed; docs/local-cloud.md gives the measured figure).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import ApiClient, start_local_cloud

from berth_tools.localcloud.process_tree import alive, command_line, descendants

#: A job that notes its pid and then runs far longer than the test.
LONG_JOB = """
import os, sys, time
with open(os.environ["MARK"], "a") as fh:
    fh.write(f"{os.getpid()}\\n")
print("running", flush=True)
time.sleep(3600)
"""
#: Only a liveness bound for the polls (a stuck process fails the test instead of hanging it).
GIVE_UP_S = 300.0


def _spec(name: str, mark: Path, placement: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11-slim",  # agents and the local Batch run an image job's command on the host
        "command": ["python3", "-c", LONG_JOB],
        "resources": {"gpu_type": "A100", "gpus": 1, "cpu": 4, "memory_gib": 16},
        "env": {"MARK": str(mark)},
        "constraints": {"placement": placement},
    }


def _wait_running(client: ApiClient, job_id: str, mark: Path) -> int:
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] == "RUNNING" and mark.exists() and mark.read_text().strip():
            return int(mark.read_text().split()[0])
        assert job["status"] not in ("COMPLETED", "FAILED", "CANCELED"), job
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def test_sigint_with_running_jobs_leaves_no_process_behind(tmp_path: Path, job_dir: Path) -> None:
    cloud = start_local_cloud(
        tmp_path / "state",
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
        alice = cloud.client("alice")
        jobs = {}
        for placement in ("onprem", "cloud"):
            mark = job_dir / f"{placement}.pid"  # jobs run under uids of their own as root
            r = alice.post("/v1/jobs", json=_spec(f"long-{placement}", mark, placement))
            assert r.status == 201, r.text
            jobs[placement] = (r.json()["id"], mark)
        job_pids = [_wait_running(alice, job_id, mark) for job_id, mark in jobs.values()]
        agents = [a["pid"] for a in json.loads((cloud.state_dir / "agents.json").read_text())]
        tree = sorted(set(descendants(cloud.process.pid)) | set(job_pids) | set(agents))
        assert len(tree) >= 4, [command_line(p) for p in tree]  # the cloud, an agent, two jobs (at least)

        started = time.monotonic()
        cloud.process.send_signal(signal.SIGINT)
        while alive(tree) and time.monotonic() - started < GIVE_UP_S:
            time.sleep(0.1)
        took = time.monotonic() - started
        left = {p: command_line(p) for p in alive(tree)}
        print(f"SIGINT to no process left: {took:.1f} s ({len(tree)} processes)")
        assert not left, f"left behind after SIGINT: {left}"
        assert cloud.process.wait(timeout=10) == 0, cloud.log_tail()
        assert not cloud.env_file.exists()
    finally:
        survivors = alive(descendants(cloud.process.pid))
        cloud.stop()
        for pid in survivors:  # never leave a stray job on the machine, even when the test fails
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
