"""The first hour: `berth local up` as `make up` starts it, with the default relative state dir
(`.berth/local` under the working directory, no flag: what failed on a fresh clone), then every
command block of the README and of docs/api.md that talks to the local cloud, extracted from the
markdown and run as a user runs it (a `berth` subprocess in the reader's shell: the sourced env file,
the exported profile), each exiting 0 with the output the docs promise (``test_docs_command_blocks_run``),
and every example job in examples/jobs submitted and followed until it COMPLETES
(``test_every_example_runs``). An absolute ``--state-dir`` is the restart test's.

Then what a job may see of the local cloud (a job cannot read the state dir when jobs run under uids
of their own) and what a restart on the same state dir does (the earlier run's keys and attempt
files are gone and it says so). These need real agent processes (the session-scoped ``local_cloud``
fixture's scripted agents do not run a job's command), so they use this module's cloud.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, TEMPLATE, LocalCloudProcess, start_local_cloud

from berth_tools.localcloud.state_dir import STATE_DIR_ENV

pytestmark = pytest.mark.e2e

HELLO = REPO / "examples" / "jobs" / "hello-gpu.yaml"
#: One real agent process (an A100 host: hello-gpu asks for 2 A100s), as few as the README needs.
UP_ARGS: tuple[str, ...] = ("--agents", "1", "--gpus-per-agent", "4", "--quiet")
if TEMPLATE.exists():  # `make test-e2e` synthesises first; otherwise `berth local up` does
    UP_ARGS += ("--template", str(TEMPLATE))
ENDED = {"COMPLETED", "FAILED", "CANCELED"}


def berth(
    cloud: LocalCloudProcess,
    *args: str,
    profile: str | None = "alice",
    cwd: Path,
    sourced: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`berth ARGS` in ``cwd`` with the env file sourced (``sourced=False``: without it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != STATE_DIR_ENV}
    env["COLUMNS"] = "250"  # a wide terminal: tables print whole ids
    if sourced:
        env.update(cloud.env)
    if profile is not None:
        env["AWS_PROFILE"] = profile
    return subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args[3:]} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def wait_status(
    cloud: LocalCloudProcess, job_id: str, wanted: set[str], cwd: Path, timeout: float = 120
) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads(ok(berth(cloud, "status", job_id, "--output", "json", cwd=cwd)))["status"]
        if status in wanted or time.monotonic() > deadline:
            return str(status)
        time.sleep(0.5)


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """(cloud, the user's working directory): `berth local up` with no --state-dir, from that directory."""
    user_dir = tmp_path_factory.mktemp("clone")
    cloud = start_local_cloud(None, *UP_ARGS, cwd=user_dir, log_path=user_dir / "up.log")
    try:
        yield cloud, user_dir
    finally:
        status = cloud.stop()
    assert status == 0, cloud.log_tail()


def test_fault_without_a_running_cloud_says_where_it_looked(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "berth_tools.cli.main", "local", "fault", "show"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != STATE_DIR_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "is missing" in result.stderr and STATE_DIR_ENV in result.stderr, result.stderr


PROBE = r"""
import json, os, sys
state, jobs = sys.argv[1], sys.argv[2]
def attempt(fn):
    try:
        fn()
        return "allowed"
    except PermissionError:
        return "denied"
    except OSError as exc:
        return type(exc).__name__
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
out["credentials"] = attempt(lambda: open(os.path.join(state, "aws", "credentials")).read())
out["state_dir"] = attempt(lambda: os.listdir(state))
out["agent_configs"] = attempt(lambda: os.listdir(os.path.join(state, "agents")))
out["job_root"] = attempt(lambda: os.listdir(jobs))
out["other_attempts"] = attempt(lambda: [os.listdir(os.path.join(jobs, h, "work")) for h in HOSTS])
out["own_dir"] = attempt(lambda: open("probe.txt", "w").write("mine"))
print("PROBE " + json.dumps(out))
"""


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason=f"the local cloud runs as uid {os.geteuid()}, not root: jobs then run as that same user (no "
    "uid to switch to) and can read what it reads; docs/local-cloud.md, 'What a job can reach'",
)
def test_a_job_cannot_read_the_state_dir(first_hour: Any, tmp_path: Path) -> None:
    cloud, cwd = first_hour
    state = cloud.state_dir.resolve()
    jobs = Path((state / "jobs-root").read_text().strip())
    hosts = [a["host_id"] for a in json.loads((state / "agents.json").read_text())]
    spec = {
        "name": "probe",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", PROBE.replace("HOSTS", repr(hosts)), str(state), str(jobs)],
        "resources": {"gpu_type": "A100", "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "onprem"},
    }
    (tmp_path / "probe.json").write_text(json.dumps(spec))
    job_id = json.loads(
        ok(berth(cloud, "submit", "-f", str(tmp_path / "probe.json"), "--output", "json", cwd=cwd))
    )["id"]
    logs = ok(berth(cloud, "logs", "-f", job_id, "--poll", "0.5", cwd=cwd, timeout=180))
    line = next((x for x in logs.splitlines() if "PROBE " in x), None)
    assert line is not None, logs
    seen = json.loads(line.split("PROBE ", 1)[1])
    assert seen["uid"] != 0 and seen["gid"] != 0 and seen["groups"] == [], seen
    assert seen["credentials"] == "denied", seen
    assert seen["state_dir"] == "denied" and seen["agent_configs"] == "denied", seen
    assert seen["job_root"] == "denied" and seen["other_attempts"] == "denied", seen
    assert seen["own_dir"] == "allowed", seen
    assert wait_status(cloud, job_id, ENDED, cwd) == "COMPLETED"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_restart_after_a_kill_on_the_same_state_dir(tmp_path: Path) -> None:
    """`berth local up` killed (SIGKILL: no cleanup), then started again on its state dir: it says the
    emulator's state is not kept, stops the old agent, removes the old keys and attempt files, and the
    old keys and jobs are gone; the new run works."""
    state = tmp_path / "state"
    first = start_local_cloud(state, *UP_ARGS, cwd=tmp_path, log_path=tmp_path / "first.log")
    try:
        old_keys = first.credentials("alice")
        job_id = json.loads(ok(berth(first, "submit", "-f", str(HELLO), "--output", "json", cwd=tmp_path)))[
            "id"
        ]
        wait_status(first, job_id, {"RUNNING", *ENDED}, tmp_path)
        old_agent = json.loads((state / "agents.json").read_text())[0]["pid"]
        old_jobs = Path((state / "jobs-root").read_text().strip())
        assert old_jobs.is_dir()
    finally:
        first.process.kill()
        first.process.wait()
    assert _alive(old_agent), "the agent runs in its own session: it outlives a SIGKILLed local cloud"

    second = start_local_cloud(state, *UP_ARGS, cwd=tmp_path, log_path=tmp_path / "second.log")
    try:
        log = second.log_tail(10**6)
        assert "The emulator's state is not kept across a restart" in log, log
        assert f"agent process {old_agent}" in log and "aws/credentials" in log, log
        assert not _alive(old_agent) and not old_jobs.exists()
        assert second.credentials("alice").secret_key != old_keys.secret_key
        assert second.client_with(old_keys).get("/v1/jobs").status == 403
        assert second.client("alice").get(f"/v1/jobs/{job_id}").status == 404
        fresh = json.loads(ok(berth(second, "submit", "-f", str(HELLO), "--output", "json", cwd=tmp_path)))[
            "id"
        ]
        assert wait_status(second, fresh, ENDED, tmp_path, timeout=180) == "COMPLETED"
    finally:
        assert second.stop() == 0, second.log_tail()


# -- the docs' command blocks and the examples, run as written ------------------------------------
README = REPO / "README.md"
API_DOC = REPO / "docs" / "api.md"
JOB_ID_RE = re.compile(r"\bj-[0-9a-z]{26}\b")
#: The sections whose blocks run against `berth local up`. Not run: "Quick start" (`make demo`, `make
#: test`), "Deploy to AWS" (needs an account), the simulator and benchmark block (no API; minutes:
#: ``OFFLINE``).
DOC_SECTIONS = (
    (README, "## Use it locally"),
    (README, "## Bursting to the cloud"),
    (API_DOC, "## With the `berth` CLI"),
    (API_DOC, "## With a plain SigV4 client"),
)


OFFLINE = re.compile(r"\bberth (sim|bench)\b")


def doc_blocks(path: Path, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, text) of the section under ``heading`` (to the next heading of
    the same or a higher level)."""
    text = path.read_text()
    start = text.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    rest = text[start + len(heading) :]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)]
    section = rest[: ends[0]] if ends else rest
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def shell_commands(block: str) -> list[str]:
    """A block's commands: continuation lines joined, trailing `# comments` dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines() if line.strip()]


def _user_checkout(cloud: LocalCloudProcess, cwd: Path) -> dict[str, str]:
    """``cwd`` set up as a checkout the docs' commands run in (``examples``, ``.venv/bin/berth`` and
    ``.venv/bin/python`` of this interpreter); the environment of a fresh shell there."""
    if not (cwd / "examples").exists():
        (cwd / "examples").symlink_to(REPO / "examples")
    bin_dir = cwd / ".venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, run in (("berth", "-m berth_tools.cli.main"), ("python", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {sys.executable} {run} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != STATE_DIR_ENV}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["COLUMNS"] = "250"
    return env


def run_doc_block(
    cloud: LocalCloudProcess, cwd: Path, block: str, host: str, prelude: list[str] | None = None
) -> dict[str, str]:
    """Run a block's commands one by one in bash, each after the block's ``source``/``export``/
    ``VAR=$(...)`` lines, each exiting 0. ``JOB_ID`` is the id the last `berth submit` printed (a
    dry run prints none), ``HOST`` an on-prem host; ``make`` lines are skipped (the cloud is up).
    ``prelude``: the reader's shell so far (a block of the same page after the first runs in it; its
    ``source``/``export`` lines are added to it). Returns each command's output, by command."""
    env = _user_checkout(cloud, cwd)
    prelude = [] if prelude is None else prelude
    job_id: str | None = None
    outputs: dict[str, str] = {}
    for command in shell_commands(block):
        if command.startswith("make "):
            continue
        if re.match(r"^(source|export) |^[A-Z_]+=\$\(", command):
            prelude.append(command)
            continue
        if "JOB_ID" in command:
            assert job_id is not None, f"{command!r} needs a job: no `berth submit` before it"
            command = command.replace("JOB_ID", job_id)
        command = command.replace("HOST", host)
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "-c", "\n".join(["set -e", *prelude, command])],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        out = result.stdout + result.stderr
        print(f"{time.monotonic() - started:6.1f} s  {command}")  # with -s: where the test's time goes
        assert result.returncode == 0, f"{command!r} exited {result.returncode}:\n{out[-3000:]}"
        if re.search(r"\bberth submit\b", command) and "--dry-run" not in command:
            found = JOB_ID_RE.search(out)
            assert found, f"{command!r} printed no job id:\n{out[-2000:]}"
            job_id = found.group(0)
        outputs[command] = out
    return outputs


def test_docs_command_blocks_run(first_hour: Any) -> None:
    """Every command of the README's and docs/api.md's local blocks, as written, on this local cloud
    (started from the user's directory with no --state-dir: the env file names `.berth/local` there)."""
    cloud, cwd = first_hour
    assert cloud.state_dir == cwd / ".berth" / "local"
    assert cloud.env[STATE_DIR_ENV] == str((cwd / ".berth" / "local").resolve())
    agents = json.loads((cloud.state_dir / "agents.json").read_text())
    assert [a["kind"] for a in agents] == ["process"] and len(agents[0]["gpus"]) == 4
    host = agents[0]["host_id"]
    ran: dict[str, str] = {}
    shells: dict[Path, list[str]] = {}  # one reader's shell per page
    for path, heading in DOC_SECTIONS:
        blocks = doc_blocks(path, heading)
        assert blocks, f"no command block under {heading!r} in {path.name}"
        for language, block in blocks:
            if language == "python":
                result = subprocess.run(
                    [sys.executable, "-c", block],
                    cwd=cwd,
                    env={**_user_checkout(cloud, cwd), **cloud.env},
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert result.returncode == 0 and '"id"' in result.stdout, result.stdout + result.stderr
            elif language in ("", "bash", "sh", "console") and not OFFLINE.search(block):
                ran.update(run_doc_block(cloud, cwd, block, host, shells.setdefault(path, [])))
    # what the new commands said, as the docs say they do
    dry = next(v for k, v in ran.items() if "--dry-run" in k and "submit" in k)
    assert "nothing was submitted or stored" in dry, dry
    follow = next(v for k, v in ran.items() if "--follow" in k)
    assert "-> RUNNING" in follow and "hello from" in follow and "ended COMPLETED" in follow, follow
    assert (cwd / "out" / "outputs" / "hello.txt").read_text() == "hello\n"
    status = next(v for k, v in ran.items() if re.search(r"berth status j-", k))
    assert "/jobs/" in status and "berth outputs" in status, status
    assert host in next(v for k, v in ran.items() if k.endswith("berth capacity"))
    assert "active jobs" in next(v for k, v in ran.items() if k.endswith("berth quota vision"))
    assert host in next(v for k, v in ran.items() if k.endswith(f"berth drain {host}"))
    assert "region outages: us-east-1" in next(v for k, v in ran.items() if "fault region-outage" in k)
    assert "region outages: none" in next(v for k, v in ran.items() if k.endswith("fault clear"))
    # `berth local fault` finds the cloud from the sourced env (BERTH_LOCAL_STATE_DIR) in any directory,
    # and, not sourced, from `.berth/local` in the working directory
    out = ok(berth(cloud, "local", "fault", "region-outage", "us-west-2", profile=None, cwd=Path("/")))
    assert "region outages: us-west-2" in out, out
    out = ok(berth(cloud, "local", "fault", "show", profile=None, cwd=cwd, sourced=False))
    assert "us-west-2" in out, out
    out = ok(berth(cloud, "local", "fault", "clear", profile=None, cwd=cwd, sourced=False))
    assert "region outages: none" in out, out


#: Which profile submits an example (bert-nlp reads team nlp's dataset); bad-* are refused on purpose.
EXAMPLE_PROFILE = {"bert-nlp.yaml": "bob"}


def test_every_example_runs(first_hour: Any) -> None:
    """Each example job in examples/jobs (but the refused one) COMPLETES on `berth local up`, once the
    README's one command lets teams burst (the V100 and cloud examples burst; the rest run on the
    A100 agent)."""
    cloud, cwd = first_hour
    burst = doc_blocks(README, "## Bursting to the cloud")[0][1]
    lets_burst = [c for c in shell_commands(burst) if "berth policy --set" in c]
    assert len(lets_burst) == 1, burst  # the block's sweep is among the examples below
    # the reader's shell after the README's "Use it locally" block: its env file and profile
    reader = [
        c
        for c in shell_commands(doc_blocks(README, "## Use it locally")[0][1])
        if re.match(r"^(source|export) ", c)
    ]
    assert "export AWS_PROFILE=alice" in reader, reader
    run_doc_block(cloud, cwd, lets_burst[0], host="", prelude=reader)
    examples = sorted(p for p in (REPO / "examples" / "jobs").glob("*.yaml") if not p.name.startswith("bad-"))
    assert len(examples) >= 6
    submitted = {}
    for path in examples:
        profile = EXAMPLE_PROFILE.get(path.name, "alice")
        job = json.loads(
            ok(berth(cloud, "submit", "-f", str(path), "--output", "json", profile=profile, cwd=cwd))
        )
        submitted[path.name] = (job["id"], profile)
    clients = {p: cloud.client(p) for p in {p for _, p in submitted.values()}}
    deadline = time.monotonic() + 300
    ended: dict[str, dict[str, Any]] = {}
    while len(ended) < len(submitted) and time.monotonic() < deadline:
        for name, (job_id, profile) in submitted.items():
            if name not in ended:
                r = clients[profile].get(f"/v1/jobs/{job_id}")
                assert r.status == 200, r.text
                if r.json()["status"] in ENDED:
                    ended[name] = r.json()
        time.sleep(1)
    summary = {n: (j["status"], j["reason"], j.get("array", {}).get("counts")) for n, j in ended.items()}
    assert set(ended) == set(submitted), (
        f"still running after 300 s: {set(submitted) - set(ended)}; {summary}"
    )
    assert all(j["status"] == "COMPLETED" for j in ended.values()), summary
