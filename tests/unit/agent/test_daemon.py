"""The main loop with fakes: recovery, registration, GPU-aware intake, message deletion, directives, drain."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from berth.domain.agent_wire import Directive, WorkMessage
from berth_agent.config import AgentConfig
from berth_agent.daemon import BUSY_RETRY_S, Daemon, Message, SqsQueue
from berth_agent.gpu_health import GpuHealthWatcher, SimulatedHealthSource
from berth_agent.gpus import Gpu, Inventory
from berth_agent.ledger import AttemptEntry, AttemptLedger

INV = Inventory(
    gpus=(Gpu(0, "GPU-a", "H100", 81920), Gpu(1, "GPU-b", "H100", 81920)), gpu_type="H100", source="simulated"
)


def _msg(job: str, gpus: list[str], attempt: int = 1) -> Message:
    """A work message as the control plane writes it (the wire model both sides import)."""
    body = WorkMessage(
        job_id=job,
        attempt=attempt,
        fencing_token=f"t-{job}",
        rank=0,
        world_size=1,
        gpu_ids=tuple(gpus),
        claim_by=datetime(2030, 1, 1, tzinfo=UTC),
    )
    return Message(body.model_dump_json(), f"r-{job}")


class FakeQueue:
    def __init__(self, batches: list[list[Message]]) -> None:
        self.batches = batches
        self.deleted: list[str] = []
        self.retried: list[tuple[str, int]] = []

    def receive(self, wait_s: int) -> list[Message]:
        if self.batches:
            return self.batches.pop(0)
        time.sleep(0.01)
        return []

    def delete(self, receipt: str) -> None:
        self.deleted.append(receipt)

    def retry_soon(self, receipt: str, delay_s: int) -> None:
        self.retried.append((receipt, delay_s))


class FakeRunner:
    """Claims at once; each attempt runs until released or canceled."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.canceled: list[tuple[str, int, float | None]] = []
        self.release = threading.Event()
        self._events: dict[str, threading.Event] = {}
        self._running: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def run(self, message: Mapping[str, Any], on_claim_answered: Callable[[], None] | None = None) -> None:
        job = str(message["job_id"])
        stop = threading.Event()
        with self.lock:
            self.started.append(job)
            self._events[job] = stop
            self._running[job] = {
                "job_id": job,
                "attempt": message["attempt"],
                "fencing_token": message["fencing_token"],
            }
        if on_claim_answered:
            on_claim_answered()
        while not (stop.is_set() or self.release.is_set()):
            time.sleep(0.01)
        with self.lock:
            self._running.pop(job, None)

    def cancel(self, job_id: str, attempt: int, grace_s: float | None = None) -> None:
        with self.lock:
            self.canceled.append((job_id, attempt, grace_s))
            if job_id in self._events:
                self._events[job_id].set()

    def checkpoints(self) -> list[dict[str, Any]]:
        return []

    def running(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self._running.values())


class FakeApi:
    def __init__(self) -> None:
        self.registered: list[dict[str, Any]] = []
        self.heartbeats: list[dict[str, Any]] = []
        self.reports: list[tuple[Any, ...]] = []
        self.directives: list[dict[str, Any]] = []

    def register(self, inventory: dict[str, Any], agent_version: str = "x") -> Any:
        self.registered.append(inventory)
        return {"host_id": "h1", "queue_url": "https://sqs/q", "heartbeat_s": 0.05, "lease_s": 90}

    def heartbeat(self, *, healthy: bool, draining: bool, attempts: list[dict[str, Any]], **kw: Any) -> Any:
        self.heartbeats.append({"draining": draining, "attempts": attempts, **kw})
        directives, self.directives = self.directives, []
        return {"directives": directives}

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        self.reports.append((job_id, attempt, fencing_token, event, kw.get("failure")))


def _daemon(
    tmp_path: Path, queue: FakeQueue, runner: FakeRunner, api: FakeApi, drain_s: int = 3600
) -> Daemon:
    cfg = AgentConfig(
        api_url="http://x", pool="lab", host_id="h1", work_dir=tmp_path, drain_timeout_s=drain_s
    )
    return Daemon(
        config=cfg,
        inventory=INV,
        api=api,
        runner=runner,
        queue_for=lambda url: queue,
        ledger=AttemptLedger(tmp_path),
        host_facts={"cpu": 32, "memory_gib": 256},
        poll_wait_s=0,
    )


def _until(cond: Callable[[], bool], timeout: float = 5) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    assert cond()


def test_recover_reports_leftovers_lost(tmp_path: Path) -> None:
    AttemptLedger(tmp_path).record(AttemptEntry("j-old", 3, "tok", "process", "berth-j-old-3", pid=None))
    api = FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), FakeRunner(), api)
    assert d.recover() == 1
    assert api.reports == [("j-old", 3, "tok", "failed", "agent_error")] and d.ledger.entries() == []


def test_register_sends_the_inventory(tmp_path: Path) -> None:
    api = FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), FakeRunner(), api)
    d.register()
    assert api.registered == [
        {
            "host_id": "h1",
            "pool": "lab",
            "gpu_type": "H100",
            "gpu_ids": ["GPU-a", "GPU-b"],
            "labels": {"berth/gpu-isolation": "none"},
            "cpu": 32,
            "memory_gib": 256,
        }
    ]
    assert d.heartbeat_s == 0.05


def test_intake_is_gpu_aware_and_deletes_after_the_claim(tmp_path: Path) -> None:
    queue, runner = FakeQueue([]), FakeRunner()
    d = _daemon(tmp_path, queue, runner, FakeApi())
    assert d.offer(queue, _msg("j1", ["GPU-a"]))
    _until(lambda: queue.deleted == ["r-j1"])
    assert not d.offer(queue, _msg("j2", ["GPU-a", "GPU-b"]))  # GPU-a busy: back on the queue soon
    assert queue.deleted == ["r-j1"] and queue.retried == [("r-j2", BUSY_RETRY_S)]
    assert d.offer(queue, _msg("j3", ["GPU-b"]))
    assert not d.offer(queue, Message("not json", "r-bad"))
    assert "r-bad" in queue.deleted
    runner.release.set()
    _until(lambda: not d._threads_alive())
    assert d.offer(queue, _msg("j2", ["GPU-a", "GPU-b"]))  # free again
    _until(lambda: "r-j2" in queue.deleted)


def test_directives(tmp_path: Path) -> None:
    runner, api = FakeRunner(), FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), runner, api)
    d.apply(
        [
            Directive(job_id="j1", attempt=2, action="cancel", reason="user"),
            Directive(job_id=None, attempt=None, action="stop", reason="malformed"),
            Directive(action="bogus"),  # a newer control plane's: logged and ignored
        ]
    )
    assert runner.canceled == [("j1", 2, None)] and not d.draining.is_set()
    api.directives = [{"job_id": None, "attempt": None, "action": "drain", "reason": "maintenance"}]
    d.heartbeat_once()
    assert d.directed_drain.is_set() and not d.draining.is_set()


def test_drain_directive_stops_intake_keeps_jobs_and_lifts(tmp_path: Path) -> None:
    """The control plane's ``drain``: no new claims while answers carry it, running work goes on,
    the agent stays up and reports ``draining``; an answer without it resumes intake."""
    queue = FakeQueue([[_msg("j1", ["GPU-a"])]])
    runner, api = FakeRunner(), FakeApi()
    d = _daemon(tmp_path, queue, runner, api)
    drain = {"job_id": None, "attempt": None, "action": "drain", "reason": "maintenance"}
    beat = api.heartbeat

    def draining_beat(**kw: Any) -> Any:
        api.directives = [drain]
        return beat(**kw)

    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    _until(lambda: runner.started == ["j1"])
    api.heartbeat = draining_beat  # type: ignore[method-assign]
    _until(lambda: d.directed_drain.is_set())
    _until(lambda: any(h["draining"] for h in api.heartbeats))
    queue.batches.append([_msg("j2", ["GPU-b"])])
    time.sleep(0.3)
    assert runner.started == ["j1"] and queue.batches == [[_msg("j2", ["GPU-b"])]]  # not even received
    assert runner.canceled == [] and [r["job_id"] for r in runner.running()] == ["j1"]
    runner.release.set()
    _until(lambda: not d._threads_alive())
    time.sleep(0.2)
    assert t.is_alive()  # a directed drain does not stop the agent
    api.heartbeat = beat  # type: ignore[method-assign]
    _until(lambda: not d.directed_drain.is_set())
    _until(lambda: runner.started == ["j1", "j2"])
    d.on_sigterm()
    t.join(5)
    assert not t.is_alive()


def test_run_drains_on_sigterm_and_returns_when_work_is_done(tmp_path: Path) -> None:
    queue = FakeQueue([[_msg("j1", ["GPU-a"])], [_msg("j2", ["GPU-b"])]])
    runner, api = FakeRunner(), FakeApi()
    d = _daemon(tmp_path, queue, runner, api)
    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    _until(lambda: len(runner.running()) == 2)
    _until(lambda: any(h["attempts"] for h in api.heartbeats))  # heartbeats carry the attempts
    d.on_sigterm()
    assert d.draining.is_set()
    queue.batches.append([_msg("j3", ["GPU-a"])])
    time.sleep(0.1)
    assert t.is_alive() and runner.started == ["j1", "j2"]  # draining: no new work, jobs keep running
    runner.release.set()
    t.join(5)
    assert not t.is_alive()
    assert api.heartbeats[-1] == {"draining": True, "attempts": []}


def test_second_sigterm_cancels_now(tmp_path: Path) -> None:
    queue, runner = FakeQueue([[_msg("j1", ["GPU-a"])]]), FakeRunner()
    d = _daemon(tmp_path, queue, runner, FakeApi())
    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    _until(lambda: len(runner.running()) == 1)
    d.on_sigterm()
    d.on_sigterm()
    t.join(5)
    assert not t.is_alive() and runner.canceled == [("j1", 1, 0)]


def test_drain_timeout_cancels_with_the_grace(tmp_path: Path) -> None:
    queue, runner = FakeQueue([[_msg("j1", ["GPU-a"])]]), FakeRunner()
    d = _daemon(tmp_path, queue, runner, FakeApi(), drain_s=0)
    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    _until(lambda: len(runner.running()) == 1)
    d.on_sigterm()
    t.join(5)
    assert not t.is_alive() and runner.canceled == [("j1", 1, None)]


def test_sqs_queue_adapter() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    class Sqs:
        def receive_message(self, **kw: Any) -> Any:
            calls.append(("receive", kw))
            return {"Messages": [{"Body": "{}", "ReceiptHandle": "rh"}]}

        def delete_message(self, **kw: Any) -> None:
            calls.append(("delete", kw))

        def change_message_visibility(self, **kw: Any) -> None:
            calls.append(("visibility", kw))

    q = SqsQueue(Sqs(), "https://sqs/q")
    assert q.receive(20) == [Message("{}", "rh")]
    q.retry_soon("rh", 1)
    q.delete("rh")
    assert calls == [
        ("receive", {"QueueUrl": "https://sqs/q", "WaitTimeSeconds": 20, "MaxNumberOfMessages": 1}),
        ("visibility", {"QueueUrl": "https://sqs/q", "ReceiptHandle": "rh", "VisibilityTimeout": 1}),
        ("delete", {"QueueUrl": "https://sqs/q", "ReceiptHandle": "rh"}),
    ]


def test_a_busy_message_that_cannot_be_returned_early_is_left_to_its_timeout(tmp_path: Path) -> None:
    class Refusing(FakeQueue):
        def retry_soon(self, receipt: str, delay_s: int) -> None:
            raise ConnectionError("sqs unreachable")

    queue, runner = Refusing([]), FakeRunner()
    d = _daemon(tmp_path, queue, runner, FakeApi())
    assert d.offer(queue, _msg("j1", ["GPU-a"]))
    assert not d.offer(queue, _msg("j2", ["GPU-a"]))  # not taken, and no error out of the loop
    runner.release.set()
    _until(lambda: not d._threads_alive())


def test_lease_lost_stops_the_attempts(tmp_path: Path) -> None:
    queue, runner, api = FakeQueue([[_msg("j1", ["GPU-a"])]]), FakeRunner(), FakeApi()
    d = _daemon(tmp_path, queue, runner, api)

    def failing(**kw: Any) -> Any:
        raise ConnectionError("control plane unreachable")

    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    _until(lambda: len(runner.running()) == 1)
    d.lease_s = 0.2
    api.heartbeat = failing  # type: ignore[method-assign]
    _until(lambda: runner.canceled == [("j1", 1, None)])
    assert d.lease_lost
    d.on_sigterm()
    d.on_sigterm()
    t.join(5)
    assert not t.is_alive()


def test_a_failing_queue_does_not_stop_the_agent(tmp_path: Path) -> None:
    class Flaky(FakeQueue):
        def __init__(self) -> None:
            super().__init__([[_msg("j1", ["GPU-a"])]])
            self.failures = 2

        def receive(self, wait_s: int) -> list[Message]:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("sqs unreachable")
            return super().receive(wait_s)

    queue, runner = Flaky(), FakeRunner()
    d = _daemon(tmp_path, queue, runner, FakeApi())
    d.receive_retry_s = 0.01
    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    _until(lambda: runner.started == ["j1"])
    runner.release.set()
    d.on_sigterm()
    t.join(5)
    assert not t.is_alive() and queue.failures == 0


def test_sigterm_during_a_long_poll_is_acted_on_at_once_and_its_messages_are_not_taken(
    tmp_path: Path,
) -> None:
    class LongPoll(FakeQueue):
        """A 20 s long poll that a message reaches after the SIGTERM."""

        def __init__(self) -> None:
            super().__init__([])
            self.polling = threading.Event()
            self.message_arrives = threading.Event()

        def receive(self, wait_s: int) -> list[Message]:
            self.polling.set()
            self.message_arrives.wait(20)
            return [_msg("j-late", ["GPU-a"])]

    queue, runner = LongPoll(), FakeRunner()
    d = _daemon(tmp_path, queue, runner, FakeApi())
    d.poll_wait_s = 20
    t = threading.Thread(target=d.run, kwargs={"install_signals": False})
    t.start()
    assert queue.polling.wait(5)
    started = time.monotonic()
    d.on_sigterm()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - started < 2  # not after the 20 s poll
    queue.message_arrives.set()
    time.sleep(0.2)
    assert runner.started == [] and queue.deleted == []  # not claimed: it comes back later


def test_a_host_marked_lost_stops_its_attempts_and_registers_again(tmp_path: Path) -> None:
    runner, api = FakeRunner(), FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), runner, api)
    d.register()
    beat = api.heartbeat

    def lost(**kw: Any) -> Any:
        beat(**kw)
        return {
            "lease_expires_at": None,
            "reregister": True,
            "directives": [{"job_id": "j1", "attempt": 1, "action": "stop", "reason": "host lease expired"}],
        }

    api.heartbeat = lost  # type: ignore[method-assign]
    d.heartbeat_once()
    assert runner.canceled == [("j1", 1, None)] and len(api.registered) == 2


def test_an_outage_shorter_than_the_tolerance_keeps_the_attempts(tmp_path: Path) -> None:
    """Past the lease the agent cannot tell a control-plane outage from its own partition: it keeps
    its attempts for the register answer's ``outage_tolerance_s`` and stops them only after it."""
    now = [1000.0]
    runner, api = FakeRunner(), FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), runner, api)
    d._clock = lambda: now[0]
    answer = {"host_id": "h1", "queue_url": "q", "heartbeat_s": 1, "lease_s": 10, "outage_tolerance_s": 30}
    api.register = lambda inventory, agent_version="x": answer  # type: ignore[method-assign]
    d.register()
    assert (d.lease_s, d.outage_tolerance_s) == (10, 30)
    runner._running["j1"] = {"job_id": "j1", "attempt": 1}
    for silent in (5.0, 11.0, 39.0):  # within the lease, then past it but inside the tolerance
        now[0] = 1000.0 + silent
        d._check_lease()
        assert runner.canceled == [] and not d.lease_lost
    now[0] = 1000.0 + 41.0
    d._check_lease()
    assert runner.canceled == [("j1", 1, None)] and d.lease_lost
    d._check_lease()
    assert runner.canceled == [("j1", 1, None)]  # once
    # a heartbeat that gets through again renews: the next outage counts from it
    d.heartbeat_once()
    assert not d.lease_lost


def test_a_control_plane_without_a_tolerance_stops_the_attempts_at_the_lease(tmp_path: Path) -> None:
    now = [0.0]
    runner, api = FakeRunner(), FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), runner, api)
    d._clock = lambda: now[0]
    answer = {"host_id": "h1", "queue_url": "q", "heartbeat_s": 1, "lease_s": 10}
    api.register = lambda inventory, agent_version="x": answer  # type: ignore[method-assign]
    d.register()
    runner._running["j1"] = {"job_id": "j1", "attempt": 1}
    now[0] = 10.5
    d._check_lease()
    assert runner.canceled == [("j1", 1, None)]


def test_the_host_registers_whether_it_enforces_gpu_isolation(tmp_path: Path) -> None:
    from berth_agent import isolation
    from berth_agent.config import ExecutorKind

    api = FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), FakeRunner(), api)
    d.register()
    assert api.registered[-1]["labels"] == {"berth/gpu-isolation": "none"}  # the process executor
    assert isolation.gpu_isolation(ExecutorKind.DOCKER)[0] == "enforced"
    assert isolation.gpu_isolation(ExecutorKind.KUBERNETES)[0] == "enforced"
    level, why = isolation.gpu_isolation(ExecutorKind.PROCESS)
    assert level == "none" and "CUDA_VISIBLE_DEVICES" in why


def test_an_agent_started_during_an_outage_waits_to_register(tmp_path: Path) -> None:
    """A host restarted while the control plane cannot be reached keeps trying (5xx, 429, no
    answer) instead of exiting; a refusal is final."""
    from berth_agent import daemon as daemon_module
    from berth_agent.client import AgentApiError

    api = FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), FakeRunner(), api)
    answers: list[Any] = [
        AgentApiError(503, "ServiceUnavailable", "down"),
        AgentApiError(0, "ConnectionError", "no route"),
        AgentApiError(429, "TooManyRequests", "slow down"),
    ]
    real_register = api.register

    def flaky(inventory: dict[str, Any], agent_version: str = "x") -> Any:
        if answers:
            raise answers.pop(0)
        return real_register(inventory, agent_version)

    api.register = flaky  # type: ignore[method-assign]
    before = daemon_module.REGISTER_RETRY_S
    daemon_module.REGISTER_RETRY_S = (0.01, 0.02)
    try:
        assert d.register_at_start().queue_url == "https://sqs/q"
        assert answers == [] and len(api.registered) == 1

        def refused(inventory: dict[str, Any], agent_version: str = "x") -> Any:
            raise AgentApiError(403, "InventoryRefused", "not admitted")

        api.register = refused  # type: ignore[method-assign]
        with pytest.raises(AgentApiError, match="InventoryRefused"):
            d.register_at_start()
    finally:
        daemon_module.REGISTER_RETRY_S = before


def test_heartbeats_carry_the_cache_only_when_it_changed(tmp_path: Path) -> None:
    api = FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), FakeRunner(), api)
    held: list[dict[str, Any]] = []
    d.cache_report = lambda: list(held)
    d.heartbeat_once()  # the first beat says what is cached, even when nothing is
    d.heartbeat_once()
    held.append({"source": "s3://data/ds/", "version": "v1", "size_bytes": 3})
    d.heartbeat_once()
    d.heartbeat_once()
    assert [h.get("cached_datasets") for h in api.heartbeats] == [[], None, held, None]
    # a failed beat is sent again; so is the cache after registering again (a new host record)
    beat = api.heartbeat
    held.append({"source": "s3://data/other/", "version": "v1", "size_bytes": 1})

    def failing(**kw: Any) -> Any:
        raise OSError("down")

    api.heartbeat = failing  # type: ignore[method-assign]
    with pytest.raises(OSError):
        d.heartbeat_once()
    api.heartbeat = beat  # type: ignore[method-assign]
    d.heartbeat_once()
    d.register()
    d.heartbeat_once()
    assert [h.get("cached_datasets") for h in api.heartbeats[4:]] == [held, held]


def test_heartbeats_carry_gpu_faults_and_a_clear_directive_forgets_one(tmp_path: Path) -> None:
    faults = tmp_path / "gpu-faults.jsonl"
    faults.write_text('{"gpu": 1, "xid": 79}\n')
    api = FakeApi()
    d = _daemon(tmp_path, FakeQueue([]), FakeRunner(), api)
    d.heartbeat_once()
    assert "gpu_faults" not in api.heartbeats[-1]  # no watcher: the heartbeat as it always was
    d.health = GpuHealthWatcher(SimulatedHealthSource(faults, ["GPU-a", "GPU-b"]))
    d.heartbeat_once()
    assert "gpu_faults" not in api.heartbeats[-1]  # nothing seen yet
    d.health.poll_once()
    d.heartbeat_once()
    assert api.heartbeats[-1]["gpu_faults"] == [
        {"fault_id": "sim-1", "gpu_id": "GPU-b", "kind": "xid", "xid": 79, "value": None}
    ]
    api.directives = [
        {"action": "clear-gpu-fault", "gpu_id": "GPU-b", "fault_id": "sim-1", "reason": "an admin cleared it"}
    ]
    d.heartbeat_once()
    d.heartbeat_once()
    assert "gpu_faults" not in api.heartbeats[-1]
