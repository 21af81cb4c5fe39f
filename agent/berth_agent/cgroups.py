"""cgroup v2 CPU and memory limits for process jobs, where the host delegates a cgroup to the agent.

``detect(configured_root)`` looks for a writable cgroup v2 subtree with the ``memory`` and ``cpu``
controllers: the configured one, or the agent's own cgroup (``/proc/self/cgroup``, under systemd
with ``Delegate=``). Under it the agent keeps two children, as cgroup v2's "no internal processes"
rule requires::

    <root>/agent/        the agent itself (moved there when it sat in <root>)
    <root>/jobs/<name>/  one per running job: memory.max, memory.swap.max, cpu.max, pids.max

and turns the controllers on for both levels. A job's child is created before the job starts; the
job's process writes itself into its ``cgroup.procs`` before it execs (``ProcessRun``), so
everything it ever forks (even after ``setsid``) is inside, and ``kill()`` stops all of it through
``cgroup.kill`` (or each pid on kernels before 5.14). ``memory.events`` tells an OOM kill apart.

Where none is usable (cgroup v1 or hybrid host, controllers not delegated, read-only), ``detect``
returns None and the reason, which the agent logs once: jobs then get rlimits only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FS_ROOT = Path("/sys/fs/cgroup")
REQUIRED = ("memory", "cpu")
CPU_PERIOD_US = 100_000


def _read(path: Path) -> str:
    return path.read_text().strip()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def own_cgroup(self_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup v2 path (the ``0::`` line), or None."""
    try:
        for line in self_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        return None
    return None


@dataclass(frozen=True, slots=True)
class JobCgroup:
    path: Path

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        """The processes in the cgroup (never 0 or the agent itself, whatever the file says)."""
        try:
            pids = [int(p) for p in _read(self.procs).split()]
        except (OSError, ValueError):
            return []
        return [p for p in pids if p > 0 and p != os.getpid()]

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer acted in this cgroup (``memory.events`` ``oom_kill``)."""
        try:
            for line in _read(self.path / "memory.events").splitlines():
                name, _, count = line.partition(" ")
                if name == "oom_kill" and int(count) > 0:
                    return True
        except (OSError, ValueError):
            return False
        return False

    def kill(self) -> None:
        """SIGKILL everything in the cgroup (what escaped the process group too)."""
        kill_file = self.path / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left and remove the cgroup (the kernel refuses while a process is in it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.kill()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    log.warning("job cgroup not removed", extra={"cgroup": str(self.path), "error": str(exc)})
                    return
                time.sleep(0.05)


class JobCgroups:
    """The delegated ``<root>/jobs`` directory: one child cgroup per job."""

    def __init__(self, jobs: Path, controllers: frozenset[str]) -> None:
        self.jobs, self.controllers = jobs, controllers

    def create(self, name: str, *, memory_gib: float | None, cpus: float | None) -> JobCgroup:
        """A cgroup for job ``name`` with its limits (None: no limit); raises OSError when the kernel
        refuses. The job's process moves itself in before it drops to its own uid (a move needs
        write access to the common ancestor's ``cgroup.procs``, which only the agent has)."""
        cg = self._mkdir(self.jobs / name)
        path = cg.path
        try:
            memory = "max" if memory_gib is None else str(int(memory_gib * 1024**3))
            _write(path / "memory.max", memory)
            if (path / "memory.swap.max").exists():
                _write(path / "memory.swap.max", "0")  # the limit is RAM, not RAM plus swap
            quota = "max" if cpus is None else str(max(1000, int(cpus * CPU_PERIOD_US)))
            _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            if "pids" in self.controllers:
                _write(path / "pids.max", "32768")
        except BaseException:
            cg.remove(timeout_s=0)
            raise
        return cg

    def _mkdir(self, path: Path) -> JobCgroup:
        """Create the cgroup (the kernel adds its interface files)."""
        path.mkdir(mode=0o755)
        return JobCgroup(path)


def detect(
    configured: Path | None = None,
    *,
    fs_root: Path = FS_ROOT,
    self_cgroup: Path = Path("/proc/self/cgroup"),
    pid: int | None = None,
) -> tuple[JobCgroups | None, str]:
    """The job cgroups the host allows, or None and why not."""
    if not (fs_root / "cgroup.controllers").is_file():
        return None, f"no cgroup v2 hierarchy at {fs_root} (cgroup v1 or hybrid host)"
    if configured is not None:
        root = configured
    else:
        own = own_cgroup(self_cgroup)
        if own is None:
            return None, "this process is in no cgroup v2 group"
        root = fs_root / own.lstrip("/")
    try:
        available = frozenset(_read(root / "cgroup.controllers").split())
    except OSError as exc:
        return None, f"{root} is not a cgroup v2 group: {exc}"
    missing = [c for c in REQUIRED if c not in available]
    if missing:
        return None, f"controllers {missing} are not delegated to {root} (systemd: Delegate=cpu memory pids)"
    if not os.access(root / "cgroup.subtree_control", os.W_OK) or not os.access(root, os.W_OK):
        return None, f"{root} is not writable by the agent (systemd: Delegate=, ProtectControlGroups=no)"
    wanted = [c for c in (*REQUIRED, "pids") if c in available]
    enable = " ".join(f"+{c}" for c in wanted)
    try:
        procs = _read(root / "cgroup.procs").split()
        if procs:  # no internal processes: the agent moves itself into a leaf of its own
            agent = root / "agent"
            agent.mkdir(exist_ok=True)
            _write(agent / "cgroup.procs", str(pid if pid is not None else os.getpid()))
        _write(root / "cgroup.subtree_control", enable)
        jobs = root / "jobs"
        jobs.mkdir(exist_ok=True)
        _write(jobs / "cgroup.subtree_control", enable)
        for left in sorted(p for p in jobs.iterdir() if p.is_dir()):
            # a previous agent's jobs (it crashed): whatever still runs there goes now; the ledger
            # reports their attempts lost
            log.warning("killing a job cgroup left by a previous run", extra={"cgroup": str(left)})
            JobCgroup(left).remove(timeout_s=2)
    except OSError as exc:
        return None, f"could not set up job cgroups under {root}: {exc}"
    return JobCgroups(jobs, frozenset(wanted)), f"job cgroups under {jobs} ({', '.join(wanted)})"
