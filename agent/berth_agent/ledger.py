"""The attempts this host is running, on disk, so that a restarted agent knows what it left behind.

Before an attempt starts, the daemon ``record``s it (job, attempt, fencing token, executor, run
name, and its marker ``BERTH_ATTEMPT_KEY``: berth_agent.containment) and, once started, its process
group (the leader's pid) with the kernel's start time of the leader and its cgroup, if any; it
``remove``s the entry after the final report. Each entry is one JSON file written atomically
(temporary file, fsync, rename) under ``<work_dir>/.attempts/``.

After a restart, ``leftovers()`` lists what is still recorded, each with whether its process group
leader is still the same process (pid and start time from ``/proc/<pid>/stat``, so a recycled pid
is never mistaken for the job). A process job cannot be re-adopted: its output pipes died with the
old agent (and the kernel killed its leader: ``PR_SET_PDEATHSIG``). ``reap`` kills everything
left of it, leader or not: its cgroup, its process group, every process carrying its marker and
their descendants, and waits until none is left (``containment.empty_out``; False when some
survive, and the daemon then offers no GPU); and ``<runtime> rm -f`` for a container, through
the given runner. The daemon then reports the attempt failed (``agent_error``, "lost on agent
restart") with its fencing token; the control plane then retries it elsewhere or here, as a new
attempt with a new token, so an attempt never runs twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from berth_agent.cgroups import JobCgroup
from berth_agent.containment import CgroupScope, ProcTable, Scope, Scopes, TreeScope, empty_out
from berth_agent.staging import safe_join


def process_start_ticks(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), or None if it is gone."""
    try:
        raw = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True, slots=True)
class AttemptEntry:
    job_id: str
    attempt: int
    fencing_token: str
    executor: str
    run_name: str
    pid: int | None = None
    """The run's leader, which leads its own process group (pgid = pid)."""
    start_ticks: int | None = None
    attempt_key: str | None = None
    """The marker every process of the run inherits (``BERTH_ATTEMPT_KEY``)."""
    cgroup: str | None = None

    @property
    def file_name(self) -> str:
        return f"{self.job_id}-{self.attempt}.json"


@dataclass(frozen=True, slots=True)
class Leftover:
    entry: AttemptEntry
    alive: bool


class AttemptLedger:
    def __init__(self, work_dir: Path, proc_root: Path = Path("/proc")) -> None:
        self.dir = work_dir / ".attempts"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._proc = proc_root
        self._table = ProcTable(proc_root)

    def _write(self, entry: AttemptEntry) -> None:
        target = safe_join(self.dir, entry.file_name)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(asdict(entry), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dfd = os.open(self.dir, os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def record(self, entry: AttemptEntry) -> None:
        self._write(entry)

    def started(self, entry: AttemptEntry, pid: int, cgroup: str | None = None) -> AttemptEntry:
        updated = replace(entry, pid=pid, start_ticks=process_start_ticks(pid, self._proc), cgroup=cgroup)
        self._write(updated)
        return updated

    def remove(self, entry: AttemptEntry) -> None:
        safe_join(self.dir, entry.file_name).unlink(missing_ok=True)

    def entries(self) -> list[AttemptEntry]:
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                out.append(AttemptEntry(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)  # a torn or foreign file: nothing can be done with it
        return out

    def alive(self, entry: AttemptEntry) -> bool:
        if entry.pid is None or entry.start_ticks is None:
            return False
        return process_start_ticks(entry.pid, self._proc) == entry.start_ticks

    def leftovers(self) -> list[Leftover]:
        return [Leftover(e, self.alive(e)) for e in self.entries()]

    def scope(self, entry: AttemptEntry) -> Scope:
        """Every process of the recorded run, found again by a restarted agent."""
        scopes: list[Scope] = [
            TreeScope(pgid=entry.pid, key=entry.attempt_key, leader_ticks=entry.start_ticks, proc=self._table)
        ]
        if entry.cgroup is not None:
            scopes.append(CgroupScope(JobCgroup(Path(entry.cgroup)), self._table))
        return Scopes(scopes)

    def reap(
        self,
        leftover: Leftover,
        run: Callable[[list[str]], object] | None = None,
        timeout_s: float = 10.0,
    ) -> bool:
        """Kill what is left of a lost attempt (every process of its run, its container when it had
        one); True once nothing of it is left, False when something survived ``timeout_s``."""
        e = leftover.entry
        if leftover.alive and e.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(e.pid, signal.SIGKILL)
        if e.executor in ("docker", "podman") and run is not None:
            run([e.executor, "rm", "-f", e.run_name])
        return empty_out(self.scope(e), timeout_s=timeout_s, what=e.file_name)
