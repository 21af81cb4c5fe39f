"""`--state-dir` across a restart: the emulator's state is not kept, and a restart says so and removes
what it will not use, credentials first (docs/local-cloud.md, "The state dir")."""

from __future__ import annotations

import configparser
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from berth_tools.localcloud.cloud import LocalCloud, load_template
from berth_tools.localcloud.state_dir import PreviousRun, StateDir, StateDirBusy

from .conftest import MINI_TEMPLATE
from .helpers import call, sign

UP = [sys.executable, "-m", "berth_tools.cli.main", "local", "up"]


def _cloud(state: Path, console: io.StringIO | None = None) -> LocalCloud:
    return LocalCloud(
        template=load_template(MINI_TEMPLATE), state_dir=state, seed_writer=lambda *a: None, console=console
    )


def _keys(state: Path) -> dict[str, str]:
    parser = configparser.ConfigParser()
    parser.read(state / "aws" / "credentials")
    return {name: parser[name]["aws_secret_access_key"] for name in parser.sections()}


def _crashed_run(state: Path) -> tuple[Path, Path]:
    """What a `berth local up` killed with SIGKILL leaves: keys, env, agent files, a job root with an
    attempt's credentials (and a file of the user's that is not ours to remove)."""
    jobs = Path(tempfile.mkdtemp(prefix="berth-jobs-"))
    attempt = jobs / "sim-a100-0" / "work" / "j-1" / "1" / ".aws"
    attempt.mkdir(parents=True)
    (attempt / "credentials.json").write_text('{"SecretAccessKey": "old"}')
    os.chmod(attempt.parent, 0o500)  # as the agent leaves a job's staged directories
    for rel, text in {
        "aws/credentials": "[alice]\naws_access_key_id = AKIAOLD\naws_secret_access_key = old\n",
        "aws/config": "[profile alice]\n",
        "env": "export BERTH_API_URL=http://127.0.0.1:1/prod\n",
        "outputs.json": "{}",
        "agents.json": json.dumps([{"host_id": "sim-a100-0", "pid": 999999999, "gpus": []}]),
        "agents/sim-a100-0/config.yaml": "host_id: sim-a100-0\n",
        "agents/sim-a100-0/agent.log": "{}\n",
        "jobs-root": f"{jobs}\n",
        "notes.txt": "mine",
    }.items():
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).write_text(text)
    return jobs, attempt


def test_a_restart_after_a_crash_says_state_is_not_kept_and_removes_the_old_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old_jobs, old_attempt = _crashed_run(state)
    console = io.StringIO()
    with _cloud(state, console) as cloud:
        said = console.getvalue()
        assert "The emulator's state is not kept across a restart" in said, said
        assert "aws/credentials" in said and str(old_jobs) in said, said
        assert said.index("aws/credentials") < said.index(str(old_jobs)) < said.index("agents")
        assert not old_attempt.exists() and not old_jobs.exists()
        assert not (state / "agents" / "sim-a100-0").exists()
        assert (state / "notes.txt").read_text() == "mine"  # not ours
        keys = _keys(state)
        assert keys["alice"] != "old" and keys["alice"] == cloud.profiles["alice"].secret_access_key
        new_jobs = Path((state / "jobs-root").read_text().strip())
        assert new_jobs != old_jobs and new_jobs.is_dir()
    assert not new_jobs.exists(), "a clean stop removes this run's job root (the attempts' files)"


def test_a_clean_restart_gets_fresh_keys_and_the_old_ones_stop_working(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with _cloud(state) as first:
        old = first.profiles["alice"]
    console = io.StringIO()
    with _cloud(state, console) as second:
        assert "not kept across a restart" in console.getvalue()
        assert "Removed: aws/credentials, aws/config" in console.getvalue()
        new = second.profiles["alice"]
        assert new.secret_access_key != old.secret_access_key
        assert second.request("GET", "/v1/jobs", "alice")[0] == 200
        url = f"{second.api_url}/v1/jobs"
        status, _, body = call("GET", url, sign("GET", url, old.access_key_id, old.secret_access_key))
        assert status == 403, body  # the old run's keys are gone with its emulator
        assert _keys(state)["alice"] == new.secret_access_key


def test_a_fresh_state_dir_says_nothing_of_an_earlier_run(tmp_path: Path) -> None:
    console = io.StringIO()
    with _cloud(tmp_path / "state", console):
        assert "earlier run" not in console.getvalue()


def test_a_state_dir_in_use_is_refused_and_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with _cloud(state) as cloud:
        env, keys = (state / "env").read_text(), _keys(state)
        with pytest.raises(StateDirBusy, match="in use by another"):
            StateDir(state).prepare()
        # the same from another process: `berth local up` exits 1 with the reason
        result = subprocess.run(
            [*UP, "--state-dir", str(state), "--template", str(MINI_TEMPLATE), "--agents", "0"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert result.returncode == 1 and "in use by another" in result.stderr, result.stderr
        assert (state / "env").read_text() == env and _keys(state) == keys
        assert cloud.request("GET", "/v1/jobs", "alice")[0] == 200


def test_state_dir_permissions(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with _cloud(state):
        for path in ("", "aws", "agents"):
            assert stat.S_IMODE((state / path).stat().st_mode) == 0o700, path
        for path in ("aws/credentials", "aws/config", "env", "outputs.json", "jobs-root", "lock"):
            assert stat.S_IMODE((state / path).stat().st_mode) == 0o600, path


def test_the_state_dir_is_absolute_from_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = StateDir(Path(".berth/local"))
    assert state.root == (tmp_path / ".berth" / "local").resolve()
    assert state.exports("http://api", "us-east-1", "http://moto")["AWS_SHARED_CREDENTIALS_FILE"] == str(
        state.root / "aws" / "credentials"
    )


def test_describe_names_what_could_not_be_removed(tmp_path: Path) -> None:
    text = PreviousRun(tmp_path, ("aws/credentials",), ("agents",)).describe()
    assert "not kept across a restart" in text and "Could not remove: agents" in text


def test_a_jobs_root_marker_pointing_elsewhere_is_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep")
    (state / "aws").mkdir(parents=True)
    (state / "jobs-root").write_text(f"{precious}\n")
    previous = StateDir(state).prepare()
    assert previous is not None and "jobs-root" in previous.removed
    assert (precious / "data").read_text() == "keep"
