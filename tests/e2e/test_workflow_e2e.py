"""Jobs run end to end on `berth local up` (scripted agents speaking the dispatch protocol): status
changes over HTTP and on the example rule's queue (JobEventsQueueUrl), and `berth explain` on a job
that cannot fit now."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import boto3

SPEC: dict[str, Any] = {
    "name": "e2e-run",
    "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
    "command": ["python", "train.py"],
    "resources": {"gpu_type": "A100", "gpus": 2},
    "env": {"SCRIPTED_RUN_S": "0.5"},
}


def _wait(client: Any, job_id: str, statuses: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def test_a_job_runs_and_its_changes_reach_the_bus(local_cloud: Any) -> None:
    alice = local_cloud.client("alice")
    r = alice.post("/v1/jobs", json=SPEC)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    done = _wait(alice, job_id, ("COMPLETED", "FAILED", "CANCELED"))
    assert done["status"] == "COMPLETED" and done["site"] == "onprem", done
    events = alice.get(f"/v1/jobs/{job_id}/events").json()["events"]
    moves = [e["to"] for e in events]
    assert moves == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    stamps = [e["at"] for e in events]
    assert stamps == sorted(stamps)

    outputs = json.loads((local_cloud.state_dir / "outputs.json").read_text())
    agents = json.loads((local_cloud.state_dir / "agents.json").read_text())
    assert {a["host_id"] for a in agents} >= {done["placement"]["hosts"][0]["host_id"]}
    creds = local_cloud.credentials("admin")
    sqs = boto3.client(
        "sqs",
        endpoint_url=local_cloud.env["AWS_ENDPOINT_URL"],
        region_name=local_cloud.env["AWS_REGION"],
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
    )
    seen: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 20
    while len(seen) < 4 and time.monotonic() < deadline:
        got = sqs.receive_message(
            QueueUrl=outputs["JobEventsQueueUrl"], MaxNumberOfMessages=10, WaitTimeSeconds=1
        )
        for m in got.get("Messages", []):
            event = json.loads(m["Body"])
            if event["detail"]["job_id"] == job_id:
                seen[event["detail"]["seq"]] = event
    ordered = [seen[k] for k in sorted(seen)]
    assert [e["detail"]["to"] for e in ordered] == moves
    assert [e["detail"]["from"] for e in ordered] == [None, *moves[:-1]]
    assert {e["detail-type"] for e in ordered} == {"Berth Job State Change"}
    assert (
        ordered[-1]["detail"]["placement"]["hosts"][0]["host_id"] == done["placement"]["hosts"][0]["host_id"]
    )


def test_explain_names_why_a_job_cannot_fit_now(local_cloud: Any) -> None:
    alice = local_cloud.client("alice")
    blocker = {**SPEC, "name": "e2e-blocker", "resources": {"gpu_type": "A100", "gpus": 8}}
    blocker["env"] = {"SCRIPTED_RUN_S": "120"}
    blockers = [alice.post("/v1/jobs", json=blocker).json()["id"] for _ in range(2)]
    try:
        for b in blockers:
            _wait(alice, b, ("RUNNING",))
        r = alice.post("/v1/jobs", json={**blocker, "name": "e2e-waits"})
        assert r.status == 201, r.text
        waiting = r.json()["id"]
        time.sleep(2.5)  # a pass has run and stored its reason
        proc = subprocess.run(
            [sys.executable, "-m", "berth_tools.cli.main", "explain", waiting, "--output", "json"],
            env=local_cloud.cli_env("alice"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["status"] == "QUEUED" and out["outcome"] == "pending", out
        assert "capacity" in json.dumps(out["explanation"]["rules"]), out
        assert alice.get(f"/v1/jobs/{waiting}").json()["reason"].startswith("waiting for placement (capacity")
        alice.post(f"/v1/jobs/{waiting}/cancel")
    finally:
        for b in blockers:
            alice.post(f"/v1/jobs/{b}/cancel")


def test_a_finished_jobs_cost_is_in_its_events_and_berth_usage(local_cloud: Any) -> None:
    alice = local_cloud.client("alice")
    r = alice.post("/v1/jobs", json={**SPEC, "env": {"SCRIPTED_RUN_S": "2"}})
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    done = _wait(alice, job_id, ("COMPLETED", "FAILED", "CANCELED"))
    assert done["status"] == "COMPLETED", done
    # 2 GPUs at the default internal rate (1 USD per GPU-hour) for a few seconds
    assert done["placement"]["hourly_usd"] == 2.0 and 0 < done["cost_usd"] < 0.05, done
    proc = subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", "usage", "--output", "json"],
        env=local_cloud.cli_env("alice"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    usage = json.loads(proc.stdout)
    assert usage["tenant"] == "vision" and usage["attempts"] >= 1
    onprem = {s["site"]: s for s in usage["sites"]}["onprem"]
    assert onprem["cost_usd"] >= done["cost_usd"] - 1e-4 and onprem["gpu_hours"] > 0
