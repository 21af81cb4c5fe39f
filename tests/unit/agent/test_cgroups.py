"""Job cgroups (cgroup v2) against a fake cgroupfs in a tmp dir, with real job processes.

A tmp dir stands in for /sys/fs/cgroup: the tests create the interface files the kernel would
(``cgroup.controllers``, ``cgroup.procs``, ...), so what is checked is what the agent writes and
reads there, and that the job's process joins its cgroup before it execs (it writes ``0`` into
``cgroup.procs``). Membership itself (which pids the kernel lists) is simulated where a test needs
it. ``test_this_host`` records what the machine running the tests allows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from berth_agent import cgroups
from berth_agent.cgroups import JobCgroup, JobCgroups, detect
from berth_agent.executors import FailureKind, Launch, Limits, ProcessExecutor, UidPool
from berth_agent.ledger import AttemptEntry, AttemptLedger


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, stream: str, line: str) -> None:
        self.lines.append((stream, line))

    def of(self, stream: str) -> list[str]:
        return [line for s, line in self.lines if s == stream]


def _fake_fs(tmp_path: Path, controllers: str = "cpu memory pids io", procs: str = "4242\n") -> Path:
    fs = tmp_path / "cgroupfs"
    root = fs / "system.slice" / "berth-agent.service"
    root.mkdir(parents=True)
    (fs / "cgroup.controllers").write_text("cpu memory pids io\n")
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text(procs)
    (tmp_path / "self_cgroup").write_text("0::/system.slice/berth-agent.service\n")
    return fs


class FakeKernelJobCgroup(JobCgroup):
    def remove(self, timeout_s: float = 5.0) -> None:
        self.kill()
        for f in self.path.iterdir():  # the kernel's interface files go with the directory
            f.unlink()
        self.path.rmdir()


class FakeKernelCgroups(JobCgroups):
    """``JobCgroups`` over the fake fs: the interface files appear with the directory."""

    def _mkdir(self, path: Path) -> JobCgroup:
        path.mkdir()
        (path / "cgroup.procs").write_text("")
        (path / "memory.swap.max").write_text("max")
        return FakeKernelJobCgroup(path)


def test_detect_sets_up_agent_and_jobs_and_enables_the_controllers(tmp_path: Path) -> None:
    fs = _fake_fs(tmp_path)
    job_cgroups, why = detect(fs_root=fs, self_cgroup=tmp_path / "self_cgroup", pid=4242)
    root = fs / "system.slice" / "berth-agent.service"
    assert job_cgroups is not None and job_cgroups.jobs == root / "jobs", why
    assert (root / "agent" / "cgroup.procs").read_text() == "4242"  # the agent moved into a leaf
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (root / "jobs" / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert "jobs" in why


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("v1", "no cgroup v2 hierarchy"),
        ("no-memory", "not delegated"),
        ("read-only", "not writable"),
        ("not-a-group", "not a cgroup v2 group"),
    ],
)
def test_detect_falls_back_with_a_reason(tmp_path: Path, setup: str, reason: str) -> None:
    fs = _fake_fs(tmp_path, controllers="cpu pids" if setup == "no-memory" else "cpu memory pids")
    root = fs / "system.slice" / "berth-agent.service"
    if setup == "v1":
        (fs / "cgroup.controllers").unlink()
    if setup == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes read-only files")
        (root / "cgroup.subtree_control").chmod(0o444)
    if setup == "not-a-group":
        (tmp_path / "self_cgroup").write_text("0::/elsewhere\n")
    job_cgroups, why = detect(fs_root=fs, self_cgroup=tmp_path / "self_cgroup")
    assert job_cgroups is None and reason in why


def test_create_writes_the_limits(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    cg = FakeKernelCgroups(jobs, frozenset({"cpu", "memory", "pids"})).create(
        "berth-j-1-1", memory_gib=4, cpus=1.5
    )
    assert (cg.path / "memory.max").read_text() == str(4 * 1024**3)
    assert (cg.path / "memory.swap.max").read_text() == "0"
    assert (cg.path / "cpu.max").read_text() == "150000 100000"
    assert (cg.path / "pids.max").read_text() == "32768"
    unlimited = FakeKernelCgroups(jobs, frozenset({"cpu", "memory"})).create(
        "berth-j-2-1", memory_gib=None, cpus=None
    )
    assert (unlimited.path / "memory.max").read_text() == "max"
    assert (unlimited.path / "cpu.max").read_text() == "max 100000"
    assert not (unlimited.path / "pids.max").exists()


def _executor(tmp_path: Path, uids: UidPool | None = None) -> tuple[ProcessExecutor, Path]:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    return ProcessExecutor(uids=uids, cgroups=FakeKernelCgroups(jobs, frozenset({"cpu", "memory"}))), jobs


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def test_the_job_joins_its_cgroup_before_it_runs_and_it_is_removed_after(tmp_path: Path) -> None:
    ex, jobs = _executor(tmp_path)
    seen = tmp_path / "seen"
    cg = jobs / "berth-j-1-1"
    script = f"cat {cg}/cgroup.procs > {seen}; echo >> {seen}; cat {cg}/memory.max >> {seen}"
    launch = Launch("j-1", 1, "t", ("/bin/sh", "-c", script), _workdir(tmp_path), limits=Limits(memory_gib=2))
    result = ex.start(launch, Lines()).wait(10)
    assert result is not None and result.succeeded, result
    assert seen.read_text().split() == ["0", str(2 * 1024**3)]  # it wrote itself in before exec
    assert list(jobs.iterdir()) == []  # removed with the job


def test_what_escaped_the_process_group_is_killed_with_the_cgroup(tmp_path: Path) -> None:
    ex, jobs = _executor(tmp_path)
    procs = jobs / "berth-j-1-1" / "cgroup.procs"
    # the escapee calls setsid (a new process group); the kernel would list it in cgroup.procs: here
    # the job writes its pid there itself
    script = f"setsid sleep 60 & echo $! >> {procs}; echo $!"
    out = Lines()
    result = ex.start(Launch("j-1", 1, "t", ("/bin/sh", "-c", script), _workdir(tmp_path)), out).wait(10)
    assert result is not None and result.succeeded
    escapee = int(out.of("stdout")[0])
    # no wait: the run has a result (and its GPUs may go) only once its cgroup is empty
    assert not _running(escapee), f"the escapee {escapee} still runs"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_oom_kill_in_the_cgroup_is_reported_as_oom(tmp_path: Path) -> None:
    ex, jobs = _executor(tmp_path)
    events = jobs / "berth-j-1-1" / "memory.events"
    script = f"printf 'oom 1\\noom_kill 1\\n' > {events}; exit 137"  # what the kernel would record
    result = ex.start(Launch("j-1", 1, "t", ("/bin/sh", "-c", script), _workdir(tmp_path)), Lines()).wait(10)
    assert result is not None and result.failure is FailureKind.OOM and "memory.max" in result.message


def test_a_refused_cgroup_falls_back_to_rlimits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    jobs = tmp_path / "missing"  # mkdir fails: the job still runs
    ex = ProcessExecutor(cgroups=JobCgroups(jobs / "nope", frozenset({"cpu", "memory"})))
    result = ex.start(Launch("j-1", 1, "t", ("true",), _workdir(tmp_path)), Lines()).wait(10)
    assert result is not None and result.succeeded
    assert "job cgroup not created; rlimits only" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="per-job uids need root")
def test_with_a_job_uid_it_joins_first_then_drops_to_the_uid(tmp_path: Path) -> None:
    tmp_path.chmod(0o711)
    ex, _ = _executor(tmp_path, uids=UidPool(range(3_000_200, 3_000_201)))
    work = _workdir(tmp_path)
    out = Lines()
    result = ex.start(Launch("j-1", 1, "t", ("/bin/sh", "-c", "id -u; id -g; id -G"), work), out).wait(10)
    assert result is not None and result.succeeded, out.lines
    assert out.of("stdout") == ["3000200", "3000200", "3000200"]


def test_leftover_job_cgroups_are_killed_at_start(tmp_path: Path) -> None:
    fs = _fake_fs(tmp_path)
    jobs = fs / "system.slice" / "berth-agent.service" / "jobs"
    left = jobs / "berth-j-old-1"
    left.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (left / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    detect(fs_root=fs, self_cgroup=tmp_path / "self_cgroup", pid=4242)
    assert sleeper.wait(5) == -9


def test_this_host() -> None:
    """What the machine running the tests allows (recorded in the helper's notes)."""
    job_cgroups, why = detect()
    print(f"cgroups on this host: {why}", file=sys.stderr)
    assert why
    if not (cgroups.FS_ROOT / "cgroup.controllers").is_file():
        assert job_cgroups is None and "no cgroup v2 hierarchy" in why


def test_a_restarted_agent_kills_what_is_left_in_a_recorded_cgroup(tmp_path: Path) -> None:
    cg = tmp_path / "jobs" / "berth-j-1-1"
    cg.mkdir(parents=True)
    (cg / "cgroup.kill").write_text("")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # setsid'd, no marker
    try:
        (cg / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        ledger = AttemptLedger(tmp_path / "work")
        ledger.record(AttemptEntry("j-1", 1, "tok", "process", "berth-j-1-1", cgroup=str(cg)))
        (left,) = ledger.leftovers()
        assert ledger.reap(left, timeout_s=10)
        assert sleeper.wait(5) == -9 and (cg / "cgroup.kill").read_text() == "1"
    finally:
        sleeper.kill()


def test_the_ledger_records_the_runs_cgroup(tmp_path: Path) -> None:
    ex, jobs = _executor(tmp_path)
    launch = Launch("j-1", 1, "t", ("sleep", "60"), _workdir(tmp_path))
    handle = ex.start(launch, Lines())
    try:
        assert handle.cgroup_path == str(jobs / "berth-j-1-1")
        ledger = AttemptLedger(tmp_path / "ledger")
        entry = ledger.started(
            AttemptEntry("j-1", 1, "tok", "process", "n"), handle.pid or 0, handle.cgroup_path
        )
        assert ledger.entries() == [entry] and entry.cgroup == handle.cgroup_path
    finally:
        handle.cancel(0)
        assert handle.wait(10) is not None
