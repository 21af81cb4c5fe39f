"""Jobs on real `berth-agent` processes (`berth local up --agent-kind process`): the job's command
runs as a real process on a simulated GPU; an agent killed with SIGKILL mid-job takes its job with
it and the job completes on another host in a second attempt; cancel kills the job's process."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from tests.e2e.conftest import LocalCloudProcess, start_local_cloud

#: Each run appends "start <pid> <host> <time>" and, when it ends normally, "end <pid> <time>".
MARKER_SCRIPT = """
import os, socket, sys, time
mark = os.environ["MARK"]
def note(text):
    # 0666 whatever the job's umask: as root, each attempt (each host) runs as a uid of its own
    fd = os.open(mark, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    if os.fstat(fd).st_uid == os.getuid():
        os.fchmod(fd, 0o666)
    with os.fdopen(fd, "a") as fh:
        fh.write(text + "\\n")
note(f"start {os.getpid()} {time.time()}")
print("hello from a real job", flush=True)
time.sleep(float(os.environ.get("RUN_S", "1")))
note(f"end {os.getpid()} {time.time()}")
"""


def _spec(marker: Path, run_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "name": "real-process",
        "image": "python:3.11-slim",  # the process executor runs the command on the host
        "command": ["python3", "-c", MARKER_SCRIPT],
        "resources": {"gpu_type": "A100", "gpus": 1},
        "env": {"MARK": str(marker), "RUN_S": str(run_s)},
        **extra,
    }


@pytest.fixture(scope="module")
def real_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    cloud = start_local_cloud(
        tmp_path_factory.mktemp("berth-real") / "state",
        "--agents",
        "3",
        "--gpus-per-agent",
        "2",
        "--gpu-type",
        "A100",
        "--agent-kind",
        "process",
    )
    try:
        yield cloud
    finally:
        agents = _agents(cloud)  # (restarted ones too: `agent-kill`)
        status = cloud.stop()
    assert status == 0, cloud.log_tail()
    assert not [a for a in agents if _alive(a["pid"])], agents  # no agent outlives the local cloud


def _agents(cloud: LocalCloudProcess) -> list[dict[str, Any]]:
    return list(json.loads((cloud.state_dir / "agents.json").read_text()))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait(client: Any, job_id: str, statuses: tuple[str, ...], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def _marks(marker: Path, timeout: float = 120, kind: str = "start", count: int = 1) -> list[list[str]]:
    """The job's marks once `count` of `kind` are there. The wait allows a visibility timeout (60 s)
    more than a job takes to start, as `_sleeper` explains."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line.split() for line in marker.read_text().splitlines()] if marker.exists() else []
        if sum(1 for line in lines if line[0] == kind) >= count:
            return lines
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)


def test_agents_are_real_registered_processes(real_cloud: LocalCloudProcess) -> None:
    agents = _agents(real_cloud)
    assert len(agents) == 3
    for agent in agents:
        assert agent["pid"] != real_cloud.process.pid and _alive(agent["pid"])
        cmdline = Path(f"/proc/{agent['pid']}/cmdline").read_bytes().split(b"\0")
        assert b"berth_agent.main" in cmdline, cmdline
        assert len(agent["gpus"]) == 2
    capacity = real_cloud.client("alice").get("/v1/capacity").json()
    assert {a["host_id"] for a in agents} <= {h["host_id"] for h in capacity.get("hosts", [])} or capacity
    # each says how it contains its jobs (registered with its inventory): a cgroup of their own where
    # the host delegates one, else process group + marker + subreaper (this repo's test machine)
    modes = {h["host_id"]: h["containment"] for h in capacity["hosts"]}
    assert all(modes[a["host_id"]] in ("cgroup-v2", "process-group") for a in agents), modes


def test_a_real_process_job_completes(real_cloud: LocalCloudProcess, job_dir: Path) -> None:
    alice = real_cloud.client("alice")
    marker = job_dir / "marks"
    r = alice.post("/v1/jobs", json=_spec(marker, 1))
    assert r.status == 201, r.text
    job = _wait(alice, r.json()["id"], ("COMPLETED", "FAILED"))
    assert job["status"] == "COMPLETED" and job["attempts"] == 1, job
    lines = _marks(marker, kind="end")
    assert [line[0] for line in lines] == ["start", "end"]
    # its stdout went to CloudWatch Logs with the attempt's scoped credentials (/v1/agent/credentials)
    creds = real_cloud.credentials("admin")
    logs = boto3.client(
        "logs",
        endpoint_url=real_cloud.env["AWS_ENDPOINT_URL"],
        region_name=real_cloud.region,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
    )
    events = logs.get_log_events(logGroupName="/berth/jobs/vision", logStreamName=f"{job['id']}/1")
    assert [e["message"] for e in events["events"]] == ["hello from a real job"]


def test_cancel_kills_the_running_process(real_cloud: LocalCloudProcess, job_dir: Path) -> None:
    alice = real_cloud.client("alice")
    marker = job_dir / "marks"
    r = alice.post("/v1/jobs", json=_spec(marker, 300))
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    pid = int(_marks(marker)[0][1])
    assert _alive(pid)
    _wait(alice, job_id, ("RUNNING",))
    assert alice.post(f"/v1/jobs/{job_id}/cancel").status == 202
    job = _wait(alice, job_id, ("CANCELED", "FAILED", "COMPLETED"), timeout=60)
    assert job["status"] == "CANCELED", job
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"job process {pid} still running after cancel"
    assert "end" not in marker.read_text()


def _logged(cloud: LocalCloudProcess, host: str, msg: str) -> int:
    """How many records of the agent of `host` say `msg`."""
    count = 0
    for line in (cloud.state_dir / "agents" / host / "agent.log").read_text().splitlines():
        try:
            count += json.loads(line).get("msg") == msg
        except (ValueError, AttributeError):
            continue
    return count


def test_a_gpu_error_moves_the_job_without_using_an_attempt_and_the_gpu_stays_out_until_cleared(
    real_cloud: LocalCloudProcess, job_dir: Path
) -> None:
    """`berth local fault gpu-error HOST GPU` under a running job: its agent's GPU health watcher sees
    XID 79, the heartbeat reports it, the control plane stops the job (GpuFailed: not counted, so a
    job of one attempt runs again) and takes the GPU out of placement until an admin clears it."""
    from berth_tools.cli.fault_cmd import fault_url, send

    alice, admin = real_cloud.client("alice"), real_cloud.client("admin")
    marker = job_dir / "marks"
    r = alice.post("/v1/jobs", json=_spec(marker, 300, retry={"max_attempts": 1}))
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    first_pid = int(_marks(marker)[0][1])
    running = _wait(alice, job_id, ("RUNNING",))
    (placed,) = running["placement"]["hosts"]
    host, (gpu,) = placed["host_id"], placed["gpu_ids"]
    status, answer = send(fault_url(real_cloud.state_dir), {"kind": "gpu-error", "host_id": host, "gpu": gpu})
    assert status == 200 and answer["gpu_id"] == gpu, answer
    try:
        deadline = time.monotonic() + 150
        while True:
            job = alice.get(f"/v1/jobs/{job_id}").json()
            if job["attempts"] == 2 and job["status"] == "RUNNING":
                break
            assert job["status"] not in ("FAILED", "COMPLETED", "CANCELED"), job
            assert time.monotonic() < deadline, job
            time.sleep(0.25)
        assert not _alive(first_pid), "the job still runs on the failed GPU"
        (moved,) = job["placement"]["hosts"]
        assert gpu not in moved["gpu_ids"], job["placement"]
        reasons = [e["reason"] for e in alice.get(f"/v1/jobs/{job_id}/events").json()["events"]]
        retried = next(r for r in reasons if r.startswith("GpuFailed"))
        assert gpu in retried and f"of host {host}" in retried and "XID 79" in retried, reasons
        assert "this one not counted" in retried, retried
        hosts = {h["host_id"]: h for h in admin.get("/v1/capacity").json()["hosts"]}
        assert hosts[host]["degraded"] and [f["gpu_id"] for f in hosts[host]["gpu_faults"]] == [gpu]
        assert alice.post(f"/v1/hosts/{host}/gpus/{gpu}/clear").status == 403
    finally:
        alice.post(f"/v1/jobs/{job_id}/cancel")
        cleared = admin.post(f"/v1/hosts/{host}/gpus/{gpu}/clear")
    assert cleared.status == 200, cleared.text
    hosts = {h["host_id"]: h for h in admin.get("/v1/capacity").json()["hosts"]}
    assert not hosts[host]["degraded"], hosts[host]
    # its agent, still reporting the fault, is told to forget it (and the GPU stays placeable)
    deadline = time.monotonic() + 60
    while not _logged(real_cloud, host, "GPU fault cleared by an admin"):
        assert time.monotonic() < deadline, "the agent never forgot the cleared fault"
        time.sleep(0.25)
    hosts = {h["host_id"]: h for h in admin.get("/v1/capacity").json()["hosts"]}
    assert not hosts[host]["degraded"], hosts[host]
    _wait(alice, job_id, ("CANCELED",), timeout=60)


def test_a_control_plane_outage_longer_than_the_lease_costs_no_job(
    real_cloud: LocalCloudProcess, job_dir: Path
) -> None:
    """Berth's API answers 503 for longer than the host lease (20 s locally) but less than lease +
    outage tolerance: the agents keep their jobs running, heartbeat again once it is back, and the
    job completes in its first attempt (no HostLost, no second run)."""
    from berth_tools.cli.fault_cmd import fault_url, send

    alice = real_cloud.client("alice")
    marker = job_dir / "marks"
    r = alice.post("/v1/jobs", json=_spec(marker, 40))
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    pid = int(_marks(marker)[0][1])
    _wait(alice, job_id, ("RUNNING",))
    url = fault_url(real_cloud.state_dir)
    assert send(url, {"kind": "control-plane-outage"})[0] == 200
    try:
        assert alice.get(f"/v1/jobs/{job_id}").status == 503
        time.sleep(28)  # the outage: longer than the 20 s lease, shorter than lease + 20 s tolerance
        assert _alive(pid), "the job was stopped during a control-plane outage shorter than the tolerance"
    finally:
        assert send(url, {"kind": "clear"})[0] == 200
    done = _wait(alice, job_id, ("COMPLETED", "FAILED", "CANCELED"), timeout=120)
    assert done["status"] == "COMPLETED" and done["attempts"] == 1, done
    lines = _marks(marker, kind="end")
    assert [line[0] for line in lines] == ["start", "end"], lines


def _registrations(cloud: LocalCloudProcess, host: str) -> int:
    """How many times the agent of `host` said it registered (once per start)."""
    count = 0
    for line in (cloud.state_dir / "agents" / host / "agent.log").read_text().splitlines():
        try:
            count += json.loads(line).get("msg") == "registered"
        except (ValueError, AttributeError):
            continue
    return count


#: Double-forks a sleeper into a session of its own (its parent exits at once: a daemon), writes
#: the sleeper's pid to $MARK, then runs $RUN_S seconds.
DETACHING_SCRIPT = """
import os, time
mark = os.environ["MARK"]
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(mark + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.rename(mark + ".tmp", mark)
        time.sleep(600)
    os._exit(0)
os.waitpid(pid, 0)
while not os.path.exists(mark):
    time.sleep(0.05)
print("detached a sleeper", flush=True)
time.sleep(float(os.environ.get("RUN_S", "1")))
"""


def _sleeper(marker: Path, timeout: float = 120) -> int:
    """The pid the job's sleeper wrote. The wait allows a visibility timeout (60 s) more than a job
    takes to start: when an earlier test SIGKILLed an agent, its long poll, still open on the
    queue's side, may take the work message, which comes back only when that timeout runs out (SQS's
    behaviour for a receiver that died)."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, "the job never detached its sleeper"
        time.sleep(0.1)
    return int(marker.read_text())


@pytest.mark.parametrize("end", ["completes", "canceled"])
def test_a_detached_sleeper_dies_before_the_job_ends(
    real_cloud: LocalCloudProcess, job_dir: Path, end: str
) -> None:
    """A double-forked daemon of the job (setsid, its parent gone) is killed with the job, on a
    normal end and on cancel, before the job's end is reported (and its GPU freed)."""
    alice = real_cloud.client("alice")
    marker = job_dir / "sleeper"
    spec = _spec(marker, 1 if end == "completes" else 300)
    spec["command"] = ["python3", "-c", DETACHING_SCRIPT]
    r = alice.post("/v1/jobs", json=spec)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    try:
        sleeper = _sleeper(marker)
    except AssertionError as exc:
        for agent in _agents(real_cloud):  # every thread's stack into its agent.log, to see why
            if _alive(agent["pid"]):
                os.kill(agent["pid"], signal.SIGUSR1)
        time.sleep(1)
        raise AssertionError(f"{exc}: {alice.get(f'/v1/jobs/{job_id}').json()}") from None
    try:
        if end == "canceled":
            _wait(alice, job_id, ("RUNNING",))
            assert alice.post(f"/v1/jobs/{job_id}/cancel").status == 202
        job = _wait(alice, job_id, ("COMPLETED", "CANCELED", "FAILED"), timeout=60)
        assert job["status"] == ("COMPLETED" if end == "completes" else "CANCELED"), job
        assert not _alive(sleeper), f"the job's detached sleeper {sleeper} outlived it"  # no wait
    finally:
        if _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


# The tests that SIGKILL an agent come last: a killed agent's long poll may still take a work message
# on the queue's side, which then comes back only after the visibility timeout (60 s), as on SQS.


def test_agent_killed_mid_job_completes_and_never_runs_twice_at_once(
    real_cloud: LocalCloudProcess, job_dir: Path
) -> None:
    alice = real_cloud.client("alice")
    marker = job_dir / "marks"
    r = alice.post("/v1/jobs", json=_spec(marker, 4, retry={"max_attempts": 3}))
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    first_pid = int(_marks(marker)[0][1])
    running = _wait(alice, job_id, ("RUNNING",))
    host = running["placement"]["hosts"][0]["host_id"]
    (agent,) = [a for a in _agents(real_cloud) if a["host_id"] == host]
    os.kill(agent["pid"], signal.SIGKILL)
    killed_at = time.time()
    # the job goes down with its agent (PR_SET_PDEATHSIG), so it cannot run on while retried
    deadline = time.monotonic() + 5
    while _alive(first_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(first_pid), "the killed agent's job is still running"

    done = _wait(alice, job_id, ("COMPLETED", "FAILED", "CANCELED"), timeout=120)
    assert done["status"] == "COMPLETED", done
    assert done["attempts"] == 2, done  # (the restarted agent's host may take the retry)
    lines = _marks(marker, kind="end")
    starts = [line for line in lines if line[0] == "start"]
    ends = [line for line in lines if line[0] == "end"]
    assert len(starts) == 2 and len(ends) == 1, lines
    # the second run started after the first was killed, and only the second ended
    assert float(starts[1][2]) > killed_at and ends[0][1] == starts[1][1], lines


def test_agent_kill_restarts_the_agent_and_a_partition_cuts_only_its_api(
    real_cloud: LocalCloudProcess,
) -> None:
    """`agent-kill`: the agent process gets SIGKILL and is started again (agents.json names the new pid,
    which registers again); `partition`: the host's calls to Berth's API answer 503 until `heal`."""
    from berth_tools.cli.fault_cmd import fault_url, send

    url = fault_url(real_cloud.state_dir)
    # an agent running now (one an earlier test SIGKILLed may be between its death and its restart)
    agent = next(a for a in _agents(real_cloud) if _alive(a["pid"]))
    host, old_pid = agent["host_id"], agent["pid"]
    registered = _registrations(real_cloud, host)
    status, answer = send(url, {"kind": "agent-kill", "host_id": host})
    assert status == 200 and answer["killed_pid"] == old_pid and answer["host_id"] == host, answer
    deadline = time.monotonic() + 60
    while True:
        (now,) = [a for a in _agents(real_cloud) if a["host_id"] == host]
        if now["pid"] != old_pid and _alive(now["pid"]) and _registrations(real_cloud, host) > registered:
            break
        assert time.monotonic() < deadline, (now, registered)
        time.sleep(0.2)
    assert not _alive(old_pid)
    assert b"berth_agent.main" in Path(f"/proc/{now['pid']}/cmdline").read_bytes()
    assert send(url, {"kind": "agent-kill", "host_id": "no-such-host"})[0] == 404

    hosted = real_cloud.client(f"host-{host}")
    assert send(url, {"kind": "partition", "host_id": host})[0] == 200
    try:
        assert hosted.get("/v1/capacity").status == 503
        assert real_cloud.client("alice").get("/v1/capacity").status == 200
    finally:
        assert send(url, {"kind": "heal", "host_id": host})[0] == 200
    assert hosted.get("/v1/capacity").status != 503


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_restarted_agent_kills_what_its_sigkilled_predecessor_left(
    real_cloud: LocalCloudProcess, job_dir: Path
) -> None:
    """(a) with real agents: SIGKILL takes the job's leader (``PR_SET_PDEATHSIG``), not its
    double-forked sleeper; the agent the local cloud starts again on the same work dir (as systemd's
    ``Restart=on-failure`` would) kills the sleeper before it registers, so the job's code never runs
    on beside its retry or another tenant's job."""
    alice = real_cloud.client("alice")
    marker = job_dir / "sleeper"
    spec = _spec(marker, 300)
    spec["command"] = ["python3", "-c", DETACHING_SCRIPT]
    r = alice.post("/v1/jobs", json=spec)
    assert r.status == 201, r.text
    job_id = r.json()["id"]
    sleeper = _sleeper(marker)
    try:
        running = _wait(alice, job_id, ("RUNNING",))
        host = running["placement"]["hosts"][0]["host_id"]
        (agent,) = [a for a in _agents(real_cloud) if a["host_id"] == host]
        # the agent's children: the job's leader and the sleeper it adopted as their subreaper
        deadline = time.monotonic() + 10
        while sleeper not in _children(agent["pid"]):  # its parent exits at once: then it is adopted
            assert time.monotonic() < deadline, "the agent is not the subreaper of the job's sleeper"
            time.sleep(0.05)
        leaders = [pid for pid in _children(agent["pid"]) if pid != sleeper]
        assert leaders
        os.kill(agent["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in leaders):
            assert time.monotonic() < deadline, "the job's leader outlived its agent"
            time.sleep(0.05)
        assert _alive(sleeper)  # what nothing else kills: the old agent is gone
        deadline = time.monotonic() + 60
        while _alive(sleeper):
            assert time.monotonic() < deadline, f"the restarted agent left the sleeper {sleeper} running"
            time.sleep(0.1)
        (restarted,) = [a for a in _agents(real_cloud) if a["host_id"] == host]
        assert restarted["pid"] != agent["pid"] and _alive(restarted["pid"]), restarted
    finally:
        alice.post(f"/v1/jobs/{job_id}/cancel")
        if _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)
