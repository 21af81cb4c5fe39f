"""Job arrays end to end on the local cloud with real agent processes: a small parameter sweep runs
on-prem and in the cloud (local Batch) with each task's BERTH_ARRAY_* / BERTH_PARAM_* and its
substituted command; the CLI shows the array; a bulk cancel stops running and queued tasks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import ApiClient, LocalCloudProcess, log_lines, start_local_cloud
from tests.e2e.test_cloud_e2e import _set_policy

ENDED = ("COMPLETED", "FAILED", "CANCELED")
TASK_PY = (
    "import os, sys, time; "
    "print('task', os.environ['BERTH_ARRAY_INDEX'], 'of', os.environ['BERTH_ARRAY_SIZE'], "
    "'lr', os.environ['BERTH_PARAM_LR'], 'arg', sys.argv[1], 'id', os.environ['BERTH_JOB_ID'], flush=True); "
    "time.sleep(float(os.environ.get('RUN_S', '0.5')))"
)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    started = start_local_cloud(
        tmp_path_factory.mktemp("berth-arrays") / "state",
        "--agents",
        "2",
        "--gpus-per-agent",
        "2",
        "--gpu-type",
        "A100",
        "--agent-kind",
        "process",
    )
    try:
        _set_policy(started)
        yield started
    finally:
        status = started.stop()
    assert status == 0, started.log_tail()


def _sweep(n: int, placement: str, run_s: float = 0.5) -> dict[str, Any]:
    return {
        "name": "e2e-sweep",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", TASK_PY, "lr={lr}"],
        "env": {"RUN_S": str(run_s)},
        "resources": {"gpu_type": "A100", "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": placement},
        "array": {"parameters": [{"lr": f"0.{i + 1}"} for i in range(n)]},
    }


def _wait_counts(client: ApiClient, array_id: str, done: Any, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{array_id}")
        assert r.status == 200, r.text
        arr = r.json()
        if done(arr["array"]["counts"]):
            return dict(arr)
        assert time.monotonic() < deadline, arr
        time.sleep(0.5)


def _berth(cloud: LocalCloudProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", *args],
        env=cloud.cli_env("alice"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("placement", ["onprem", "cloud"])
def test_sweep_tasks_run_with_their_env(cloud: LocalCloudProcess, placement: str) -> None:
    alice = cloud.client("alice")
    n = 3
    r = alice.post("/v1/jobs", json=_sweep(n, placement))
    assert r.status == 201, r.text
    arr = r.json()
    assert arr["array"]["size"] == n
    arr = _wait_counts(alice, arr["id"], lambda c: sum(c.get(s, 0) for s in ENDED) == n)
    assert arr["array"]["counts"] == {"COMPLETED": n}, arr
    assert arr["status"] == "COMPLETED"
    for i in range(n):
        tid = f"{arr['id']}:{i}"
        task = alice.get(f"/v1/jobs/{tid}").json()
        assert task["status"] == "COMPLETED" and task["site"] == placement, task
        lines = log_lines(alice, tid, 1, 1, timeout=30)
        assert lines == [f"task {i} of {n} lr 0.{i + 1} arg lr=0.{i + 1} id {tid}"], lines
    listed = alice.get("/v1/jobs", params={"array": arr["id"]}).json()
    assert [t["id"] for t in listed["jobs"]] == [f"{arr['id']}:{i}" for i in range(n)]
    # The CLI: status shows size and counts; ls shows the array as one row; ls --array its tasks.
    out = _berth(cloud, "status", arr["id"], "--output", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["array"]["counts"] == {"COMPLETED": n}
    out = _berth(cloud, "ls", "--output", "json")
    ids = [j["id"] for j in json.loads(out.stdout)["jobs"]]
    assert arr["id"] in ids and not any(i.startswith(arr["id"] + ":") for i in ids)
    out = _berth(cloud, "ls", "--array", arr["id"], "--output", "json")
    assert len(json.loads(out.stdout)["jobs"]) == n


def test_bulk_cancel_stops_running_and_queued_tasks(cloud: LocalCloudProcess) -> None:
    alice = cloud.client("alice")
    n = 7  # 4 on-prem GPUs: some run, the rest wait
    r = alice.post("/v1/jobs", json=_sweep(n, "onprem", run_s=120))
    assert r.status == 201, r.text
    array_id = r.json()["id"]
    _wait_counts(alice, array_id, lambda c: c.get("RUNNING", 0) >= 2, timeout=120)
    out = _berth(cloud, "cancel", array_id, "--output", "json")
    assert out.returncode == 0, out.stderr
    arr = _wait_counts(alice, array_id, lambda c: c.get("CANCELED", 0) == n, timeout=120)
    assert arr["array"]["counts"] == {"CANCELED": n} and arr["status"] == "CANCELED"
    for i in range(n):
        assert alice.get(f"/v1/jobs/{array_id}:{i}").json()["status"] == "CANCELED"
    # Another tenant sees none of it.
    assert cloud.client("bob").get(f"/v1/jobs/{array_id}").status == 404
    assert cloud.client("bob").post(f"/v1/jobs/{array_id}/cancel").status == 404


def test_a_cloud_sweep_of_a_code_bundle_runs_as_batch_array_jobs(
    cloud: LocalCloudProcess, tmp_path: Path
) -> None:
    """The pass groups the tasks it places alike into one Batch array job; each child's launcher runs
    its own task (its row of the group's table) and the task's own logs, events and outcome follow."""
    alice = cloud.client("alice")
    n = 4
    code = tmp_path / "sweep"
    code.mkdir()
    (code / "task.py").write_text(TASK_PY.replace("; ", "\n"))
    spec = {
        "name": "e2e-bundle-sweep",
        "code": "./sweep",
        "command": ["python3", "task.py", "lr={lr}"],
        "resources": {"gpu_type": "A100", "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "cloud"},
        "array": {"parameters": [{"lr": f"0.{i + 1}"} for i in range(n)]},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    out = _berth(cloud, "submit", "-f", str(tmp_path / "sweep.yaml"), "--output", "json")
    assert out.returncode == 0, out.stderr
    array_id = json.loads(out.stdout)["id"]
    arr = _wait_counts(alice, array_id, lambda c: sum(c.get(s, 0) for s in ENDED) == n)
    assert arr["array"]["counts"] == {"COMPLETED": n}, arr
    groups = []
    for i in range(n):
        tid = f"{array_id}:{i}"
        task = alice.get(f"/v1/jobs/{tid}").json()
        assert task["status"] == "COMPLETED" and task["site"] == "cloud", task
        groups.append(task["placement"].get("group"))
        lines = log_lines(alice, tid, 1, 1, timeout=30)
        assert lines == [f"task {i} of {n} lr 0.{i + 1} arg lr=0.{i + 1} id {tid}"], lines
    # the tasks one pass placed together ran as one array job (the expander may split them over
    # passes, so at least two shared one)
    shared = [g for g in groups if g is not None]
    assert len(shared) >= 2 and len({json.dumps(g, sort_keys=True) for g in shared}) < len(shared), groups
