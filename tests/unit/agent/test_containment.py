"""Containment (process-group mode): an attempt's processes found through /proc, all of them ended.

Real processes where the kernel's behaviour is the point (setsid, double fork, the subreaper); a
fake /proc in a tmp dir where the point is which process counts as the attempt's (recycled pids).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from berth_agent import containment, executors
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.containment import (
    ATTEMPT_KEY_ENV,
    ProcTable,
    TreeScope,
    empty_out,
    new_attempt_key,
)
from berth_agent.executors import Launch, ProcessExecutor
from tests.unit.agent.jobprocs import alive, escapers_argv, kill_all, read_pids


def _fake_proc(
    root: Path, pid: int, *, ppid: int, pgid: int, ticks: int, env: str = "", state: str = "S"
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    rest = [state, str(ppid), str(pgid), str(pgid)] + ["0"] * 15 + [str(ticks)]
    (d / "stat").write_text(f"{pid} (job) " + " ".join(rest) + "\n")
    (d / "environ").write_bytes(env.encode().replace(b";", b"\0"))


def test_marker_group_and_descendants_count_a_recycled_group_does_not(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    key = "j-1:1:abc"
    _fake_proc(proc, 100, ppid=1, pgid=100, ticks=500)  # the leader
    _fake_proc(proc, 101, ppid=100, pgid=100, ticks=510)  # in its group
    _fake_proc(proc, 200, ppid=1, pgid=200, ticks=520, env=f"PATH=/bin;{ATTEMPT_KEY_ENV}={key}")  # setsid
    _fake_proc(proc, 201, ppid=200, pgid=201, ticks=530)  # a child of the detached one, env cleared
    _fake_proc(proc, 300, ppid=1, pgid=300, ticks=540, env=f"{ATTEMPT_KEY_ENV}=j-1:1:other")  # another run
    _fake_proc(proc, 301, ppid=1, pgid=301, ticks=540, state="Z")  # a zombie is nobody's member
    scope = TreeScope(pgid=100, key=key, leader_ticks=500, proc=ProcTable(proc))
    assert scope.members() == [100, 101, 200, 201]
    # the pid 100 recycled by another process (start time differs): its group is not the attempt's
    recycled = TreeScope(pgid=100, key=None, leader_ticks=499, proc=ProcTable(proc))
    assert recycled.members() == []


def test_once_seen_a_process_stays_a_member_while_it_is_the_same_process(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_proc(proc, 100, ppid=1, pgid=100, ticks=500)
    _fake_proc(proc, 101, ppid=100, pgid=100, ticks=510)
    scope = TreeScope(pgid=100, key=None, leader_ticks=500, proc=ProcTable(proc))
    assert scope.members() == [100, 101]
    for pid in ("100", "101"):  # the leader ends; 101 leaves the group and the tree
        for f in (proc / pid).iterdir():
            f.unlink()
        (proc / pid).rmdir()
    _fake_proc(proc, 101, ppid=1, pgid=101, ticks=510)
    _fake_proc(proc, 102, ppid=1, pgid=102, ticks=600)
    assert scope.members() == [101]


def test_empty_out_gives_up_after_its_timeout_when_something_survives() -> None:
    class Undying:
        def __init__(self) -> None:
            self.signals: list[int] = []

        def members(self) -> list[int]:
            return [4242]

        def signal(self, sig: int) -> None:
            self.signals.append(sig)

    scope = Undying()
    assert empty_out(scope, timeout_s=0.2, poll_s=0.01) is False
    assert scope.signals and set(scope.signals) == {9}


def test_a_double_forked_daemon_is_found_by_its_marker_and_killed(tmp_path: Path) -> None:
    key = new_attempt_key("j-1", 1)
    leader = subprocess.Popen(
        escapers_argv(tmp_path / "marks"),
        env={**os.environ, ATTEMPT_KEY_ENV: key},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    pids = read_pids(tmp_path / "marks")
    try:
        scope = TreeScope(pgid=leader.pid, key=key, owned=[leader.pid])
        assert set(pids.values()) | {leader.pid} <= set(scope.members())
        assert empty_out(scope, timeout_s=10)
        assert not any(alive(p) for p in pids.values()) and leader.wait(5) == -9
    finally:
        kill_all([leader.pid, *pids.values()])


SUBREAPER = r"""
import os, sys, time
from berth_agent.containment import become_subreaper
assert become_subreaper() is None
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode()); time.sleep(30); os._exit(0)
    os._exit(0)
grandchild = int(os.read(r, 32))
deadline = time.monotonic() + 10
while True:  # its parent exited: the grandchild re-parents to us, not to init
    ppid = int(open(f"/proc/{grandchild}/stat").read().rpartition(")")[2].split()[1])
    if ppid == os.getpid() or time.monotonic() > deadline:
        break
    time.sleep(0.02)
os.kill(grandchild, 9)
print(ppid == os.getpid())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux")
def test_the_agent_becomes_the_subreaper_of_detached_descendants() -> None:
    out = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_on_a_normal_end_the_runs_escapers_die_before_its_result(tmp_path: Path) -> None:
    """(c) the leader exits 0 while its child, a setsid'd grandchild and a double-forked daemon
    sleep on: by the time the run has a result, none of them runs."""
    work = tmp_path / "work"
    work.mkdir()
    launch = Launch(
        "j-1",
        1,
        "t",
        escapers_argv(tmp_path / "marks"),
        work,
        env={"LEADER_S": "0.2"},
        attempt_key=new_attempt_key("j-1", 1),
    )
    handle = ProcessExecutor().start(launch, lambda s, line: None)
    pids = read_pids(tmp_path / "marks")
    try:
        result = handle.wait(30)
        assert result is not None and result.succeeded, result
        assert [n for n, p in pids.items() if alive(p)] == []  # no wait: gone before the result
    finally:
        kill_all(pids)


def test_on_cancel_the_runs_escapers_die_before_its_result(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    launch = Launch(
        "j-1", 1, "t", escapers_argv(tmp_path / "marks"), work, attempt_key=new_attempt_key("j-1", 1)
    )
    handle = ProcessExecutor().start(launch, lambda s, line: None)
    pids = read_pids(tmp_path / "marks")
    try:
        handle.cancel(0.5)
        result = handle.wait(30)
        assert result is not None and result.failure is not None and result.failure.value == "canceled"
        assert [n for n, p in pids.items() if alive(p)] == []
    finally:
        kill_all(pids)


def test_the_job_sees_its_marker(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    key = new_attempt_key("j-1", 1)
    lines: list[str] = []
    launch = Launch("j-1", 1, "t", ("/bin/sh", "-c", f"echo ${ATTEMPT_KEY_ENV}"), work, attempt_key=key)
    result = ProcessExecutor().start(launch, lambda s, line: lines.append(line)).wait(10)
    assert result is not None and result.succeeded and lines == [key]


@pytest.mark.parametrize(
    ("refused", "says"), [(None, "the agent is their child subreaper"), ("EPERM", "EPERM")]
)
def test_without_job_cgroups_the_agent_says_so_once_and_becomes_the_subreaper(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refused: str | None,
    says: str,
) -> None:
    calls: list[int] = []

    def subreaper() -> str | None:
        calls.append(1)
        return refused

    monkeypatch.setattr(containment, "become_subreaper", subreaper)
    cfg = AgentConfig(
        api_url="http://x", pool="p", host_id="h", work_dir=tmp_path, limits=JobLimits(cgroups=False)
    )
    with caplog.at_level(logging.INFO):
        executor = executors.for_config(cfg)
    assert executor.containment == "process-group" and calls == [1]
    (line,) = [r.getMessage() for r in caplog.records if "containment:" in r.getMessage()]
    assert "process-group" in line and "off in the config" in line and says in line


STRAYS_SCRIPT = r"""
import os, subprocess, time
from berth_agent.containment import LEADERS, ProcTable, StrayReaper, become_subreaper
assert become_subreaper() is None
r, w = os.pipe()
mid = os.fork()
if mid == 0:                  # a job's detached helper: setsid, double fork, ends at once
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode()); os._exit(0)
    os._exit(0)
os.waitpid(mid, 0)            # (the job's own process waits on its child)
stray = int(os.read(r, 32))
leader = subprocess.Popen(["false"], start_new_session=True)  # a run's leader: subprocess's
LEADERS.add(leader.pid)
helper = subprocess.Popen(["sh", "-c", "exit 3"])              # the agent's own helper
table = ProcTable()
def zombie(pid):
    p = table.stat(pid)
    return p is not None and p.zombie
deadline = time.monotonic() + 10
while not all(zombie(p) for p in (stray, leader.pid, helper.pid)):
    assert time.monotonic() < deadline
    time.sleep(0.02)
now = [0.0]
reaper = StrayReaper(clock=lambda: now[0])
assert reaper.sweep() == []   # not a subreaper (in this reaper's eyes): nothing, not even a look
reaper.enabled = True
first = reaper.sweep()        # seen once: not yet
now[0] += 0.5
early = reaper.sweep()        # within SCAN_S: no sweep at all
now[0] += 1.0
second = reaper.sweep()
print(first, early, second == [stray], table.stat(stray) is None, leader.wait(), helper.wait())
"""


def test_a_stray_zombie_the_agent_adopted_is_reaped_its_own_children_never() -> None:
    out = subprocess.run([sys.executable, "-c", STRAYS_SCRIPT], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    # subprocess still gets its children's real exit codes: neither was reaped behind its back
    assert out.stdout.split() == ["[]", "[]", "True", "True", "1", "3"]
