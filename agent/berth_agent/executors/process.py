"""Run a job as a plain host process: own process group, own environment, limits, wall clock.

``ProcessRun`` is the machinery every local executor uses (the docker/podman executor runs its CLI
through it): ``start_new_session`` puts the run in its own session and process group, so one
signal reaches everything it started; stdout and stderr are read line by line by two threads
(each line bounded by ``MAX_LINE_BYTES``: a longer one arrives in pieces) and handed to the
callback, never accumulated; a supervisor thread enforces the wall-clock limit, turns a cancel into
SIGTERM to the group then SIGKILL after the grace, and once the leader exits kills whatever of the
group is left, so nothing of the job outlives it.

``ProcessExecutor`` adds what a code-bundle job needs: cwd in its per-job directory, the environment
from ``job_environment`` only (nothing of the agent's), rlimits (address space, open files, CPU
seconds) set in the child before exec, and, when the agent runs as root, a uid/gid of its own from
``UidPool`` (no supplementary groups, umask 077; its directories chowned to it and 0700), so one
job cannot read another's files, and none can read the agent's.

Where the host delegates a cgroup v2 subtree (``berth_agent.cgroups``), each job also gets a cgroup
of its own with ``memory.max`` and ``cpu.max`` from its spec: the child writes itself into it
before it drops to the job's uid and execs, so all it forks is inside. Elsewhere jobs get the
rlimits only. Either way a run's processes are its ``scope`` (berth_agent.containment: the cgroup,
or the group, the ``BERTH_ATTEMPT_KEY`` marker and descendants): signals reach all of them, and
once the leader has exited the run has its result only after none of them is left.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import IO

from berth_agent.cgroups import JobCgroup, JobCgroups
from berth_agent.containment import (
    LEADERS,
    SCAN_S,
    STRAYS,
    CgroupScope,
    Mode,
    ProcTable,
    Scope,
    TreeScope,
    empty_out,
)
from berth_agent.executors.base import (
    Executor,
    FailureKind,
    JobResult,
    Launch,
    LineSink,
    RunHandle,
    StartError,
    classify,
    job_environment,
)
from berth_agent.gpu_devices import DeviceCgroup, DeviceRules

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024
TAIL_LINES = 20
_POLL_S = 0.1


def _rlimit_setter(
    limits: dict[int, int],
    cgroup_procs: str | None = None,
    switch_to: int | None = None,
    also_join: Sequence[str] = (),
) -> Callable[[], None] | None:
    """A preexec function that only calls setrlimit (async-signal-safe enough: no locks, no allocs
    beyond the call) so that limits apply before the job's first instruction, and asks the kernel
    to SIGKILL the job when the agent thread that started it dies (an agent killed with SIGKILL
    must not leave its job running on while the attempt is retried elsewhere). With a job cgroup it
    first moves itself into it (``cgroup_procs``) and only then drops to uid/gid ``switch_to`` (a
    job uid could not make that move). ``also_join``: more ``cgroup.procs`` files to join first (its
    GPU devices cgroup, berth_agent.gpu_devices)."""
    items = list(limits.items())
    prctl = _prctl()
    joins = [*also_join, *([] if cgroup_procs is None else [cgroup_procs])]

    def apply() -> None:
        for procs in joins:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if switch_to is not None:
            os.setgroups([])
            os.setregid(switch_to, switch_to)
            os.setreuid(switch_to, switch_to)
        if prctl is not None:  # after the uid switch, which clears it
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for res, value in items:
            resource.setrlimit(res, (value, value))

    return apply


_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's prctl (Linux), looked up before the fork; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


class ProcessRun(RunHandle):
    """One process group, supervised. ``terminate`` replaces the SIGTERM to the group (containers)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: Path,
        on_line: LineSink,
        timeout_s: float | None,
        timeout_grace_s: float,
        rlimits: dict[int, int] | None = None,
        user: int | None = None,
        group: int | None = None,
        terminate: Callable[[float], None] | None = None,
        container: bool = False,
        on_exit: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cgroup: JobCgroup | None = None,
        attempt_key: str | None = None,
        devices: DeviceCgroup | None = None,
    ) -> None:
        self._on_line = on_line
        self._cgroup = cgroup
        self.attempt_key = attempt_key
        self._on_exit = on_exit
        self._clock = clock
        self._terminate_hook = terminate
        self._container = container
        self._timeout_grace_s = timeout_grace_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._result: JobResult | None = None
        self._stop_reason: str | None = None  # "canceled" | "timeout"
        self._kill_at: float | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.started_at = clock()
        self._deadline = None if timeout_s is None else self.started_at + timeout_s
        extra: dict[str, object] = {}
        switch_to = None
        if user is not None and cgroup is not None:
            if group != user:
                raise ValueError("a job in a cgroup runs with gid = uid")
            switch_to = user  # in the child, after it joined its cgroup
        elif user is not None:
            extra = {"user": user, "group": group, "extra_groups": []}
        try:
            self._proc = subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                umask=0o077,
                preexec_fn=_rlimit_setter(
                    rlimits or {},
                    None if cgroup is None else str(cgroup.procs),
                    switch_to,
                    () if devices is None else (str(devices.procs),),
                ),
                **extra,  # type: ignore[call-overload]
            )
        except BaseException as exc:
            if on_exit is not None:
                on_exit()
            if isinstance(exc, FileNotFoundError):
                raise StartError(FailureKind.NONZERO_EXIT, f"command not found: {argv[0]}") from exc
            if isinstance(exc, PermissionError):
                raise StartError(FailureKind.NONZERO_EXIT, f"command not executable: {argv[0]}") from exc
            if isinstance(exc, (subprocess.SubprocessError, OSError)):  # preexec (rlimits), uid switch
                raise StartError(FailureKind.AGENT_ERROR, f"the job could not be started: {exc}") from exc
            raise
        LEADERS.add(self._proc.pid)  # no scope or stray sweep may wait on it: subprocess does
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=("stdout", self._proc.stdout), daemon=True),
            threading.Thread(target=self._read, args=("stderr", self._proc.stderr), daemon=True),
        ]
        for t in self._readers:
            t.start()
        self.scope: Scope = (
            CgroupScope(cgroup)
            if cgroup is not None
            else TreeScope(
                pgid=self._proc.pid,
                key=attempt_key,
                leader_ticks=ProcTable().start_ticks(self._proc.pid),
                reap=True,
                owned=[self._proc.pid],
            )
        )
        self._next_scan = clock()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True, name=f"run-{self.pid}")
        self._supervisor.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def cgroup_path(self) -> str | None:
        return None if self._cgroup is None else str(self._cgroup.path)

    # -- output ---------------------------------------------------------------------------------
    def _read(self, name: str, stream: IO[bytes]) -> None:
        with stream:
            while raw := stream.readline(MAX_LINE_BYTES):
                line = raw.decode("utf-8", "replace")
                line = line[:-1] if line.endswith("\n") else line
                if name == "stderr":
                    self._tail.append(line)
                try:
                    self._on_line(name, line)
                except Exception:  # a broken sink must not stop the drain (the job would block)
                    log.exception("log sink failed; line dropped", extra={"pid": self.pid})

    # -- control --------------------------------------------------------------------------------
    def _signal_group(self, sig: int) -> None:
        """``sig`` to the process group, and to what left it (its cgroup, its marker)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)
        try:
            self.scope.signal(sig)
        except OSError as exc:  # /proc or the cgroup unreadable for a moment: the next turn retries
            log.warning("attempt's processes not signalled", extra={"pid": self.pid, "error": str(exc)})

    def _begin_stop(self, grace_s: float) -> None:
        self._kill_at = self._clock() + max(0.0, grace_s)
        if self._terminate_hook is not None:
            self._terminate_hook(grace_s)
        else:
            self._signal_group(signal.SIGTERM)

    def cancel(self, grace_s: float) -> None:
        with self._lock:
            if self._done.is_set():
                return
            if self._stop_reason is None:
                self._stop_reason = "canceled"
                self._begin_stop(grace_s)
            elif grace_s == 0:
                self._kill_at = self._clock()

    def _supervise(self) -> None:
        while True:
            try:
                returncode = self._proc.wait(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = self._clock()
            if now >= self._next_scan:  # remember who belongs to the run while they still show it
                self._next_scan = now + SCAN_S
                with contextlib.suppress(OSError):
                    self.scope.members()
                    STRAYS.sweep()
            with self._lock:
                if self._deadline is not None and now >= self._deadline and self._stop_reason is None:
                    self._stop_reason = "timeout"
                    self._begin_stop(self._timeout_grace_s)
                if self._kill_at is not None and now >= self._kill_at:
                    self._kill_at = None
                    self._signal_group(signal.SIGKILL)
        # The leader is gone: nothing else of the run may outlive it (and hold the pipes or the
        # GPUs): its group, its cgroup, what carries its marker. The run ends only once all are gone.
        LEADERS.discard(self._proc.pid)  # reaped by the wait above
        self._signal_group(signal.SIGKILL)
        empty_out(self.scope, what=f"pid {self.pid}")
        for t in self._readers:
            t.join(timeout=5.0)
        with self._lock:
            self._result = classify(
                returncode,
                canceled=self._stop_reason == "canceled",
                timed_out=self._stop_reason == "timeout",
                stderr_tail=list(self._tail),
                container=self._container,
            )
            if (
                self._cgroup is not None
                and self._stop_reason is None
                and not self._result.succeeded
                and self._cgroup.oom_killed()
            ):
                self._result = JobResult(
                    returncode, FailureKind.OOM, "killed by the OOM killer at its memory limit (memory.max)"
                )
        if self._on_exit is not None:
            self._on_exit()
        self._done.set()

    def poll(self) -> JobResult | None:
        return self._result if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> JobResult | None:
        self._done.wait(timeout)
        return self.poll()


class UidPool:
    """Unprivileged uids, one per running job (gid = uid); only usable when the agent is root."""

    def __init__(self, ids: range) -> None:
        self._free = list(ids)
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, spec: str | None) -> UidPool | None:
        """``"first-last"`` -> a pool, or None when unset or the agent is not root (the jobs then run
        as the agent's own user: docs/agent.md says why that is only for trusted single-tenant hosts)."""
        if spec is None or os.geteuid() != 0:
            return None
        first, last = (int(x) for x in spec.split("-"))
        if not 0 < first <= last:
            raise ValueError(f"uid range {spec} is empty or includes root")
        return cls(range(first, last + 1))

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise StartError(FailureKind.AGENT_ERROR, "no free job uid left on this host")
            return self._free.pop(0)

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


class ProcessExecutor(Executor):
    def __init__(
        self,
        *,
        uids: UidPool | None = None,
        timeout_grace_s: float = 30.0,
        cgroups: JobCgroups | None = None,
        device_rules: DeviceRules | None = None,
    ) -> None:
        self.uids = uids
        self.timeout_grace_s = timeout_grace_s
        self.cgroups = cgroups
        #: Each job's GPU device rules (berth_agent.gpu_devices), where the host allows them.
        self.device_rules = device_rules
        self.containment = Mode.CGROUP_V2 if cgroups is not None else Mode.PROCESS_GROUP

    def _cgroup(self, launch: Launch) -> JobCgroup | None:
        """The job's own cgroup with its limits, or None (no delegated cgroup, or the kernel refused:
        logged, and the job runs with its rlimits only)."""
        if self.cgroups is None:
            return None
        try:
            return self.cgroups.create(
                launch.name, memory_gib=launch.limits.memory_gib, cpus=launch.limits.cpus
            )
        except OSError as exc:
            log.warning(
                "job cgroup not created; rlimits only",
                extra={"job_id": launch.job_id, "attempt": launch.attempt, "error": str(exc)},
            )
            return None

    def _devices(self, launch: Launch) -> DeviceCgroup | None:
        """The job's devices cgroup that closes every other GPU of the host, or None (no rules on this
        host). A host that has rules and cannot write them does not start the job: it would run
        with every GPU open."""
        if self.device_rules is None:
            return None
        try:
            return self.device_rules.create(launch.name, launch.gpu_uuids)
        except OSError as exc:
            raise StartError(
                FailureKind.AGENT_ERROR, f"the job's GPU device rules could not be written: {exc}"
            ) from exc

    def rlimits(self, launch: Launch) -> dict[int, int]:
        """The limits to set, each capped at the agent's own hard limit (a child cannot raise it)."""
        lim = launch.limits
        wanted = {
            resource.RLIMIT_AS: lim.address_space_bytes,
            resource.RLIMIT_NOFILE: lim.nofile,
            resource.RLIMIT_CPU: lim.cpu_seconds,
        }
        out: dict[int, int] = {}
        for res, value in wanted.items():
            if value is not None:
                hard = resource.getrlimit(res)[1]
                out[res] = value if hard == resource.RLIM_INFINITY else min(value, hard)
        return out

    def environment(self, launch: Launch) -> dict[str, str]:
        return job_environment(
            launch,
            home=str(launch.workdir),
            output_dir=None if launch.output_dir is None else str(launch.output_dir),
            checkpoint_dir=None if launch.checkpoint_dir is None else str(launch.checkpoint_dir),
        )

    @staticmethod
    def link_mounts(launch: Launch) -> None:
        """Without a mount namespace a process cannot see ``/data`` at ``/data``: each mount appears at
        ``<workdir>/<mount path>`` (``/data/train`` -> ``./data/train``), a symlink to its source.
        Read-only comes from ownership (sources are not the job's) and the unit's ProtectSystem=strict."""
        for m in launch.mounts:
            rel = PurePosixPath(m.target).relative_to("/")
            if not rel.parts or ".." in rel.parts:
                raise StartError(FailureKind.STAGING, f"mount target {m.target} is not a safe path")
            link = launch.workdir.joinpath(*rel.parts)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.exists() or link.is_symlink():
                raise StartError(
                    FailureKind.STAGING, f"mount target {m.target} collides with the job's files"
                )
            link.symlink_to(m.source, target_is_directory=m.source.is_dir())

    @staticmethod
    def _give(launch: Launch, uid: int) -> None:
        for d in (launch.workdir, launch.output_dir, launch.checkpoint_dir):
            if d is not None:
                _chown_tree(d, uid, uid)
                d.chmod(0o700)
        # Staged data inside the attempt's directory: its directories become the job's (so no other
        # job can traverse them); its files stay the cache's (shared hard links, read-only, not chowned).
        base = launch.workdir.parent
        for m in launch.mounts:
            if m.source.is_dir() and m.source.is_relative_to(base):
                for dirpath, _dirs, _files in os.walk(m.source):
                    os.chown(dirpath, uid, uid)
                    os.chmod(dirpath, 0o500)

    def start(self, launch: Launch, on_line: LineSink) -> RunHandle:
        if not launch.command:
            raise StartError(FailureKind.NONZERO_EXIT, "the job has no command")
        if not launch.workdir.is_dir():
            raise StartError(FailureKind.STAGING, f"the job's directory {launch.workdir} is missing")
        env = self.environment(launch)
        self.link_mounts(launch)
        uid: int | None = None
        cleanups: list[Callable[[], None]] = []

        def on_exit() -> None:
            for cleanup in cleanups:
                cleanup()

        if self.uids is not None:
            uid = self.uids.take()
            cleanups.append(functools.partial(self.uids.give_back, uid))
            try:
                self._give(launch, uid)
            except BaseException:
                on_exit()
                raise
        try:
            devices = self._devices(launch)
        except StartError:
            on_exit()
            raise
        if devices is not None:
            cleanups.insert(0, devices.remove)
        cgroup = self._cgroup(launch)
        if cgroup is not None:
            cleanups.insert(0, cgroup.remove)
        return ProcessRun(
            launch.command,
            env=env,
            cwd=launch.workdir,
            on_line=on_line,
            timeout_s=launch.timeout_s,
            timeout_grace_s=self.timeout_grace_s,
            rlimits=self.rlimits(launch),
            user=uid,
            group=uid,
            on_exit=on_exit,
            cgroup=cgroup,
            attempt_key=launch.attempt_key,
            devices=devices,
        )
