"""`berth local up` itself: ready time, the env file, SigV4 at the front door, clean shutdown."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from botocore.credentials import Credentials

pytestmark = pytest.mark.e2e

#: A hang guard, not a speed target: `berth local up` prints "ready in N s" (about 5 s on a quiet
#: machine of this size); a timed assertion near that would flake on a loaded one.
READY_BUDGET_S = 60.0


def _listening(url: str) -> bool:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


def test_ready_without_hanging(local_cloud: Any) -> None:
    assert local_cloud.ready_seconds < READY_BUDGET_S, local_cloud.log_tail()
    assert "berth local: ready in" in local_cloud.log_tail(10**8)


def test_env_file_contents_and_permissions(local_cloud: Any) -> None:
    env = local_cloud.env
    assert set(env) == {
        "BERTH_API_URL",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "BERTH_LOCAL_STATE_DIR",
    }
    state = local_cloud.state_dir
    assert env["BERTH_LOCAL_STATE_DIR"] == str(state.resolve())
    assert env["AWS_CONFIG_FILE"] == str((state / "aws" / "config").resolve())
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == str((state / "aws" / "credentials").resolve())
    assert env["AWS_REGION"] == "us-east-1"
    assert env["BERTH_API_URL"].startswith("http://127.0.0.1:")
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert _listening(env["BERTH_API_URL"]) and _listening(env["AWS_ENDPOINT_URL"])
    for path in (state / "env", state / "aws" / "config", state / "aws" / "credentials"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (state, state / "aws"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    config = Path(env["AWS_CONFIG_FILE"]).read_text()
    for profile in ("alice", "bob", "admin"):
        assert f"[profile {profile}]" in config
        assert local_cloud.credentials(profile).access_key


def test_signed_request_is_served(local_cloud: Any) -> None:
    response = local_cloud.client("alice").get("/v1/jobs")
    assert response.status == 200, response.text
    assert "jobs" in response.json()


def test_unsigned_request_is_403(local_cloud: Any) -> None:
    response = local_cloud.unsigned().get("/v1/jobs")
    assert response.status == 403
    assert response.json()["error"]["code"] == "MISSING_AUTHENTICATION_TOKEN"


def test_wrong_secret_is_403(local_cloud: Any) -> None:
    key = local_cloud.credentials("bob").access_key
    client = local_cloud.client_with(Credentials(key, "wrong-secret"))
    response = client.get("/v1/jobs")
    assert response.status == 403
    assert response.json()["error"]["code"] == "INVALID_SIGNATURE"


def test_sigint_stops_cleanly_and_removes_the_env_file(tmp_path: Path, start_local_cloud: Any) -> None:
    cloud = start_local_cloud(tmp_path / "state")  # real agent processes (the default)
    api, endpoint = cloud.api_url, cloud.env["AWS_ENDPOINT_URL"]
    assert cloud.client("bob").get("/v1/jobs").status == 200
    pids = [a["pid"] for a in json.loads((cloud.state_dir / "agents.json").read_text())]
    assert pids and all(Path(f"/proc/{pid}").exists() for pid in pids)
    status = cloud.stop()
    assert status == 0, cloud.log_tail()
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "agents outlived the local cloud"
    assert "berth local: stopping" in cloud.log_tail(10**8)  # agents log on while they drain
    assert not cloud.env_file.exists()
    assert not _listening(api) and not _listening(endpoint)
