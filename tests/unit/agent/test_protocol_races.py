"""Agents against the control plane's own services, running real job processes.

The control plane here is the real ``AgentService``, scheduler and workflow over the in-memory
stores of ``tests/unit`` (``World``: the Step Functions steps are called by the test); the agents
are real ``Daemon``s with real ``AttemptRunner``s and ``ProcessExecutor``s. Each race is decided
by the service's conditional writes, so this is the cheapest level that still shows the outcome:
claim races, duplicate delivery, a restart with a job left behind, a gang with a failing rank, and
drain (first and second SIGTERM) with a real job.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from berth.domain.errors import NotFound
from berth.domain.fleet import HostInventory
from berth.domain.job import Job
from berth.domain.status import JobStatus
from berth.domain.workflow import AttemptRef, AttemptReport, HeartbeatRequest
from berth.logic import agent as cp
from berth.logic.agent import HostCaller
from berth_agent.attempt import AttemptRunner, Outcome
from berth_agent.client import AgentApiError, AlreadyClaimed, Canceled, Fenced, Unreachable
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.daemon import Daemon, Message
from berth_agent.executors import Launch, LineSink, ProcessExecutor, RunHandle
from berth_agent.gpus import Gpu, Inventory
from berth_agent.ledger import AttemptLedger
from tests.unit.test_workflow_services import World

#: Appends "start <pid> <time> <rank>" and, when it ends normally, "end <pid> <time>" to $MARK;
#: it runs ``RUN_S_<attempt>`` or ``RUN_S`` seconds; a rank whose ``EXIT_<rank>`` is set exits with it
#: after 0.2 s.
SCRIPT = """
import os, sys, time
def note(text):
    with open(os.environ["MARK"], "a") as fh:
        fh.write(text + "\\n")
note(f"start {os.getpid()} {time.time()} {os.environ.get('RANK', '-')}")
print("running", flush=True)
code = int(os.environ.get("EXIT_" + os.environ.get("RANK", "0"), "0"))
run_s = float(os.environ.get("RUN_S_" + os.environ["BERTH_ATTEMPT"], os.environ["RUN_S"]))
time.sleep(run_s if code == 0 else 0.2)
if code == 0:
    note(f"end {os.getpid()} {time.time()}")
sys.exit(code)
"""


def _spec(marker: Path, run_s: float, gpus: int = 1, **extra: Any) -> dict[str, Any]:
    env = {"MARK": str(marker), "RUN_S": str(run_s), **extra.pop("env", {})}
    return {
        "image": "python:3.11-slim",  # the process executor runs the command on the host
        "command": [sys.executable, "-c", SCRIPT],
        "resources": {"gpu_type": "A100", "gpus": gpus, **extra.pop("resources", {})},
        "env": env,
        **extra,
    }


class HostApi:
    """The agent client's surface for one host, over ``AgentService``: the service's errors become
    the answers the HTTP client raises (409 by code, 404)."""

    def __init__(self, w: World, host_id: str) -> None:
        self.w, self.caller = w, HostCaller(host_id, f"arn:host/{host_id}")
        self.dead = False
        self.claim_gate: Callable[[], None] | None = None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.dead:
            raise Unreachable(0, "Unreachable", "this agent is gone")
        try:
            return fn(self.caller, *args)
        except cp.AlreadyClaimed as exc:
            raise AlreadyClaimed(409, "AlreadyClaimed", str(exc)) from exc
        except cp.AttemptCanceled as exc:
            raise Canceled(409, "Canceled", str(exc)) from exc
        except cp.Fenced as exc:
            raise Fenced(409, "Fenced", str(exc)) from exc
        except NotFound as exc:
            raise AgentApiError(404, "NotFound", str(exc)) from exc

    def register(self, inventory: dict[str, Any], agent_version: str = "test") -> Any:
        return self._call(self.w.agent.register, HostInventory.model_validate(inventory))

    def heartbeat(self, *, healthy: bool, draining: bool, attempts: list[dict[str, Any]], **kw: Any) -> Any:
        request = HeartbeatRequest.model_validate(
            {"healthy": healthy, "draining": draining, "attempts": attempts, **kw}
        )
        return self._call(self.w.agent.heartbeat, request)

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        if self.claim_gate is not None:
            self.claim_gate()
        return self._call(
            self.w.agent.claim, AttemptRef(job_id=job_id, attempt=attempt, fencing_token=fencing_token)
        )

    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        ref = AttemptRef(job_id=job_id, attempt=attempt, fencing_token=fencing_token)
        return self._call(self.w.agent.credentials, ref)  # no job role here: 404, journal logs

    def report(
        self,
        job_id: str,
        attempt: int,
        fencing_token: str,
        event: str,
        *,
        exit_code: int | None = None,
        failure: str | None = None,
        message: str = "",
    ) -> Any:
        body = AttemptReport(
            job_id=job_id,
            attempt=attempt,
            fencing_token=fencing_token,
            event=event,
            exit_code=exit_code,
            failure=failure,
            message=message,
        )
        return self._call(self.w.agent.report, body)


class HostQueue:
    """The host's queue: the work messages the workflow sent to it, each delivered once unless
    ``redeliver`` puts it back (a lost delete, a visibility timeout, a re-sent dispatch)."""

    def __init__(self, w: World, host_id: str) -> None:
        self.w, self.host_id = w, host_id
        self.seen = 0
        self.pending: list[Message] = []
        self.deleted: list[str] = []
        self.delivered: dict[str, Message] = {}
        self.lock = threading.Lock()
        self.dead = False  # its agent is gone: it receives nothing more

    def _collect(self) -> None:
        sent = [body for host, body in self.w.queues.sent if host == self.host_id]
        for i in range(self.seen, len(sent)):
            self.pending.append(Message(sent[i], f"{self.host_id}-m{i}"))
        self.seen = len(sent)

    def receive(self, wait_s: int) -> list[Message]:
        if self.dead:
            time.sleep(0.02)
            return []
        with self.lock:
            self._collect()
            out, self.pending = self.pending[:1], self.pending[1:]
            self.delivered.update((m.receipt, m) for m in out)
        if not out:
            time.sleep(0.02)
        return out

    def redeliver(self, message: Message) -> None:
        with self.lock:
            self.pending.append(message)

    def delete(self, receipt: str) -> None:
        with self.lock:
            self.deleted.append(receipt)

    def retry_soon(self, receipt: str, delay_s: int) -> None:
        with self.lock:
            message = self.delivered.get(receipt)
            if message is not None:
                self.pending.append(message)  # visible again (at once, here)


class CountingExecutor(ProcessExecutor):
    def __init__(self) -> None:
        super().__init__(timeout_grace_s=1)
        self.starts: list[tuple[str, int]] = []
        self.handles: list[RunHandle] = []

    def start(self, launch: Launch, on_line: LineSink) -> RunHandle:
        self.starts.append((launch.job_id, launch.attempt))
        handle = super().start(launch, on_line)
        self.handles.append(handle)
        return handle


class Agent:
    """One ``berth-agent`` for ``host_id`` (its own work dir and ledger)."""

    def __init__(self, w: World, host_id: str, work: Path, queue: HostQueue | None = None) -> None:
        work.mkdir(parents=True, exist_ok=True)
        work.chmod(0o711)
        self.api = HostApi(w, host_id)
        self.queue = queue or HostQueue(w, host_id)
        self.executor = CountingExecutor()
        self.outcomes: list[Outcome] = []
        cfg = AgentConfig(
            api_url="http://x",
            pool="default",
            host_id=host_id,
            work_dir=work,
            limits=JobLimits(uid_range=None),
            cancel_grace_s=1,
            drain_timeout_s=30,
        )
        inventory = Inventory(
            gpus=tuple(Gpu(i, f"GPU-{host_id}-{i}", "A100", 81920) for i in range(8)),
            gpu_type="A100",
            source="simulated",
        )
        self.runner = AttemptRunner(
            config=cfg,
            inventory=inventory,
            api=self.api,
            executor=self.executor,
            ledger=AttemptLedger(work),
            io_for=lambda creds: pytest.fail("no job role in this world"),
            sync_interval_s=0.2,
            tick_s=0.05,
        )
        run = self.runner.run

        def recording_run(
            message: Mapping[str, Any], on_claim_answered: Callable[[], None] | None = None
        ) -> Outcome:
            outcome = run(message, on_claim_answered)
            self.outcomes.append(outcome)
            return outcome

        self.runner.run = recording_run  # type: ignore[method-assign]
        self.daemon = Daemon(
            config=cfg,
            inventory=inventory,
            api=self.api,
            runner=self.runner,
            queue_for=lambda url: self.queue,
            ledger=self.runner.ledger,
            host_facts={"cpu": 64, "memory_gib": 512},
            poll_wait_s=0,
        )
        self.thread: threading.Thread | None = None

    def start(self) -> Agent:
        self.thread = threading.Thread(target=self.daemon.run, kwargs={"install_signals": False}, daemon=True)
        self.thread.start()
        return self

    def idle(self) -> bool:
        return not self.daemon._threads_alive()


def _until(cond: Callable[[], bool], timeout: float = 20, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting: {what}"
        time.sleep(0.02)


def _place(w: World, job: Job) -> Job:
    """The workflow's steps up to the work messages: park the token, run a pass, dispatch."""
    w.workflow.await_placement(job.id, f"place-{job.id}-{w.job(job.id).attempts}")
    w.scheduler.run_pass()
    placed = w.job(job.id)
    assert placed.status is JobStatus.STARTING, placed
    w.workflow.dispatch_onprem(job.id, placed.attempts, f"dispatch-{job.id}-{placed.attempts}")
    return w.job(job.id)


def _dispatch(w: World, kind: str) -> list[tuple[str, str, Any]]:
    """The calls of ``kind`` on dispatch tokens (the agent's outcomes; not the placement tokens)."""
    return [c for c in w.tokens.of(kind) if c[1].startswith("dispatch-")]


def _marks(marker: Path) -> list[list[str]]:
    return [line.split() for line in marker.read_text().splitlines()] if marker.exists() else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _finish(*agents: Agent) -> None:
    for a in agents:
        a.daemon.on_sigterm()
        a.daemon.on_sigterm()
    for a in agents:
        if a.thread is not None:
            a.thread.join(10)
            assert not a.thread.is_alive()


# -- claims ---------------------------------------------------------------------------------------


def test_two_agents_race_for_one_attempt_exactly_one_runs_it(tmp_path: Path) -> None:
    """Both agents of host h0 (an old one not yet gone and its replacement, say) get the same work
    message and claim at the same moment: one claim wins, the other is 409 AlreadyClaimed, deletes
    its message and starts nothing."""
    w = World(hosts=1)
    marker = tmp_path / "marks"
    job = _place(w, w.submit(**_spec(marker, 0.3)))
    (_, body), *_ = w.queues.sent
    gate = threading.Barrier(2)
    a = Agent(w, "h0", tmp_path / "a")
    b = Agent(w, "h0", tmp_path / "b", queue=HostQueue(w, "h0"))
    for agent in (a, b):
        agent.api.claim_gate = lambda: gate.wait(5)
    a.daemon.offer(a.queue, Message(body, "ra"))
    b.daemon.offer(b.queue, Message(body, "rb"))
    _until(lambda: a.idle() and b.idle(), what="both attempts threads")
    outcomes = a.outcomes + b.outcomes
    assert sorted(o.ran for o in outcomes) == [False, True], outcomes
    assert [o.reason for o in outcomes if not o.ran] == ["AlreadyClaimed"]
    assert len(a.executor.starts) + len(b.executor.starts) == 1
    assert a.queue.deleted == ["ra"] and b.queue.deleted == ["rb"]  # both messages spent
    assert [m[0] for m in _marks(marker)] == ["start", "end"]
    assert [c[1] for c in _dispatch(w, "succeed")] == [f"dispatch-{job.id}-1"]


def test_another_hosts_agent_gets_404_deletes_and_runs_nothing(tmp_path: Path) -> None:
    w = World(hosts=2)
    marker = tmp_path / "marks"
    job = _place(w, w.submit(**_spec(marker, 0.1)))
    ((placed_on, body),) = w.queues.sent
    other = "h1" if placed_on == "h0" else "h0"
    stray = Agent(w, other, tmp_path / "stray")
    stray.daemon.offer(stray.queue, Message(body, "r1"))  # a misrouted (or forged) message
    _until(stray.idle)
    assert stray.queue.deleted == ["r1"] and stray.executor.starts == []
    assert [(o.ran, o.reason) for o in stray.outcomes] == [(False, "NotFound")]
    assert w.job(job.id).run.attempt.claimed == ()


def test_duplicate_delivery_to_one_agent_runs_once(tmp_path: Path) -> None:
    w = World(hosts=1)
    marker = tmp_path / "marks"
    job = _place(w, w.submit(**_spec(marker, 1.0)))
    ((_, body),) = w.queues.sent
    a = Agent(w, "h0", tmp_path / "a").start()
    _until(lambda: len(_marks(marker)) == 1, what="the job's start")
    first = Message(body, "dup-1")
    a.queue.redeliver(first)  # delivered again while it runs: deleted at once, not claimed again
    _until(lambda: "dup-1" in a.queue.deleted, what="the duplicate deleted")
    _until(a.idle, what="the attempt to end")
    assert w.job(job.id).status is JobStatus.STARTING or _dispatch(w, "succeed")
    a.queue.redeliver(Message(body, "dup-2"))  # and once more after it ended: refused, deleted
    _until(lambda: "dup-2" in a.queue.deleted, what="the late duplicate deleted")
    _until(a.idle)
    _finish(a)
    assert a.executor.starts == [(job.id, 1)]
    assert [m[0] for m in _marks(marker)] == ["start", "end"]
    # the late duplicate finds the job COMPLETED (its report completed it): Fenced, deleted, not run
    assert [(o.ran, o.reason) for o in a.outcomes] == [(True, ""), (False, "Fenced")]


# -- restart --------------------------------------------------------------------------------------


def test_a_restarted_agent_reports_its_left_job_lost_and_it_never_runs_twice(tmp_path: Path) -> None:
    """Agent A runs attempt 1 and goes silent (killed; its job process survives). Its replacement B,
    on the same work dir, finds the attempt in the ledger, kills what is left of the job and reports
    it lost; the workflow retries it as attempt 2 (a new fencing token, this host excluded), which
    the other host runs. Attempt 1's message, delivered to B again, is refused. Two starts, never
    overlapping; one end."""
    w = World(hosts=2)
    marker = tmp_path / "marks"
    job = _place(w, w.submit(**_spec(marker, 30, retry={"max_attempts": 3}, env={"RUN_S_2": "0.3"})))
    ((host, _),) = w.queues.sent
    other = "h1" if host == "h0" else "h0"
    a = Agent(w, host, tmp_path / "work").start()
    _until(lambda: len(_marks(marker)) == 1, what="attempt 1 started")
    first_pid = int(_marks(marker)[0][1])
    a.api.dead = a.queue.dead = True  # A is gone: it talks to nobody any more
    # B's queue delivers attempt 1's message again (as if A's delete was lost)
    b = Agent(w, host, tmp_path / "work")
    assert b.daemon.recover() == 1
    _until(lambda: not _alive(first_pid), timeout=5, what="the left job killed")
    killed_at = time.time()
    ((_, dispatch, error),) = _dispatch(w, "fail")
    assert dispatch == f"dispatch-{job.id}-1" and error == "Berth.AgentError"
    # the workflow's steps: classify (transient), back off, requeue, place again, dispatch
    assert w.workflow.classify_failure(job.id, 1, error, "lost on agent restart")["action"] == "retry"
    w.workflow.requeue(job.id)
    retried = _place(w, w.job(job.id))
    assert retried.attempts == 2 and retried.run.excluded_hosts == (host,)
    c = Agent(w, other, tmp_path / "other").start()
    b.start()
    _until(lambda: b.queue.deleted == [f"{host}-m0"], what="attempt 1's message refused")
    _until(lambda: bool(_dispatch(w, "succeed")), what="attempt 2 done")
    _finish(a, b, c)
    starts = [m for m in _marks(marker) if m[0] == "start"]
    ends = [m for m in _marks(marker) if m[0] == "end"]
    assert len(starts) == 2 and float(starts[1][2]) > killed_at and len(ends) == 1
    assert b.executor.starts == [] and c.executor.starts == [(job.id, 2)]
    assert [(o.ran, o.reason) for o in b.outcomes] == [(False, "NotFound")]


# -- gangs ----------------------------------------------------------------------------------------


def test_a_failing_rank_fails_the_attempt_on_both_hosts(tmp_path: Path) -> None:
    w = World(hosts=2)
    marker = tmp_path / "marks"
    spec = _spec(marker, 30, gpus=16, resources={"nodes": 2}, env={"EXIT_1": "3"}, retry={"max_attempts": 1})
    spec["env"]["RUN_S"] = "30"
    job = _place(w, w.submit(**spec))
    assert len(w.queues.sent) == 2
    h0, h1 = Agent(w, "h0", tmp_path / "h0").start(), Agent(w, "h1", tmp_path / "h1")
    # rank 1 exits 3 at once; rank 0 would run for 30 s
    h1.daemon.heartbeat_s = 0.2
    h1.start()
    _until(lambda: len(_marks(marker)) == 2, what="both ranks started")
    rank0_pid = int(next(m for m in _marks(marker) if m[3] == "0")[1])
    _until(lambda: bool(_dispatch(w, "fail")), what="rank 1's failure reported")
    ((_, _, error),) = _dispatch(w, "fail")
    assert error == "Berth.NonZeroExit"
    assert w.workflow.classify_failure(job.id, 1, error, "h1: exit code 3")["action"] != "retry"
    assert w.job(job.id).status is JobStatus.FAILED
    h0.daemon.heartbeat_once()  # the next heartbeat: stop (fenced) -> rank 0's process is stopped
    _until(lambda: not _alive(rank0_pid), what="rank 0 stopped")
    _until(h0.idle)
    _finish(h0, h1)
    assert not any(m[0] == "end" for m in _marks(marker))
    assert not _dispatch(w, "succeed")


# -- drain ----------------------------------------------------------------------------------------


def test_sigterm_drains_the_running_job_finishes_nothing_new_is_taken(tmp_path: Path) -> None:
    w = World(hosts=1)
    marker = tmp_path / "marks"
    job = _place(w, w.submit(**_spec(marker, 1.5)))
    a = Agent(w, "h0", tmp_path / "a")
    a.daemon.heartbeat_s = 0.1
    a.start()
    _until(lambda: len(_marks(marker)) == 1, what="the job's start")
    a.daemon.on_sigterm()
    later = _place(w, w.submit(**_spec(tmp_path / "later", 0.1)))  # queued for h0 while it drains
    assert a.thread is not None
    a.thread.join(20)
    assert not a.thread.is_alive()  # it exited once the running job was done
    assert [m[0] for m in _marks(marker)] == ["start", "end"]
    assert [c[1] for c in _dispatch(w, "succeed")] == [f"dispatch-{job.id}-1"]
    assert a.executor.starts == [(job.id, 1)] and not (tmp_path / "later").exists()
    assert w.job(later.id).run.attempt.claimed == ()  # its message stays for another agent
    assert w.hosts.hosts["h0"].draining  # its heartbeats said so: no new placements here
    nxt = w.submit(**_spec(tmp_path / "next", 0.1))
    w.workflow.await_placement(nxt.id, "t-next")
    w.scheduler.run_pass()
    assert w.job(nxt.id).status is JobStatus.QUEUED


def test_a_second_sigterm_stops_the_job_now_and_reports_it(tmp_path: Path) -> None:
    w = World(hosts=1)
    marker = tmp_path / "marks"
    job = _place(w, w.submit(**_spec(marker, 60)))
    a = Agent(w, "h0", tmp_path / "a").start()
    _until(lambda: len(_marks(marker)) == 1, what="the job's start")
    pid = int(_marks(marker)[0][1])
    a.daemon.on_sigterm()
    time.sleep(0.3)
    assert _alive(pid)  # draining: the job goes on
    a.daemon.on_sigterm()
    assert a.thread is not None
    a.thread.join(10)
    assert not a.thread.is_alive() and not _alive(pid)
    ((_, dispatch, error),) = _dispatch(w, "fail")
    assert dispatch == f"dispatch-{job.id}-1" and error == "Berth.Canceled"
    assert [
        (o.ran, o.result.failure.value if o.result and o.result.failure else None) for o in a.outcomes
    ] == [(True, "canceled")]
