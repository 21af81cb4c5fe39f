"""A cloud job's ``secrets`` end to end (issue 11), on a local cloud of its own with no on-prem hosts:
``placement: cloud`` jobs of team vision name a secret of theirs; the dispatcher registers a job
definition holding the secret's ARN with ``Berth-exec-vision`` (the stack's execution role), the local
Batch reads it as that role and the job sees its value (it prints a hash and the length, never the
value), for an image job and for a code-bundle job (through the launcher). Nothing Berth stores or
answers holds the value. A job naming team nlp's secret is refused at submit (403), and a secret that
cannot be read when the job starts (marked for deletion after submit) fails the job for good with
ECS's reason, after one attempt.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from tests.e2e.conftest import ApiClient, LocalCloudProcess, log_lines, start_local_cloud

TERMINAL = ("COMPLETED", "FAILED", "CANCELED")
VALUE = "e2e-" + secrets.token_hex(12)
PRINT_HASH = (
    "import hashlib, os; v = os.environ['TOKEN']; "
    "print('sha256', hashlib.sha256(v.encode()).hexdigest(), 'len', len(v), flush=True)"
)
EXPECTED_LINE = f"sha256 {hashlib.sha256(VALUE.encode()).hexdigest()} len {len(VALUE)}"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    started = start_local_cloud(
        tmp_path_factory.mktemp("berth-secrets") / "state", "--agents", "0", "--quiet"
    )
    try:
        sm = started.aws("secretsmanager")
        sm.create_secret(Name="berth/vision/e2e-token", SecretString=VALUE)
        sm.create_secret(Name="berth/nlp/hf", SecretString="nlp-" + secrets.token_hex(8))
        yield started
    finally:
        status = started.stop()
    assert status == 0, started.log_tail()


def _spec(name: str, secret: str, **over: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11-slim",  # the local Batch runs an image job's command on the host
        "command": ["python3", "-c", PRINT_HASH],
        "resources": {"gpu_type": "A10G", "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "cloud"},
        "secrets": {"TOKEN": secret},
        "timeout_minutes": 10,
        **over,
    }


def _wait(client: ApiClient, job_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in TERMINAL:
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def _berth_submit(cloud: LocalCloudProcess, profile: str, spec_file: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", "submit", "-f", str(spec_file), "--output", "json"],
        env=cloud.cli_env(profile),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return str(json.loads(proc.stdout)["id"])


def test_cloud_jobs_see_their_tenants_secret_and_nothing_holds_its_value(
    cloud: LocalCloudProcess, tmp_path: Path
) -> None:
    alice = cloud.client("alice")
    r = alice.post("/v1/jobs", json=_spec("secret-image", "berth/vision/e2e-token"))
    assert r.status == 201, r.text
    image_job = r.json()["id"]
    code_dir = tmp_path / "src"
    code_dir.mkdir()
    (code_dir / "show.py").write_text(PRINT_HASH.replace("; ", "\n") + "\n")
    spec = _spec("secret-bundle", "berth/vision/e2e-token", command=["python3", "show.py"], code="./src")
    del spec["image"]
    spec_file = tmp_path / "bundle.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    bundle_job = _berth_submit(cloud, "alice", spec_file)

    for job_id in (image_job, bundle_job):
        done = _wait(alice, job_id)
        assert done["status"] == "COMPLETED", (
            done,
            log_lines(alice, job_id, done["attempts"], 1, timeout=1),
        )
        assert done["site"] == "cloud" and done["attempts"] == 1, done
        assert log_lines(alice, job_id, 1, 1) == [EXPECTED_LINE]
        answers = [
            done,
            alice.get(f"/v1/jobs/{job_id}/events").json(),
            alice.get("/v1/jobs").json(),
        ]
        assert VALUE not in json.dumps(answers), answers
        assert done["spec"]["secrets"] == {"TOKEN": "berth/vision/e2e-token"}

    # The definition holds the secret's ARN (a name) and vision's execution role; SubmitJob no value.
    region = done["placement"]["region"]
    batch = boto3.client(
        "batch",
        endpoint_url=cloud.env["AWS_ENDPOINT_URL"],
        region_name=region,
        aws_access_key_id=cloud.credentials("admin").access_key,
        aws_secret_access_key=cloud.credentials("admin").secret_key,
    )
    definitions = [
        d
        for d in batch.describe_job_definitions(status="ACTIVE")["jobDefinitions"]
        if d["containerProperties"].get("secrets")
    ]
    assert definitions, "no job definition with secrets"
    for d in definitions:
        props = d["containerProperties"]
        assert props["executionRoleArn"].endswith(":role/Berth-exec-vision")
        assert [s["valueFrom"].split(":secret:")[1] for s in props["secrets"]] == ["berth/vision/e2e-token"]
        assert VALUE not in json.dumps(d)


def test_another_tenants_secret_is_refused_at_submit(cloud: LocalCloudProcess) -> None:
    alice = cloud.client("alice")
    r = alice.post("/v1/jobs", json=_spec("steal", "berth/nlp/hf"))
    assert r.status == 403, r.text
    assert r.json()["error"]["details"] == {"secret": "berth/nlp/hf"}
    assert all(j["spec"]["name"] != "steal" for j in alice.get("/v1/jobs").json()["jobs"])


def test_a_secret_unreadable_at_start_fails_the_job_for_good(cloud: LocalCloudProcess) -> None:
    """Marked for deletion after submit: DescribeSecret (the submit check) still finds it, ECS cannot
    read it. The job fails with ECS's reason after one attempt (the job's mistake, not the cloud's)."""
    sm = cloud.aws("secretsmanager")
    sm.create_secret(Name="berth/vision/going-away", SecretString="soon-gone-" + secrets.token_hex(8))
    sm.delete_secret(SecretId="berth/vision/going-away", RecoveryWindowInDays=7)
    alice = cloud.client("alice")
    r = alice.post("/v1/jobs", json=_spec("gone", "berth/vision/going-away", retry={"max_attempts": 3}))
    assert r.status == 201, r.text
    done = _wait(alice, r.json()["id"])
    assert done["status"] == "FAILED" and done["attempts"] == 1, done
    assert "ResourceInitializationError" in done["reason"] and "secret" in done["reason"], done["reason"]
    assert "berth/vision/going-away" in done["reason"], done["reason"]
    assert "soon-gone" not in json.dumps(done)
