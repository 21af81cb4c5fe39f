"""Containment: finding every process of one attempt, and ending all of them before its GPUs go.

Two modes (``Mode``), chosen once at start (``berth_agent.executors.for_config``) and reported in
the register inventory:

- ``cgroup-v2``: the attempt's own cgroup (``berth_agent.cgroups``): its members are what the
  kernel lists in ``cgroup.procs``, whatever they did (``setsid``, double fork, a cleared
  environment); ``cgroup.kill`` ends them (``CgroupScope``).
- ``process-group`` (no delegated cgroup v2: cgroup v1/hybrid hosts): the agent is a child
  subreaper (``become_subreaper``: a detached descendant re-parents to the agent rather than to
  init), and an attempt's members (``TreeScope``) are the processes that

  1. are in its process group (the leader's pid; a recycled pid is told apart by its start time),
  2. or carry its marker ``BERTH_ATTEMPT_KEY=<job>:<attempt>:<nonce>`` in their initial
     environment (``/proc/<pid>/environ``: inherited through ``setsid`` and any fork),
  3. or descend (parent pid) from a member,
  4. or were seen as a member once and are still that process (pid and start time).

``empty_out(scope)`` SIGKILLs every member, waits and looks again until none is left: a run's end,
a cancel and a restarted agent's reaping all go through it, and the attempt's GPUs are freed only
after it returned. Zombies the agent adopted are reaped on the way, and ``STRAYS`` reaps those of
detached processes that ended before any lookup saw them (never a run's leader: ``LEADERS``,
which ``subprocess`` waits on itself).

What the process-group mode cannot see: a process that clears its environment and leaves the
group and the parent chain before a scan saw it (scans run every ``SCAN_S`` while the attempt runs).
docs/security.md says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from berth_agent.cgroups import JobCgroup

log = logging.getLogger(__name__)

ATTEMPT_KEY_ENV = "BERTH_ATTEMPT_KEY"
PROC = Path("/proc")
#: How often a running attempt's processes are looked up (process-group mode).
SCAN_S = 1.0
_PR_SET_CHILD_SUBREAPER = 36


class Mode(StrEnum):
    CGROUP_V2 = "cgroup-v2"
    PROCESS_GROUP = "process-group"
    CONTAINER = "container"
    KUBERNETES = "kubernetes"


def new_attempt_key(job_id: str, attempt: int) -> str:
    """The marker of one run of one attempt (the nonce tells two runs of the same attempt apart)."""
    return f"{job_id}:{attempt}:{secrets.token_hex(8)}"


def become_subreaper() -> str | None:
    """Make this process the child subreaper of its descendants; None, or why it could not."""
    if not sys.platform.startswith("linux"):
        return f"no child subreaper on {sys.platform}"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl unavailable: {exc}"
    STRAYS.enabled = True
    return None


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start_ticks: int
    zombie: bool


class ProcTable:
    """The host's processes, read from ``/proc`` (a tmp dir in tests)."""

    def __init__(self, root: Path = PROC) -> None:
        self.root = root

    def stat(self, pid: int) -> Proc | None:
        try:
            raw = (self.root / str(pid) / "stat").read_text()
        except (OSError, ValueError):
            return None
        fields = raw.rpartition(")")[2].split()
        if len(fields) < 20:
            return None
        return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19]), fields[0] in ("Z", "X"))

    def start_ticks(self, pid: int) -> int | None:
        p = self.stat(pid)
        return None if p is None else p.start_ticks

    def all(self) -> dict[int, Proc]:
        out = {}
        for entry in self.root.iterdir():
            if entry.name.isdigit() and (p := self.stat(int(entry.name))) is not None:
                out[p.pid] = p
        return out

    def has_marker(self, pid: int, key: str) -> bool:
        try:
            raw = (self.root / str(pid) / "environ").read_bytes()
        except OSError:
            return False
        return f"{ATTEMPT_KEY_ENV}={key}".encode() in raw.split(b"\0")


class Scope(Protocol):
    """The processes of one attempt."""

    def members(self) -> list[int]:
        """The live (not zombie) processes of the attempt, as of now."""
        ...

    def signal(self, sig: int) -> None: ...


class CgroupScope:
    """The attempt's cgroup: the kernel keeps the list."""

    def __init__(self, cgroup: JobCgroup, proc: ProcTable | None = None) -> None:
        self.cgroup, self._proc = cgroup, proc or ProcTable()

    def members(self) -> list[int]:
        out = []
        for pid in self.cgroup.pids():
            p = self._proc.stat(pid)
            if p is not None and not p.zombie:
                out.append(pid)
        return out

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.cgroup.kill()
            return
        _send(self.members(), sig)


class TreeScope:
    """The attempt's processes found through ``/proc`` (process-group mode; see the module doc).

    ``pgid``/``leader_ticks``: the group and its leader's start time (None: unknown); ``key``: the
    marker; ``reap``: wait on the zombies among them that this process adopted as their subreaper,
    except ``owned``, those ``subprocess`` waits on itself (the leader). A restarted agent does not
    reap: it is nobody's parent, and its own children are no business of the scope."""

    def __init__(
        self,
        *,
        pgid: int | None,
        key: str | None,
        leader_ticks: int | None = None,
        reap: bool = False,
        owned: Iterable[int] = (),
        proc: ProcTable | None = None,
    ) -> None:
        self._reap = reap
        self.pgid, self.key, self.leader_ticks = pgid, key, leader_ticks
        self._owned = frozenset(owned)
        self._proc = proc or ProcTable()
        self._seen: dict[int, int] = {}  # pid -> start ticks
        self._me = os.getpid()

    def _group_is_ours(self, table: dict[int, Proc]) -> bool:
        if self.pgid is None:
            return False
        leader = table.get(self.pgid)
        return leader is None or self.leader_ticks is None or leader.start_ticks == self.leader_ticks

    def _matches(self, p: Proc, group_ours: bool) -> bool:
        if p.pid == self._me:
            return False
        if self._seen.get(p.pid) == p.start_ticks:
            return True
        if group_ours and p.pgid == self.pgid:
            return True
        if self.key is None or p.zombie:
            return False
        if self.leader_ticks is not None and p.start_ticks < self.leader_ticks:
            return False  # older than the run: it cannot carry the run's marker (skips most reads)
        return self._proc.has_marker(p.pid, self.key)

    def observe(self) -> list[int]:
        """Look the attempt's processes up now; remembers them, reaps its adopted zombies."""
        table = self._proc.all()
        group_ours = self._group_is_ours(table)
        found = {p.pid for p in table.values() if self._matches(p, group_ours)}
        children: dict[int, list[int]] = {}
        for p in table.values():
            children.setdefault(p.ppid, []).append(p.pid)
        todo = list(found)
        while todo:  # descendants of members are members
            for child in children.get(todo.pop(), []):
                if child not in found and child != self._me:
                    found.add(child)
                    todo.append(child)
        live = []
        for pid in sorted(found):
            p = table[pid]
            self._seen[pid] = p.start_ticks
            if not p.zombie:
                live.append(pid)
            elif self._reap and p.ppid == self._me and pid not in self._owned and pid not in LEADERS:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        return live

    def members(self) -> list[int]:
        return self.observe()

    def signal(self, sig: int) -> None:
        _send(self.members(), sig)


class _Leaders:
    """The runs' leaders this process started: ``subprocess`` waits on them, nothing else may."""

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._lock = threading.Lock()

    def add(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)

    def discard(self, pid: int) -> None:
        with self._lock:
            self._pids.discard(pid)

    def __contains__(self, pid: object) -> bool:
        with self._lock:
            return pid in self._pids


LEADERS = _Leaders()


class StrayReaper:
    """Waits on the zombies this process adopted as subreaper that no run claimed: a detached
    process that ended before any lookup saw it. A zombie child counts as a stray when it is in
    another process group than this process (so not a helper ``subprocess`` of the agent's own),
    is no run's leader (``LEADERS``), and was already one at the previous sweep, at least
    ``SCAN_S`` before (a leader is registered microseconds after its start)."""

    def __init__(self, proc: ProcTable | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._proc, self._clock = proc or ProcTable(), clock
        self._last: dict[int, int] = {}
        self._next = 0.0
        self._lock = threading.Lock()
        #: Only a subreaper adopts strays (``become_subreaper`` turns it on).
        self.enabled = False

    def sweep(self) -> list[int]:
        """Reap the strays seen twice; returns their pids (at most once per ``SCAN_S``)."""
        with self._lock:
            now = self._clock()
            if not self.enabled or now < self._next:
                return []
            self._next = now + SCAN_S
            me, my_group = os.getpid(), os.getpgid(0)
            zombies = {
                p.pid: p.start_ticks
                for p in self._proc.all().values()
                if p.zombie and p.ppid == me and p.pgid != my_group and p.pid not in LEADERS
            }
            reaped = []
            for pid, ticks in zombies.items():
                if self._last.get(pid) == ticks:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                        reaped.append(pid)
            self._last = {pid: t for pid, t in zombies.items() if pid not in reaped}
            return reaped


STRAYS = StrayReaper()


class Scopes:
    """Several views of one attempt (a restarted agent: its cgroup and its tree)."""

    def __init__(self, scopes: Iterable[Scope]) -> None:
        self._scopes = list(scopes)

    def members(self) -> list[int]:
        return sorted({pid for s in self._scopes for pid in s.members()})

    def signal(self, sig: int) -> None:
        for s in self._scopes:
            s.signal(sig)


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def empty_out(
    scope: Scope,
    *,
    timeout_s: float | None = None,
    poll_s: float = 0.05,
    warn_every_s: float = 10.0,
    what: str = "",
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """SIGKILL every member of ``scope``, wait, look again, until none is left (True), or until
    ``timeout_s`` (False; None: no end, a warning every ``warn_every_s``)."""
    start = next_warn = clock()
    while True:
        left = scope.members()
        if not left:
            return True
        now = clock()
        if timeout_s is not None and now - start >= timeout_s:
            log.error("processes of an attempt survive SIGKILL", extra={"attempt": what, "pids": left})
            return False
        if now >= next_warn + warn_every_s:
            next_warn = now
            log.warning("still killing an attempt's processes", extra={"attempt": what, "pids": left})
        scope.signal(signal.SIGKILL)
        time.sleep(poll_s)
