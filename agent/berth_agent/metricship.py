"""Send attempts' usage samples to the control plane (``POST /v1/agent/metrics``), never blocking a job.

``add`` only appends a sample to its attempt's queue under a lock. The queue is bounded
(``buffer_max_samples`` per attempt): when the agent API cannot be reached for a while, the oldest
samples are dropped (and counted) so memory stays bounded and the newest picture survives. A sender
thread (a daemon thread, started with the first sample) sends each attempt's queue every
``send_interval_s`` in batches of at most ``batch_max_samples``, oldest first, each with the
attempt's fencing token; a batch leaves the queue only once the API accepted it, and the API keys a
sample by (attempt, host, time), so a batch sent again after a lost answer is stored once.

``flush`` sends what an attempt still has right away, before its final report (after that its
fencing token no longer admits samples). An answer that the attempt is no longer this host's
(409 Fenced, 404) or that the samples are refused (422, e.g. a host clock far off) drops them: no
retry can succeed.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from berth_agent.client import AgentApiError, Unreachable
from berth_agent.usage import JobUsage

log = logging.getLogger(__name__)

MIB = 1024 * 1024
Key = tuple[str, int]


class MetricsApi(Protocol):
    def metrics(
        self, job_id: str, attempt: int, fencing_token: str, samples: list[dict[str, Any]]
    ) -> Any: ...


def sample_body(usage: JobUsage) -> dict[str, Any]:
    """A ``JobUsage`` as the agent API takes it (``berth.domain.observability.MetricSample``)."""
    return {
        "at": datetime.fromtimestamp(usage.at, UTC).isoformat(timespec="milliseconds"),
        "cpu_pct": round(usage.cpu_pct, 1),
        "rss_mib": round(usage.rss_bytes / MIB, 1),
        "processes": usage.processes,
        "gpus": [
            {
                "uuid": g.uuid,
                "utilization_pct": g.utilization_pct,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "job_memory_mib": g.job_memory_mib,
            }
            for g in usage.gpus
        ],
    }


@dataclass
class _Queue:
    token: str
    samples: deque[dict[str, Any]] = field(default_factory=deque)


class MetricsShipper:
    def __init__(
        self,
        api: MetricsApi,
        *,
        send_interval_s: float = 10.0,
        buffer_max_samples: int = 360,
        batch_max_samples: int = 100,
        wait: Callable[[threading.Event, float], bool] | None = None,
    ) -> None:
        self._api = api
        self.send_interval_s = send_interval_s
        self.buffer_max_samples = buffer_max_samples
        self.batch_max_samples = batch_max_samples
        self._wait = wait or (lambda event, s: event.wait(s))
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one sender at a time: batches leave in order
        self._queues: dict[Key, _Queue] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Samples dropped because the queue was full or the API refused them (per attempt).
        self.dropped: dict[Key, int] = {}

    # -- the attempt's side (never waits on the network) ------------------------------------------
    def add(self, key: Key, token: str, usage: JobUsage) -> None:
        with self._lock:
            q = self._queues.setdefault(key, _Queue(token))
            q.token = token
            q.samples.append(sample_body(usage))
            while len(q.samples) > self.buffer_max_samples:
                q.samples.popleft()
                self.dropped[key] = self.dropped.get(key, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="metricship")
                self._thread.start()

    def pending(self, key: Key) -> int:
        with self._lock:
            q = self._queues.get(key)
            return 0 if q is None else len(q.samples)

    def flush(self, key: Key) -> None:
        """Send everything ``key`` has queued now (best effort: a failure keeps it queued)."""
        self._send(key)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._queues.pop(key, None)
            self.dropped.pop(key, None)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the sender ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._wait(self._stop, self.send_interval_s):
            self.send_all()

    def send_all(self) -> None:
        with self._lock:
            keys = list(self._queues)
        for key in keys:
            self._send(key)

    def _send(self, key: Key) -> None:
        with self._send_lock:
            while True:
                with self._lock:
                    q = self._queues.get(key)
                    if q is None or not q.samples:
                        return
                    batch = list(q.samples)[: self.batch_max_samples]
                    token = q.token
                try:
                    self._api.metrics(key[0], key[1], token, batch)
                except Unreachable as exc:
                    log.warning(
                        "metrics not sent; kept for the next try",
                        extra={"job_id": key[0], "attempt": key[1], "error": str(exc)},
                    )
                    return
                except AgentApiError as exc:
                    # Fenced (409), not this host's (404), refused (422): no retry can succeed.
                    log.warning(
                        "metrics refused; dropped",
                        extra={"job_id": key[0], "attempt": key[1], "error": str(exc)},
                    )
                    with self._lock:
                        q2 = self._queues.get(key)
                        if q2 is not None:
                            self.dropped[key] = self.dropped.get(key, 0) + len(q2.samples)
                            q2.samples.clear()
                    return
                except Exception as exc:  # never let the sender thread die
                    log.warning("metrics send failed", extra={"job_id": key[0], "error": str(exc)})
                    return
                with self._lock:
                    q2 = self._queues.get(key)
                    if q2 is not None:
                        # Remove exactly what was sent: the front of the queue, unless the bound
                        # already dropped some of it meanwhile.
                        sent = {id(s) for s in batch}
                        while q2.samples and id(q2.samples[0]) in sent:
                            q2.samples.popleft()
