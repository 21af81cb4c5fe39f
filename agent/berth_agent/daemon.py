"""The agent's main loop: register, heartbeat, long-poll the host's queue, run attempts, drain.

``Daemon.run()`` is what ``berth-agent`` runs (once the control plane's agent API is in place):

1. leftovers of a previous run (``AttemptLedger``) are reaped (every process of each, leader or
   not: berth_agent.containment) and reported lost, then forgotten; when one survives SIGKILL the
   agent stops (``LeftoverAlive``) rather than offer its GPUs, and systemd starts it again;
2. ``register`` with the inventory; ``sd_notify READY=1``;
3. a heartbeat thread sends ``{healthy, draining, attempts}`` (and ``gpu_faults`` when the GPU health
   watcher, ``gpu_health``, has some) every ``heartbeat_s`` and applies the directives it gets back
   (``cancel``/``stop`` an attempt, ``drain`` the host, ``clear-gpu-fault``). ``drain`` is
   level-triggered: the control plane repeats it in every answer while an operator wants the host
   drained; the agent takes no new work while answers carry it (running attempts go on, the agent
   stays up) and resumes once one comes without it;
4. the main loop long-polls the queue while not draining, and for each ``run`` message whose GPUs
   are all free on this host starts ``AttemptRunner.run`` in a thread; the message is deleted once
   the claim is answered (200 or 409), and left for redelivery otherwise (busy GPUs, no answer);
   it pings the systemd watchdog every turn; when heartbeats fail for longer than the lease, the
   running attempts are canceled (their lease, and so their attempt, may have moved elsewhere);
5. the first SIGTERM drains: no new work, ``STOPPING=1``, running attempts may finish within
   ``drain_timeout_s`` and are canceled (with the cancel grace) after it; a second SIGTERM cancels
   them at once (grace 0). ``run()`` returns when nothing is left running.

Everything it talks to is injected (``api``, ``queue``, ``runner``), so the loop is tested with fakes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from pydantic import ValidationError

from berth.domain.agent_wire import PROTOCOL_VERSION, Directive, HeartbeatAnswer, RegisterAnswer, WorkMessage
from berth_agent import __version__, isolation, sdnotify
from berth_agent.client import AgentApiError
from berth_agent.config import AgentConfig
from berth_agent.gpu_health import GpuHealthWatcher
from berth_agent.gpus import Inventory
from berth_agent.ledger import AttemptLedger
from berth_agent.reports import ReportApi

log = logging.getLogger(__name__)
#: A work message whose GPUs this agent still counts busy is visible again after this long.
BUSY_RETRY_S = 1


class LeftoverAlive(RuntimeError):
    """Processes of an attempt a previous run left survive SIGKILL: its GPUs cannot be offered."""


@dataclass(frozen=True, slots=True)
class Message:
    body: str
    receipt: str


class WorkQueue(Protocol):
    def receive(self, wait_s: int) -> list[Message]: ...
    def delete(self, receipt: str) -> None: ...
    def retry_soon(self, receipt: str, delay_s: int) -> None:
        """Make the message visible again in ``delay_s`` rather than after the visibility timeout."""
        ...


class SqsQueue:
    """The host's own queue through a botocore ``sqs`` client (host identity)."""

    def __init__(self, client: Any, url: str) -> None:
        self._client, self.url = client, url

    def receive(self, wait_s: int) -> list[Message]:
        answer = self._client.receive_message(
            QueueUrl=self.url, WaitTimeSeconds=wait_s, MaxNumberOfMessages=1
        )
        return [Message(m["Body"], m["ReceiptHandle"]) for m in answer.get("Messages", [])]

    def delete(self, receipt: str) -> None:
        self._client.delete_message(QueueUrl=self.url, ReceiptHandle=receipt)

    def retry_soon(self, receipt: str, delay_s: int) -> None:
        self._client.change_message_visibility(
            QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=delay_s
        )


class Runner(Protocol):
    def run(self, message: Mapping[str, Any], on_claim_answered: Callable[[], None] | None = None) -> Any: ...
    def cancel(self, job_id: str, attempt: int, grace_s: float | None = None) -> None: ...
    def running(self) -> list[dict[str, Any]]: ...
    def checkpoints(self) -> list[dict[str, Any]]: ...


class Api(ReportApi, Protocol):
    def register(self, inventory: dict[str, Any], agent_version: str = ...) -> Any: ...
    def heartbeat(
        self,
        *,
        healthy: bool,
        draining: bool,
        attempts: list[dict[str, Any]],
        cached_datasets: list[dict[str, Any]] | None = None,
        checkpoints: list[dict[str, Any]] | None = None,
        gpu_faults: list[dict[str, Any]] | None = None,
    ) -> Any: ...


#: Waits between registrations while the control plane cannot be reached at start: first, cap.
REGISTER_RETRY_S = (1.0, 30.0)


class Daemon:
    def __init__(
        self,
        *,
        config: AgentConfig,
        inventory: Inventory,
        api: Api,
        runner: Runner,
        queue_for: Callable[[str], WorkQueue],
        ledger: AttemptLedger,
        host_facts: Mapping[str, Any] | None = None,
        gpu_isolation: str | None = None,
        poll_wait_s: int = 20,
        clock: Callable[[], float] = time.monotonic,
        cache_report: Callable[[], list[dict[str, Any]]] | None = None,
        health: GpuHealthWatcher | None = None,
    ) -> None:
        self.config, self.inventory, self.api, self.runner = config, inventory, api, runner
        #: Watches the GPUs while the agent runs (``gpu_health``); None: nothing to watch.
        self.health = health
        self.queue_for, self.ledger = queue_for, ledger
        self.host_facts = dict(host_facts or {})
        #: ``berth/gpu-isolation`` (berth_agent.isolation): what the executor enforces on this host.
        self.gpu_isolation = gpu_isolation or isolation.gpu_isolation(config.executor)[0]
        self.poll_wait_s = poll_wait_s
        self._clock = clock
        #: What the object cache holds (``ObjectCache.cached_datasets`` as JSON): sent in a heartbeat
        #: when it differs from what the last accepted beat carried (None: nothing sent yet).
        self.cache_report = cache_report
        self._cache_sent: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._busy: dict[str, tuple[str, int]] = {}  # GPU uuid -> attempt using it
        self._taken: set[tuple[str, int]] = set()  # attempts this agent has taken (running threads)
        self._threads: list[threading.Thread] = []
        self.draining = threading.Event()
        #: The control plane's ``drain`` directive is in force: take no new work, stay up.
        self.directed_drain = threading.Event()
        self.stopping_now = threading.Event()
        self._drain_deadline: float | None = None
        self.heartbeat_s = 30.0
        self.receive_retry_s = 5.0
        self.lease_s = 90.0
        #: How long past the lease this host keeps its attempts without reaching the control plane
        #: (the register answer's; 0 from a control plane that does not send it: stop at the lease).
        self.outage_tolerance_s = 0.0
        self._last_beat_ok = clock()
        self.lease_lost = False
        self._outage_logged = False

    # -- start ---------------------------------------------------------------------------------
    def recover(self) -> int:
        """Reap and report what a previous run left; returns how many attempts were lost."""
        lost = 0
        for left in self.ledger.leftovers():
            e = left.entry
            if not self.ledger.reap(left):
                raise LeftoverAlive(f"processes of {e.job_id} attempt {e.attempt} survive SIGKILL")
            try:
                self.api.report(
                    e.job_id,
                    e.attempt,
                    e.fencing_token,
                    "failed",
                    failure="agent_error",
                    message="lost on agent restart",
                )
            except AgentApiError as exc:
                log.warning("lost attempt not reported", extra={"job_id": e.job_id, "error": str(exc)})
            self.ledger.remove(e)
            lost += 1
        return lost

    def register(self) -> RegisterAnswer:
        inv = self.inventory
        self._cache_sent = None  # the next beat tells a (possibly new) host record what is cached
        inventory = {
            "host_id": self.config.host_id,
            "pool": self.config.pool,
            "gpu_type": inv.gpu_type,
            "gpu_ids": inv.healthy_uuids,
            "labels": {isolation.LABEL: self.gpu_isolation},
            **self.host_facts,
        }
        raw = self.api.register(inventory, agent_version=__version__)
        answer = RegisterAnswer.model_validate(raw)
        self.heartbeat_s = answer.heartbeat_s
        self.lease_s = answer.lease_s
        self.outage_tolerance_s = answer.outage_tolerance_s
        self._last_beat_ok = self._clock()
        log.info(
            "registered",
            extra={"host_id": self.config.host_id, "gpu_type": inv.gpu_type, "gpus": inv.healthy_uuids},
        )
        return answer

    # -- signals and directives ----------------------------------------------------------------
    def on_sigterm(self, signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        if not self.draining.is_set():
            self.drain("SIGTERM")
        else:
            log.warning("second SIGTERM: stopping running attempts now")
            self.stopping_now.set()
            for a in self.runner.running():
                self.runner.cancel(a["job_id"], a["attempt"], grace_s=0)

    def drain(self, why: str) -> None:
        if self.draining.is_set():
            return
        log.info("draining", extra={"why": why, "running": len(self.runner.running())})
        self._drain_deadline = self._clock() + self.config.drain_timeout_s
        self.draining.set()
        sdnotify.stopping(f"draining ({why})")

    def apply(self, directives: Sequence[Directive]) -> None:
        """Act on one heartbeat answer's directives (all of them: a ``drain`` absent from the answer
        ends a directed drain)."""
        drain = False
        for d in directives:
            if d.action == "drain":
                drain = True
            elif d.action in ("cancel", "stop") and d.job_id and d.attempt is not None:
                self.runner.cancel(d.job_id, d.attempt)
            elif d.action == "clear-gpu-fault" and d.gpu_id and d.fault_id and self.health is not None:
                self.health.clear(d.gpu_id, d.fault_id)
            else:
                log.warning("unknown directive ignored", extra={"directive": d.model_dump()})
        if drain and not self.directed_drain.is_set():
            log.info("drain directive: taking no new work", extra={"running": len(self.runner.running())})
            self.directed_drain.set()
        elif not drain and self.directed_drain.is_set():
            log.info("drain directive lifted: taking work again")
            self.directed_drain.clear()

    def heartbeat_once(self) -> None:
        extra: dict[str, Any] = {}
        cached = self._cache_changes()
        if cached is not None:
            extra["cached_datasets"] = cached
        checkpoints = self.runner.checkpoints()
        if checkpoints:  # each running attempt's last synced checkpoint (time and size)
            extra["checkpoints"] = checkpoints
        faults = [] if self.health is None else self.health.reports()
        if faults:  # the GPU faults only when there are some (docs/agent-protocol.md)
            extra["gpu_faults"] = [f.model_dump(mode="json") for f in faults]
        answer = self.api.heartbeat(
            healthy=True,
            draining=self.draining.is_set() or self.directed_drain.is_set(),
            attempts=self.runner.running(),
            **extra,
        )
        if cached is not None:
            self._cache_sent = cached
        self._last_beat_ok = self._clock()
        self.lease_lost = False
        self._outage_logged = False
        beat = HeartbeatAnswer.model_validate(answer or {})
        self.apply(beat.directives)
        if beat.reregister:
            # The control plane marked this host lost (its attempts were failed and are stopped by
            # the directives above): register again to get new work.
            log.warning("host was marked lost: registering again")
            self.register()

    def _cache_changes(self) -> list[dict[str, Any]] | None:
        """The cache's datasets when they changed since the last accepted beat, else None."""
        if self.cache_report is None:
            return None
        try:
            now = self.cache_report()
        except Exception as exc:  # a preference only: never a reason to miss a beat
            log.warning("could not read the cache's datasets", extra={"error": str(exc)})
            return None
        return None if now == self._cache_sent else now

    def _heartbeats(self, done: threading.Event) -> None:
        while not done.wait(self.heartbeat_s):
            try:
                self.heartbeat_once()
            except Exception as exc:  # the lease survives a missed beat or two; keep beating
                log.warning("heartbeat failed", extra={"error": str(exc)})
                self._check_lease()

    def _check_lease(self) -> None:
        """Without a heartbeat, an agent cannot tell a control-plane outage from its own partition.
        Past the lease it keeps its attempts for ``outage_tolerance_s`` (an outage that short costs
        nothing); after that the control plane may soon declare this host lost and place them
        elsewhere (it waits a margin longer than this), so they are stopped here first and never run
        twice at once."""
        silent_s = self._clock() - self._last_beat_ok
        if self.lease_lost or silent_s <= self.lease_s:
            return
        limit_s = self.lease_s + self.outage_tolerance_s
        if silent_s <= limit_s:
            if not self._outage_logged:
                self._outage_logged = True
                log.warning(
                    "control plane unreachable past the lease: attempts keep running",
                    extra={"silent_s": round(silent_s, 1), "stop_in_s": round(limit_s - silent_s, 1)},
                )
            return
        self.lease_lost = True
        running = self.runner.running()
        log.error("lease lost: stopping this host's attempts", extra={"attempts": len(running)})
        for a in running:
            self.runner.cancel(a["job_id"], a["attempt"])

    # -- work ----------------------------------------------------------------------------------
    def offer(self, queue: WorkQueue, message: Message) -> bool:
        """Start the attempt ``message`` names if its GPUs are free; True when it was taken."""
        try:
            parsed = WorkMessage.model_validate_json(message.body)  # protocol 1, kind run: else refused
            body = parsed.model_dump(mode="json")
            key = (parsed.job_id, parsed.attempt)
            gpus = list(parsed.gpu_ids)
            valid = True
        except ValidationError:  # not JSON at all is a ValidationError too
            valid = False
        if not valid:
            log.error(
                "unreadable work message deleted",
                extra={"body": message.body[:200], "protocol": PROTOCOL_VERSION},
            )
            queue.delete(message.receipt)
            return False
        with self._lock:
            if key in self._taken:
                # A duplicate delivery of an attempt this agent already runs: its claim was answered,
                # so the message is spent (it would come back every visibility timeout otherwise).
                log.info("duplicate work message deleted", extra={"job_id": key[0], "attempt": key[1]})
                queue.delete(message.receipt)
                return False
            busy = any(g in self._busy for g in gpus)
            if not busy:
                for g in gpus:
                    self._busy[g] = key
                self._taken.add(key)
        if busy:
            # The control plane freed these GPUs (the attempt before reported its end) while its
            # thread here still finishes up: back on the queue in a second, not after the queue's
            # visibility timeout (60 s, the dispatch's whole heartbeat window).
            self._retry_soon(queue, message, key)
            return False

        def work() -> None:
            try:
                self.runner.run(body, on_claim_answered=lambda: queue.delete(message.receipt))
            except Exception:
                log.exception("attempt failed in the agent", extra={"job_id": key[0], "attempt": key[1]})
            finally:
                with self._lock:
                    for g in gpus:
                        self._busy.pop(g, None)
                    self._taken.discard(key)

        t = threading.Thread(target=work, name=f"attempt-{key[0]}-{key[1]}", daemon=True)
        self._threads.append(t)
        t.start()
        return True

    def _retry_soon(self, queue: WorkQueue, message: Message, key: tuple[str, int]) -> None:
        try:
            queue.retry_soon(message.receipt, BUSY_RETRY_S)
        except Exception as exc:  # it comes back after the visibility timeout all the same
            log.warning(
                "busy work message not returned early",
                extra={"job_id": key[0], "attempt": key[1], "error": str(exc)},
            )

    def _reap_threads(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]

    def loop_once(self, queue: WorkQueue) -> None:
        sdnotify.watchdog()
        self._reap_threads()
        if self.draining.is_set():
            if self._drain_deadline is not None and self._clock() >= self._drain_deadline:
                for a in self.runner.running():
                    self.runner.cancel(a["job_id"], a["attempt"])
                self._drain_deadline = None
            time.sleep(0.2)
            return
        if self.directed_drain.is_set():  # no new work; messages stay queued for others or later
            self.draining.wait(0.2)
            return
        try:
            messages = self._receive(queue)
        except Exception as exc:  # the queue unreachable: running jobs go on; retry after a pause
            log.warning("queue receive failed", extra={"error": str(exc)})
            self.draining.wait(self.receive_retry_s)
            return
        if self.draining.is_set() or self.directed_drain.is_set():
            # A drain began during the poll: these are not taken (they come back after the
            # queue's visibility timeout, to this host once it runs again or to nobody).
            return
        for message in messages:
            self.offer(queue, message)

    def _receive(self, queue: WorkQueue) -> list[Message]:
        """Long-poll in a helper thread, so that a drain is acted on at once rather than after up to
        ``poll_wait_s``; a poll abandoned by a drain delivers nothing (its messages come back)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def poll() -> None:
            try:
                box["messages"] = queue.receive(self.poll_wait_s)
            except Exception as exc:
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=poll, daemon=True, name="queue-poll").start()
        while not done.wait(0.05):
            if self.draining.is_set():
                return []
        if "error" in box:
            raise box["error"]
        return list(box["messages"])

    def register_at_start(self) -> RegisterAnswer:
        """Register, waiting while the control plane cannot be reached (an outage, this host's
        partition, throttling: 5xx, 429, no answer), as a host restarted during one must rather than
        exit; a refusal (4xx: another host's identity, an inventory an admin has not admitted) ends
        the agent."""
        delay = REGISTER_RETRY_S[0]
        while True:
            try:
                return self.register()
            except AgentApiError as exc:
                if exc.status and exc.status < 500 and exc.status != 429:
                    raise
                log.warning("cannot register yet; retrying", extra={"error": str(exc), "retry_in_s": delay})
            if self.draining.wait(delay):
                raise AgentApiError(0, "Stopped", "stopped before the control plane answered a registration")
            delay = min(REGISTER_RETRY_S[1], delay * 2)

    def run(self, install_signals: bool = True) -> None:
        self.recover()
        answer = self.register_at_start()
        queue = self.queue_for(answer.queue_url)
        if install_signals:
            signal.signal(signal.SIGTERM, self.on_sigterm)
            signal.signal(signal.SIGINT, self.on_sigterm)
        sdnotify.ready(f"host {self.config.host_id}: {len(self.inventory.healthy_uuids)} GPUs")
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeats, args=(done,), daemon=True, name="heartbeat")
        beat.start()
        if self.health is not None:
            threading.Thread(target=self.health.run, args=(done,), daemon=True, name="gpu-health").start()
        try:
            while not (self.draining.is_set() and not self._threads_alive()):
                self.loop_once(queue)
        finally:
            done.set()
            beat.join(timeout=5)
            try:
                self.heartbeat_once()  # the control plane learns at once that nothing runs here
            except Exception as exc:
                log.warning("last heartbeat failed", extra={"error": str(exc)})

    def _threads_alive(self) -> bool:
        self._reap_threads()
        return bool(self._threads)
