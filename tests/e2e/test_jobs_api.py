"""The job API end to end: real CLI and SigV4 clients over HTTP against `berth local up`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
SPEC: dict[str, Any] = {
    "name": "e2e-probe",
    "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
    "command": ["python", "train.py"],
    "resources": {"gpu_type": "V100", "gpus": 2},
}


def berth(local_cloud: Any, profile: str, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", *args, "--output", "json"],
        env=local_cloud.cli_env(profile),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def test_cli_submit_status_ls_cancel_events(local_cloud: Any, tmp_path: Path) -> None:
    import yaml

    spec = yaml.safe_load((EXAMPLES / "resnet-vision.yaml").read_text())
    spec["env"] = {"SCRIPTED_RUN_S": "120"}  # the scripted agents keep it running until canceled
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(spec))
    code, job, err = berth(local_cloud, "alice", "submit", "-f", str(tmp_path / "long.yaml"))
    assert code == 0, err
    assert job["status"] == "QUEUED" and job["tenant"] == "vision"
    code, got, _ = berth(local_cloud, "alice", "status", job["id"])
    assert code == 0 and got["id"] == job["id"]
    code, page, _ = berth(local_cloud, "alice", "ls", "--all")
    assert code == 0 and job["id"] in {j["id"] for j in page["jobs"]}
    code, canceled, _ = berth(local_cloud, "alice", "cancel", job["id"])
    assert code == 0 and canceled["status"] in ("CANCELED", "CANCELING")
    alice = local_cloud.client("alice")
    deadline = time.monotonic() + 30
    while alice.get(f"/v1/jobs/{job['id']}").json()["status"] != "CANCELED":
        assert time.monotonic() < deadline, "the cancel was never confirmed"
        time.sleep(0.3)
    code, hist, _ = berth(local_cloud, "alice", "events", job["id"])
    moves = [e["to"] for e in hist["events"]]
    assert moves[0] == "QUEUED" and moves[-1] == "CANCELED", moves


def test_cli_exit_codes_and_messages(local_cloud: Any, tmp_path: Path) -> None:
    code, out, _ = berth(local_cloud, "alice", "submit", "-f", str(EXAMPLES / "bad-shell-command.yaml"))
    assert code == 2 and out["error"]["code"] == "ValidationError"
    assert "not a shell string" in out["error"]["message"] and "gpu: unknown field" in out["error"]["message"]
    code, out, _ = berth(local_cloud, "alice", "status", "j-00000000000000000000000000")
    assert code == 3 and out["error"]["code"] == "NotFound"
    missing = tmp_path / "nope.yaml"
    code, out, _ = berth(local_cloud, "alice", "submit", "-f", str(missing))
    assert code == 2 and out["error"]["code"] == "BadSpecFile" and "cannot read" in out["error"]["message"]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: [unclosed\n")
    code, out, _ = berth(local_cloud, "alice", "submit", "-f", str(bad_yaml))
    assert code == 2 and "not valid YAML" in out["error"]["message"]
    code, out, _ = berth(local_cloud, "alice", "quota", "nlp")
    assert code == 4 and out["error"]["code"] == "Forbidden"
    env = {k: v for k, v in local_cloud.cli_env("alice").items() if k != "BERTH_API_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", "ls", "--output", "json"],
        env={**env, "BERTH_CONFIG": str(tmp_path / "none.json")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "NoApiUrl"


def test_other_tenant_gets_404_over_http(local_cloud: Any) -> None:
    alice, bob = local_cloud.client("alice"), local_cloud.client("bob")
    r = alice.post("/v1/jobs", json=SPEC)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    for method, path in [
        ("get", f"/v1/jobs/{job_id}"),
        ("post", f"/v1/jobs/{job_id}/cancel"),
        ("get", f"/v1/jobs/{job_id}/events"),
    ]:
        resp = getattr(bob, method)(path)
        assert resp.status == 404, (method, path, resp.text)
        assert resp.json()["error"]["code"] == "NotFound"
    assert job_id not in {j["id"] for j in bob.get("/v1/jobs", params={"limit": "100"}).json()["jobs"]}


def test_duplicate_submit_with_idempotency_key(local_cloud: Any) -> None:
    alice = local_cloud.client("alice")
    key = {"Idempotency-Key": str(uuid.uuid4())}
    a = alice.post("/v1/jobs", json=SPEC, headers=key)
    b = alice.post("/v1/jobs", json=SPEC, headers=key)
    assert a.status == b.status == 201 and a.json()["id"] == b.json()["id"]
    c = alice.post("/v1/jobs", json={**SPEC, "name": "different"}, headers=key)
    assert c.status == 409 and c.json()["error"]["code"] == "IdempotencyKeyReused"


def test_concurrent_duplicate_submits_make_one_job(local_cloud: Any) -> None:
    alice = local_cloud.client("alice")
    key = {"Idempotency-Key": str(uuid.uuid4())}
    spec = {**SPEC, "name": "racing-submit"}
    results: list[Any] = []

    def go() -> None:
        results.append(alice.post("/v1/jobs", json=spec, headers=key))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = {r.json()["id"] for r in results if r.status == 201}
    assert len(created) == 1, [(r.status, r.text) for r in results]
    # Requests that overlapped the first are told to retry (429 RequestInProgress), never given a
    # second job.
    assert all(r.status in (201, 429) for r in results)
    jobs = alice.get("/v1/jobs", params={"limit": "100"}).json()["jobs"]
    assert sum(1 for j in jobs if j["spec"]["name"] == "racing-submit") == 1


def test_malformed_and_oversized_specs_store_nothing(local_cloud: Any) -> None:
    alice = local_cloud.client("alice")
    before = alice.get("/v1/jobs", params={"limit": "100"}).json()["jobs"]
    cases = [
        (b"{not json", 400),
        (json.dumps({**SPEC, "unknown_field": 1}).encode(), 422),
        (json.dumps({**SPEC, "resources": {"gpus": 65}}).encode(), 422),
        (json.dumps({**SPEC, "env": {"BLOB": "x" * 200_000}}).encode(), 400),
    ]
    for body, status in cases:
        r = alice.post("/v1/jobs", data=body, headers={"Content-Type": "application/json"})
        assert r.status == status, (body[:40], r.text[:300])
        err = r.json()["error"]
        assert err["code"] and err["message"]
    after = alice.get("/v1/jobs", params={"limit": "100"}).json()["jobs"]
    assert [j["id"] for j in after] == [j["id"] for j in before]


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/tenants/vision/quota"])
def test_unsigned_requests_are_refused(local_cloud: Any, path: str) -> None:
    r = local_cloud.unsigned().get(path)
    assert r.status == 403


def test_quota_admin_and_member(local_cloud: Any) -> None:
    admin, alice = local_cloud.client("admin"), local_cloud.client("alice")
    r = alice.put("/v1/tenants/vision/quota", json={"max_active_jobs": 5})
    assert r.status == 403
    r = admin.put("/v1/tenants/nlp/quota", json={"gpus": {"A100": {"guaranteed": 16, "borrow_limit": 16}}})
    assert r.status == 200, r.text
    assert local_cloud.client("bob").get("/v1/tenants/nlp/quota").json()["gpus"]["A100"]["guaranteed"] == 16


def _cancel_active(client: Any) -> None:
    for status in ("QUEUED", "STARTING", "RUNNING", "RETRYING"):
        while True:
            jobs = client.get("/v1/jobs", params={"status": status, "limit": "100"}).json()["jobs"]
            if not jobs:
                break
            for job in jobs:
                client.post(f"/v1/jobs/{job['id']}/cancel")
    # a placed job counts until its host confirms the cancel (the agent's next heartbeat, then the
    # workflow's end of the attempt: on a loaded machine well over 30 s)
    deadline = time.monotonic() + 90
    while client.get("/v1/jobs", params={"status": "CANCELING", "limit": "1"}).json()["jobs"]:
        assert time.monotonic() < deadline, "cancels were never confirmed"
        time.sleep(0.3)


def test_quota_update_keeps_the_active_job_counter_over_http(local_cloud: Any) -> None:
    """Issue 6: the same quota PUT again used to reset the counter and let a fourth job in."""
    admin, bob = local_cloud.client("admin"), local_cloud.client("bob")
    _cancel_active(bob)
    quota = {"max_active_jobs": 3}
    long = {**SPEC, "env": {"SCRIPTED_RUN_S": "120"}}  # still active while the test runs
    try:
        assert admin.put("/v1/tenants/nlp/quota", json=quota).status == 200
        for i in range(2):
            r = bob.post("/v1/jobs", json={**long, "name": f"quota-{i}"})
            assert r.status == 201, r.text
        assert admin.put("/v1/tenants/nlp/quota", json=quota).status == 200
        r = bob.post("/v1/jobs", json={**long, "name": "quota-2"})
        assert r.status == 201, r.text
        r = bob.post("/v1/jobs", json={**long, "name": "quota-3"})
        assert r.status == 429, r.text
        assert r.json()["error"]["code"] == "QuotaExceeded"
        listed = bob.get("/v1/jobs", params={"limit": "100"}).json()["jobs"]
        active = [j for j in listed if j["status"] not in ("COMPLETED", "FAILED", "CANCELED")]
        assert sorted(j["spec"]["name"] for j in active) == ["quota-0", "quota-1", "quota-2"]
    finally:
        _cancel_active(bob)
        admin.put("/v1/tenants/nlp/quota", json={})


def test_code_bundle_is_uploaded_once_and_stored_by_digest(local_cloud: Any) -> None:
    """Issue 9: `berth submit -f` packs code: ./mnist, uploads it, and a second submit uploads nothing."""
    spec_file = EXAMPLES / "mnist-bundle.yaml"
    code, first, err = berth(local_cloud, "alice", "submit", "-f", str(spec_file))
    assert code == 0, err
    assert first["spec"]["code"].startswith("sha256:") and len(first["spec"]["code"]) == 71
    assert "uploaded" in err or "already stored" in err, err
    code, second, err = berth(local_cloud, "alice", "submit", "-f", str(spec_file))
    assert code == 0, err
    assert "already stored, nothing uploaded" in err, err
    assert second["spec"]["code"] == first["spec"]["code"] and second["id"] != first["id"]
    # The digest is vision's: nlp may not run it, nor read vision's data.
    bob = local_cloud.client("bob")
    r = bob.post(
        "/v1/jobs", json={"name": "steal", "code": first["spec"]["code"], "command": ["python", "x.py"]}
    )
    assert r.status == 422 and r.json()["error"]["details"] == {"code": first["spec"]["code"]}
    r = bob.post(
        "/v1/jobs", json={**SPEC, "data": [{"source": "s3://vision-datasets/mnist/", "mount": "/d"}]}
    )
    assert r.status == 403 and "vision-datasets" in r.json()["error"]["message"]
    for job in (first, second):
        local_cloud.client("alice").post(f"/v1/jobs/{job['id']}/cancel")


def test_fleet_explain_capacity_and_infeasible_over_http(local_cloud: Any) -> None:
    """Issue 8 item 1 on `berth local up`: the seeded simulated fleet, explain and capacity through the
    CLI, the policy readable by members, and an infeasible job refused at submit naming the rule."""
    code, cap, err = berth(local_cloud, "alice", "capacity")
    assert code == 0, err
    assert cap["totals"]["hosts"] >= 4 and cap["totals"]["gpus"] >= 32
    # The cloud branch is deployed: the price file's three regions, each with its circuit's state.
    assert cap["cloud"]["enabled"] is True
    regions = {r["region"]: r for r in cap["cloud"]["regions"]}
    assert set(regions) == {"us-east-1", "us-east-2", "us-west-2"}, regions
    assert all(r["circuit"] == "closed" for r in regions.values()), regions

    r = local_cloud.client("alice").post(
        "/v1/jobs", json={**SPEC, "name": "e2e-explain", "constraints": {"placement": "onprem"}}
    )
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    code, out, err = berth(local_cloud, "alice", "explain", job_id)
    assert code == 0, err
    # The scripted agents may have placed it already: explain then says where, else why it waits.
    assert out["job_id"] == job_id if "job_id" in out else True
    assert out["outcome"] in ("onprem", "pending", "placed", "finished"), out
    code, out, _ = berth(local_cloud, "bob", "explain", job_id)
    assert code == 3 and out["error"]["code"] == "NotFound"

    r = local_cloud.client("alice").post(
        "/v1/jobs", json={**SPEC, "name": "e2e-h200", "resources": {"gpu_type": "H200", "gpus": 8}}
    )
    assert r.status == 422, r.text
    assert r.json()["error"]["code"] == "Infeasible" and r.json()["error"]["details"]["rule"] == "gpu_type"

    code, policy, err = berth(local_cloud, "bob", "policy")
    assert code == 0 and policy["version"] >= 0 and "burst" in policy["document"], err
    r = local_cloud.client("bob").put("/v1/policy", json=policy["document"])
    assert r.status == 403, r.text
