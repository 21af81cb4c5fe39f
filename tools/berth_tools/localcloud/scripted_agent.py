"""A scripted on-prem agent that speaks the dispatch protocol (docs/agent-protocol.md) for the local
cloud and the tests, until the real agent (``agent/``) runs on the hosts.

It is a real protocol client: it signs every agent-API call with its host's own IAM access key,
long-polls its host queue, claims, heartbeats and reports. It does not run the job's command: an
attempt "runs" for ``SCRIPTED_RUN_S`` seconds of the job's env (default 1) and then succeeds, or
fails with ``SCRIPTED_EXIT`` (non-zero: a permanent failure), or, on its first
``SCRIPTED_FAIL_ATTEMPTS`` attempts, fails as ``agent_error`` (transient). ``kill()`` stops it
dead (no more heartbeats or reports), as SIGKILL would stop a host.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import boto3

from berth_tools.localcloud.sigv4 import signed_headers


@dataclass
class HostIdentity:
    host_id: str
    access_key_id: str
    secret_access_key: str


@dataclass
class Inventory:
    host_id: str
    pool: str = "default"
    gpu_type: str = "A100"
    gpu_ids: tuple[str, ...] = ()
    cpu: float = 64
    memory_gib: float = 512
    labels: dict[str, str] = field(default_factory=lambda: {"simulated": "true"})

    def as_dict(self) -> dict[str, Any]:
        return {
            "host_id": self.host_id,
            "pool": self.pool,
            "gpu_type": self.gpu_type,
            "gpu_ids": list(self.gpu_ids),
            "cpu": self.cpu,
            "memory_gib": self.memory_gib,
            "labels": self.labels,
        }


class AgentApiError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body

    @property
    def code(self) -> str:
        if isinstance(self.body, dict):
            return str((self.body.get("error") or {}).get("code", ""))
        return ""


@dataclass
class Attempt:
    job_id: str
    attempt: int
    fencing_token: str
    claim: dict[str, Any]
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""

    def ref(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "fencing_token": self.fencing_token}


class ScriptedAgent:
    def __init__(
        self,
        api_url: str,
        endpoint_url: str,
        region: str,
        identity: HostIdentity,
        inventory: Inventory,
        heartbeat_s: float | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.region = region
        self.identity = identity
        self.inventory = inventory
        self.heartbeat_s = heartbeat_s
        self.sqs = boto3.client(
            "sqs",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=identity.access_key_id,
            aws_secret_access_key=identity.secret_access_key,
        )
        self.queue_url = ""
        self.running: dict[tuple[str, int], Attempt] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.killed = threading.Event()
        self.threads: list[threading.Thread] = []
        #: What happened, for tests: (what, job id, attempt); what is claimed, started, succeeded, ...
        self.log: list[tuple[str, str, int]] = []
        self.registered = threading.Event()

    # -- the agent API ----------------------------------------------------------------------------
    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.api_url}/v1/agent/{path}"
        data = json.dumps(body).encode()
        headers = signed_headers(
            method="POST",
            url=url,
            access_key_id=self.identity.access_key_id,
            secret_access_key=self.identity.secret_access_key,
            region=self.region,
            body=data,
            headers={"Content-Type": "application/json"},
        )
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return dict(json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise AgentApiError(exc.code, parsed) from None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> ScriptedAgent:
        self.register()
        for target in (self._heartbeat_loop, self._poll_loop):
            t = threading.Thread(target=target, daemon=True, name=f"agent-{self.identity.host_id}")
            t.start()
            self.threads.append(t)
        return self

    def register(self) -> None:
        answer = self.call("register", {"inventory": self.inventory.as_dict(), "agent_version": "scripted"})
        self.queue_url = answer["queue_url"]
        if self.heartbeat_s is None:
            self.heartbeat_s = float(answer["heartbeat_s"])
        self.registered.set()

    def stop(self) -> None:
        self.stopping.set()
        for a in list(self.running.values()):
            a.stop.set()

    def kill(self) -> None:
        """Stop dead: no heartbeat, no report, running attempts abandoned (a host lost)."""
        self.killed.set()
        self.stop()

    def _alive(self) -> bool:
        return not self.stopping.is_set()

    def _heartbeat_loop(self) -> None:
        while self._alive():
            if self.stopping.wait(self.heartbeat_s or 1.0):
                return
            try:
                self.heartbeat()
            except Exception:  # transient API errors: try again next beat
                continue

    def heartbeat(self) -> dict[str, Any]:
        with self.lock:
            refs = [a.ref() for a in self.running.values()]
        answer = self.call("heartbeat", {"healthy": True, "attempts": refs})
        if answer.get("reregister"):
            self.register()
        for d in answer.get("directives", []):
            key = (d.get("job_id"), d.get("attempt"))
            attempt = self.running.get(key)
            if attempt is not None and not attempt.stop.is_set():
                attempt.stop_reason = f"{d['action']}:{d.get('reason', '')}"
                attempt.stop.set()
        return answer

    def _poll_loop(self) -> None:
        while self._alive():
            try:
                got = self.sqs.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
                ).get("Messages", [])
            except Exception:
                time.sleep(0.2)
                continue
            for msg in got:
                if not self._alive():
                    return
                self.handle(msg)

    def handle(self, msg: Any) -> None:
        work = json.loads(msg["Body"])
        ref = {k: work[k] for k in ("job_id", "attempt", "fencing_token")}
        try:
            claim = self.call("claim", ref)
        except AgentApiError as exc:
            if exc.status in (404, 409):
                self.log.append((f"refused:{exc.code}", work["job_id"], work["attempt"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=msg["ReceiptHandle"])
            return  # other errors: the message comes back after its visibility timeout
        self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=msg["ReceiptHandle"])
        attempt = Attempt(work["job_id"], work["attempt"], work["fencing_token"], claim)
        with self.lock:
            self.running[(attempt.job_id, attempt.attempt)] = attempt
        self.log.append(("claimed", attempt.job_id, attempt.attempt))
        t = threading.Thread(target=self._run, args=(attempt,), daemon=True)
        t.start()

    def _report(self, attempt: Attempt, event: str, **extra: Any) -> None:
        if self.killed.is_set():
            return
        try:
            self.call("report", {**attempt.ref(), "event": event, **extra})
            self.log.append((event, attempt.job_id, attempt.attempt))
        except AgentApiError as exc:
            self.log.append((f"report-refused:{exc.code}", attempt.job_id, attempt.attempt))

    def _run(self, attempt: Attempt) -> None:
        env = (attempt.claim.get("spec") or {}).get("env") or {}
        run_s = float(env.get("SCRIPTED_RUN_S", "1"))
        exit_code = int(env.get("SCRIPTED_EXIT", "0"))
        fail_attempts = int(env.get("SCRIPTED_FAIL_ATTEMPTS", "0"))
        try:
            self._report(attempt, "started")
            if attempt.stop.wait(run_s):
                if self.killed.is_set():
                    return
                if attempt.stop_reason.startswith("cancel"):
                    self._report(attempt, "canceled", message="stopped on cancel")
                elif attempt.stop_reason.startswith("stop:fenced") or "lease" in attempt.stop_reason:
                    self.log.append(("abandoned", attempt.job_id, attempt.attempt))
                else:
                    self._report(attempt, "failed", failure="preempted", message=attempt.stop_reason)
                return
            if self.killed.is_set():
                return
            if attempt.attempt <= fail_attempts:
                self._report(attempt, "failed", failure="agent_error", message="scripted transient failure")
            elif exit_code != 0:
                self._report(attempt, "failed", failure="nonzero_exit", exit_code=exit_code)
            else:
                self._report(attempt, "succeeded", exit_code=0)
        finally:
            with self.lock:
                self.running.pop((attempt.job_id, attempt.attempt), None)
