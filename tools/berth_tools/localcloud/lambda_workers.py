"""Lambda sandboxes as worker processes: start, feed, time out, kill, reuse (see `lambda_worker`).

`WorkerProcess` is one sandbox: a ``python -m berth_tools.localcloud.lambda_worker`` child with the
function's environment, its control socket and a thread collecting its stdout/stderr. `SandboxPool`
keeps a function's sandboxes: an idle one is reused (a warm start); with none idle and fewer than its
limit running, a new one is started (a cold start, in the invoking thread, as Lambda's init runs
before the first event); otherwise the invocation waits for one to be free, as a throttled Lambda
caller would retry. A sandbox that timed out, crashed or failed its init is killed and dropped; the
next invocation gets a fresh one. `SandboxPool.kill_one` (`berth local fault lambda-kill`) kills one
from outside, as a sandbox dies on AWS: a running invocation sees `SandboxGone`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from berth_tools.localcloud.lambda_worker import END_MARK

#: How long a sandbox may take to import its handler (Lambda allows 10 s; a loaded laptop needs more).
INIT_TIMEOUT_S = 60.0
#: After an answer, how long to wait for the rest of the invocation's output to be read off the pipe.
OUTPUT_GRACE_S = 5.0
#: How long a sandbox has to exit on its own at shutdown before it is killed.
STOP_GRACE_S = 2.0


class SandboxGone(RuntimeError):
    """The worker process exited (crashed, was killed) before it answered."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status  # Lambda's words: "exit status 3", "signal: killed"


class SandboxTimeout(RuntimeError):
    pass


@dataclass
class Answer:
    message: dict[str, Any]
    output: str


@dataclass
class WorkerProcess:
    """One sandbox. Not thread-safe: one invocation at a time (its pool hands it to one caller)."""

    handler: str
    env: dict[str, str]
    hooks: list[tuple[str, list[Any]]] = field(default_factory=list)
    log_stream: str = ""  # the runtime's name for where this sandbox's logs go
    invocations: int = 0
    init_ms: float = 0.0
    init_output: str = ""  # printed while the handler was imported (until the first invocation takes it)
    started_at: float = field(default_factory=time.time)
    _process: subprocess.Popen[bytes] | None = None
    _conn: Connection | None = None
    _reader: threading.Thread | None = None
    _lines: list[str] = field(default_factory=list)
    _ended: dict[str, threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def start(self) -> Answer:
        """Start the process and import the handler. The answer's message has ``ready`` (and ``error``)."""
        parent, child = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-u", "-m", "berth_tools.localcloud.lambda_worker", str(child.fileno())],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(child.fileno(),),
                # Its own session: Ctrl-C reaches the local cloud, which stops its sandboxes itself.
                start_new_session=True,
            )
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._reader = threading.Thread(target=self._read_output, name=f"lambda-out-{self.pid}", daemon=True)
        self._reader.start()
        self._conn.send_bytes(json.dumps({"handler": self.handler, "hooks": self.hooks}).encode())
        answer = self._receive("init", INIT_TIMEOUT_S)
        self.init_ms = float(answer.message.get("init_ms") or 0.0)
        self.init_output = answer.output
        return answer

    def invoke(self, message: dict[str, Any], timeout_s: float) -> Answer:
        """Send one event and wait for its answer (raises `SandboxTimeout`, `SandboxGone`)."""
        assert self._conn is not None
        self.invocations += 1
        try:
            self._conn.send_bytes(json.dumps(message).encode())
        except OSError as exc:
            raise SandboxGone(self._exit_status()) from exc
        return self._receive(str(message["request_id"]), timeout_s)

    def _receive(self, request_id: str, timeout_s: float) -> Answer:
        assert self._conn is not None
        ended = self._end_event(request_id)
        try:
            ready = self._conn.poll(timeout_s)
            if not ready:
                raise SandboxTimeout(request_id)
            message = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise SandboxGone(self._exit_status()) from exc
        ended.wait(OUTPUT_GRACE_S)
        with self._lock:
            self._ended.pop(request_id, None)
        return Answer(message, self.take_output())

    def take_output(self) -> str:
        """Everything the process wrote since the last call (whole lines)."""
        with self._lock:
            text, self._lines = "".join(self._lines), []
        return text

    def _end_event(self, request_id: str) -> threading.Event:
        with self._lock:
            return self._ended.setdefault(request_id, threading.Event())

    def _read_output(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            line = raw.decode(errors="replace")
            before, mark, request_id = line.partition(END_MARK)
            with self._lock:
                if before.strip():
                    self._lines.append(before if before.endswith("\n") else before + "\n")
                if mark:
                    self._end_event_locked(request_id.strip()).set()
        process.stdout.close()

    def _end_event_locked(self, request_id: str) -> threading.Event:
        return self._ended.setdefault(request_id, threading.Event())

    def max_rss_mb(self) -> int | None:
        """The process's peak resident memory (VmHWM), read while it still runs."""
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return max(1, round(int(line.split()[1]) / 1024))
        except (OSError, ValueError, AssertionError):
            return None
        return None

    def _exit_status(self) -> str:
        assert self._process is not None
        try:
            code = self._process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            return "unknown"
        if code < 0:
            name = {
                signal.SIGKILL: "killed",
                signal.SIGTERM: "terminated",
                signal.SIGSEGV: "segmentation fault",
            }
            return f"signal: {name.get(signal.Signals(-code), signal.Signals(-code).name)}"
        return f"exit status {code}"

    def signal_kill(self) -> None:
        """SIGKILL the process without waiting for it (the thread invoking it sees `SandboxGone`)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    def kill(self) -> str:
        """Kill the process now; returns the output it wrote before it died."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        self._reap()
        return self.take_output()

    def stop(self) -> None:
        """Ask the process to exit (its control socket closes: it leaves its loop), kill it if it lingers."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.terminate()

    def _reap(self) -> None:
        if self._process is not None:
            try:
                self._process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
                self._process.wait()
        if self._reader is not None:
            self._reader.join(OUTPUT_GRACE_S)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()

    def join(self) -> None:
        """Wait for a stopped process to exit (kill it after `STOP_GRACE_S`)."""
        self._reap()

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None


@dataclass
class SandboxPool:
    """The sandboxes of one function, at most `limit` at once."""

    limit: int
    spawn: Callable[[], WorkerProcess]
    _idle: list[WorkerProcess] = field(default_factory=list)
    _workers: dict[int, WorkerProcess] = field(default_factory=dict)
    _starting: int = 0
    _closed: bool = False
    _next_ticket: int = 0  # invocations take a ticket and are served in its order
    _serving: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def acquire(self) -> tuple[WorkerProcess, bool]:
        """A sandbox for one invocation, and whether it was just started (a cold start). Blocks while
        the function is at its limit; waiting invocations are served first come, first served. Raises
        `SandboxGone` when the pool is closed, `spawn`'s error when a new sandbox fails to start."""
        with self._cond:
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            try:
                while True:
                    if self._closed:
                        raise SandboxGone("the local cloud is stopping")
                    if ticket == self._serving:
                        while self._idle:
                            worker = self._idle.pop()
                            if worker.alive():
                                return worker, False
                            self._forget(worker)
                        if len(self._workers) + self._starting < self.limit:
                            self._starting += 1
                            break
                    self._cond.wait()
            finally:
                if ticket == self._serving:  # the next in line may take the next sandbox
                    self._serving += 1
                    self._cond.notify_all()
        try:
            worker = self.spawn()
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._starting -= 1
            if self._closed:
                closed = True
            else:
                closed = False
                self._workers[id(worker)] = worker
            self._cond.notify_all()
        if closed:
            worker.kill()
            raise SandboxGone("the local cloud is stopping")
        return worker, True

    def release(self, worker: WorkerProcess, retire: bool = False) -> None:
        """Return a sandbox after an invocation (`retire`: stop it instead of keeping it warm)."""
        with self._cond:
            if retire or self._closed or not worker.alive():
                self._forget(worker)
                stop = True
            else:
                self._idle.append(worker)
                stop = False
            self._cond.notify_all()
        if stop:
            worker.stop()
            worker.join()

    def discard(self, worker: WorkerProcess) -> None:
        """Drop a sandbox that must not run again (timed out, crashed); kill it if still alive."""
        worker.kill()
        with self._cond:
            self._forget(worker)
            self._cond.notify_all()

    def _forget(self, worker: WorkerProcess) -> None:
        self._workers.pop(id(worker), None)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)

    def close(self, busy_too: bool = True) -> list[WorkerProcess]:
        """Refuse new invocations; stop the idle sandboxes and, with `busy_too`, those running an event
        too (else each stops when its invocation returns). Returns the stopped ones, to be joined."""
        with self._cond:
            self._closed = True
            workers = list(self._workers.values()) if busy_too else list(self._idle)
            self._cond.notify_all()
        for worker in workers:
            worker.stop()
        return workers

    def kill_one(self) -> int | None:
        """SIGKILL one live sandbox (`berth local fault lambda-kill`), one running an event if any: that
        invocation ends in `SandboxGone` (its invoking thread discards the sandbox); an idle one is
        dropped here. Returns its pid, or None when no sandbox is alive."""
        with self._cond:
            live = [w for w in self._workers.values() if w.alive()]
            busy = [w for w in live if all(w is not idle for idle in self._idle)]
            if not live:
                return None
            victim = (busy or live)[0]
            if not busy:  # idle: no invocation will notice, so it is dropped now
                self._forget(victim)
                self._cond.notify_all()
            pid = victim.pid
            victim.signal_kill()
        if not busy:
            victim.kill()  # reaps it
        return pid

    def pids(self) -> list[int]:
        with self._cond:
            return [w.pid for w in self._workers.values() if w.alive()]

    def busy(self) -> int:
        """Sandboxes running an event now."""
        with self._cond:
            return len(self._workers) - len(self._idle)

    def size(self) -> int:
        with self._cond:
            return len(self._workers)
