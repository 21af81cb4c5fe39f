"""Ship a job's output to CloudWatch Logs: one stream per attempt, batched, in order, never blocking.

Group ``/berth/jobs/<tenant>`` and stream ``<job_id>/<attempt>`` (the names the attempt's scoped
credentials allow, berth.domain.job_access). Use::

    shipper = LogShipper(logs_client, log_group(tenant), log_stream(job_id, attempt), settings=config.logs)
    shipper.start()
    executor.start(launch, on_line=shipper.emit_line)
    ...
    shipper.close(timeout_s=30)   # flushes what is left, then stops

``emit`` only appends to an in-memory buffer under a lock: the job's output readers never wait on
the network. The buffer is bounded in bytes (``buffer_max_bytes``, each line's object
overhead counted, so it bounds memory; plus the one batch in flight): when the sink falls behind,
new lines are dropped and counted, and the next line that fits is preceded by a marker line
saying how many were lost (one more marker at close if the
last lines were dropped), so memory stays bounded and the gap is visible in the log itself.
A sender thread takes batches from the front within PutLogEvents' limits (10,000 events, 1 MiB
counting 26 bytes per event, 24 hours span, non-decreasing timestamps) and retries throttling,
service and connection errors with capped exponential backoff and jitter; a batch is removed
from the buffer only once accepted, so order is kept and nothing is sent twice by the shipper.
The client is injected: a botocore ``logs`` client built with the attempt's credentials in
production (``set_client`` swaps it when they are refreshed), a fake in tests.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from berth_agent.config import LogConfig

log = logging.getLogger(__name__)

EVENT_OVERHEAD = 26
#: What one buffered line costs in memory beyond its text (tuple, str and int headers), counted
#: against ``buffer_max_bytes`` so that the bound holds for the process's memory, not just the text.
ENTRY_OVERHEAD = 150
#: Room a drop marker line needs (its text is under 120 bytes).
_MARKER_RESERVE = 120 + EVENT_OVERHEAD + ENTRY_OVERHEAD
MAX_EVENT_BYTES = 256 * 1024 - EVENT_OVERHEAD
MAX_SPAN_MS = 24 * 3600 * 1000
RETRYABLE = frozenset(
    {
        "ThrottlingException",
        "ServiceUnavailableException",
        "InternalFailure",
        "RequestLimitExceeded",
        "ExpiredTokenException",
        "UnrecognizedClientException",
    }
)


def log_group(tenant: str, prefix: str = "/berth/jobs") -> str:
    return f"{prefix}/{tenant}"


def log_stream(job_id: str, attempt: int) -> str:
    """``<job id>/<attempt>``; an array task's ``:`` becomes ``_`` (CloudWatch refuses ``:``)."""
    return f"{job_id.replace(':', '_')}/{attempt}"


class LogsClient(Protocol):
    def put_log_events(self, **kwargs: Any) -> Any: ...
    def create_log_stream(self, **kwargs: Any) -> Any: ...


@dataclass
class ShipperStats:
    sent_events: int = 0
    sent_batches: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0
    rejected_events: int = 0
    retries: int = 0
    peak_buffered_bytes: int = 0


def _fit(message: str) -> tuple[str, int]:
    """The message as CloudWatch takes it (non-empty, at most MAX_EVENT_BYTES) and its batch cost."""
    data = message.encode("utf-8", "replace") or b" "
    if len(data) > MAX_EVENT_BYTES:
        data = data[:MAX_EVENT_BYTES]
        message = data.decode("utf-8", "ignore")
        data = message.encode()
    elif not message:
        message = " "
    return message, len(data) + EVENT_OVERHEAD


class LogShipper:
    def __init__(
        self,
        client: LogsClient,
        group: str,
        stream: str,
        *,
        settings: LogConfig | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        sleep: Callable[[float], None] = time.sleep,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 10.0,
    ) -> None:
        cfg = settings or LogConfig()
        self._client = client
        self.group, self.stream = group, stream
        self.max_buffer_bytes = cfg.buffer_max_bytes
        self.batch_max_events = cfg.batch_max_events
        self.batch_max_bytes = cfg.batch_max_bytes
        self.flush_interval_s = cfg.flush_interval_s
        self._clock_ms = clock_ms
        self._sleep = sleep
        self._backoff = (backoff_base_s, backoff_max_s)
        self._cond = threading.Condition()
        self._buf: deque[tuple[int, str, int]] = deque()  # (timestamp ms, message, cost bytes)
        self._buffered = 0
        self._last_ts = 0
        self._pending_drops = 0
        self._pending_drop_bytes = 0
        self._closing = False
        self._deadline: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"logship-{stream}")
        self.stats = ShipperStats()

    # -- producer side (never blocks on the network) ---------------------------------------------
    def emit_line(self, stream: str, line: str) -> None:
        """A ``LineSink`` for the executors."""
        self.emit(line)

    def emit(self, message: str, ts_ms: int | None = None) -> bool:
        """Buffer one line; False when it was dropped because the buffer is full."""
        message, cost = _fit(message)
        with self._cond:
            ts = max(self._last_ts, ts_ms if ts_ms is not None else self._clock_ms())
            need = cost + ENTRY_OVERHEAD
            marker = None
            if self._pending_drops and self._buffered + need + _MARKER_RESERVE <= self.max_buffer_bytes:
                marker = _fit(self._marker_text())  # only built once the line could fit with it
                need += marker[1] + ENTRY_OVERHEAD
            if (self._pending_drops and marker is None) or self._buffered + need > self.max_buffer_bytes:
                self._pending_drops += 1
                self._pending_drop_bytes += cost
                self.stats.dropped_lines += 1
                self.stats.dropped_bytes += cost
                return False
            if marker is not None:
                self._buf.append((ts, marker[0], marker[1]))
                self._pending_drops = self._pending_drop_bytes = 0
            self._buf.append((ts, message, cost))
            self._last_ts = ts
            self._buffered += need
            self.stats.peak_buffered_bytes = max(self.stats.peak_buffered_bytes, self._buffered)
            if self._buffered >= self.batch_max_bytes or len(self._buf) >= self.batch_max_events:
                self._cond.notify()
            return True

    @property
    def buffered_bytes(self) -> int:
        with self._cond:
            return self._buffered

    def set_client(self, client: LogsClient) -> None:
        """Use a new client (refreshed credentials) from the next request on."""
        self._client = client

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._create_stream()
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> bool:
        """Send what is buffered (trying until ``timeout_s``), then stop. True when all was sent."""
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s + 1.0)
        with self._cond:
            return not self._buf and not self._pending_drops

    # -- sender --------------------------------------------------------------------------------
    def _take_batch(self) -> tuple[list[dict[str, Any]], int, int]:
        events: list[dict[str, Any]] = []
        size = 0
        first_ts = None
        for ts, message, cost in self._buf:
            if len(events) >= self.batch_max_events or size + cost > self.batch_max_bytes:
                break
            if first_ts is None:
                first_ts = ts
            elif ts - first_ts > MAX_SPAN_MS:
                break
            events.append({"timestamp": ts, "message": message})
            size += cost
        return events, len(events), size

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            with self._cond:
                while True:
                    if self._closing and self._pending_drops:
                        self._append_final_marker()
                    now = time.monotonic()
                    full = self._buffered >= self.batch_max_bytes or len(self._buf) >= self.batch_max_events
                    if self._buf and (full or self._closing or now >= next_flush):
                        break
                    if self._closing:
                        return
                    if not self._buf:
                        next_flush = now + self.flush_interval_s
                    self._cond.wait(max(0.001, next_flush - now))
                events, count, size = self._take_batch()
            if not self._send(events):
                return  # closing, and the deadline passed: what is left stays unsent (close says so)
            with self._cond:
                for _ in range(count):
                    self._buf.popleft()
                self._buffered -= size + count * ENTRY_OVERHEAD
            next_flush = time.monotonic() + self.flush_interval_s

    def _marker_text(self) -> str:
        return (
            f"[berth] {self._pending_drops} log lines ({self._pending_drop_bytes} bytes) were dropped: "
            "the log sink fell behind"
        )

    def _append_final_marker(self) -> None:
        message, cost = _fit(self._marker_text())
        self._buf.append((self._last_ts, message, cost))
        self._buffered += cost + ENTRY_OVERHEAD
        self._pending_drops = self._pending_drop_bytes = 0

    def _send(self, events: list[dict[str, Any]]) -> bool:
        """True when the batch is done with (accepted, or refused for good and counted)."""
        attempt = 0
        while True:
            try:
                answer = self._client.put_log_events(
                    logGroupName=self.group, logStreamName=self.stream, logEvents=events
                )
                rejected = (answer or {}).get("rejectedLogEventsInfo")
                if rejected:
                    log.warning("CloudWatch rejected some log events", extra={"info": rejected})
                    self.stats.rejected_events += 1
                self.stats.sent_events += len(events)
                self.stats.sent_batches += 1
                return True
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code == "ResourceNotFoundException":  # the stream (not yet) there: create, retry
                    self._create_stream()
                elif code == "DataAlreadyAcceptedException":
                    return True
                elif code not in RETRYABLE:
                    log.error("log batch refused; dropped", extra={"code": code, "events": len(events)})
                    self.stats.rejected_events += len(events)
                    return True
            except (ConnectionError, HTTPClientError) as exc:
                log.warning("CloudWatch Logs unreachable; retrying", extra={"error": str(exc)})
            attempt += 1
            self.stats.retries += 1
            if self._closing and self._deadline is not None and time.monotonic() >= self._deadline:
                return False
            base, cap = self._backoff
            self._sleep(min(cap, base * 2 ** min(attempt, 16)) * random.uniform(0.5, 1.0))

    def _create_stream(self) -> None:
        try:
            self._client.create_log_stream(logGroupName=self.group, logStreamName=self.stream)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceAlreadyExistsException":
                log.warning("log stream not created; retried on send", extra={"error": str(exc)})
        except (ConnectionError, HTTPClientError) as exc:
            log.warning("log stream not created", extra={"error": str(exc)})
