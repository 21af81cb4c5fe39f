"""Real job processes that try to outlive their job: a child in the group, a setsid'd grandchild,
a double-forked daemon. Each writes its pid to a file, so a test knows whom to look for."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

#: ``python -c`` body: fork ``child`` (same group) which forks ``grandchild`` (setsid: its own
#: session and group), then ``detached`` (double fork + setsid, its parent exits at once); every
#: one writes its pid to ``<dir>/<name>`` and sleeps; the leader then waits for the file ``RELEASE``
#: (env, if set), sleeps ``LEADER_S`` (env) and exits 0.
ESCAPERS = r"""
import os, sys, time
d = sys.argv[1]
def mark(name):
    with open(os.path.join(d, name + ".tmp"), "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
def sleep_forever():
    while True:
        time.sleep(60)
if os.fork() == 0:            # child: same process group
    if os.fork() == 0:        # grandchild: a session of its own
        os.setsid(); mark("grandchild"); sleep_forever()
    mark("child"); sleep_forever()
pid = os.fork()
if pid == 0:                  # a daemon: double fork, its parent gone at once
    os.setsid()
    if os.fork() == 0:
        mark("detached"); sleep_forever()
    os._exit(0)
os.waitpid(pid, 0)
while not all(os.path.exists(os.path.join(d, n)) for n in ("child", "grandchild", "detached")):
    time.sleep(0.02)
print("escapers ready", flush=True)
release = os.environ.get("RELEASE")
while release and not os.path.exists(release):
    time.sleep(0.02)
time.sleep(float(os.environ.get("LEADER_S", "60")))
"""
NAMES = ("child", "grandchild", "detached")


def escapers_argv(marks: Path) -> tuple[str, ...]:
    marks.mkdir(parents=True, exist_ok=True)
    return (sys.executable, "-c", ESCAPERS, str(marks))


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_for(condition: object, timeout_s: float = 10.0, what: str = "") -> None:
    """Poll ``condition()`` until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


def read_pids(marks: Path, timeout_s: float = 10.0) -> dict[str, int]:
    wait_for(lambda: all((marks / n).exists() for n in NAMES), timeout_s, "the escapers' pid files")
    return {n: int((marks / n).read_text()) for n in NAMES}


def kill_all(pids: dict[str, int] | list[int]) -> None:
    """Test cleanup: whatever is still running of them goes."""
    for pid in pids.values() if isinstance(pids, dict) else pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
