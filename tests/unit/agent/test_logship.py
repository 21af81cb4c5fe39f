"""The CloudWatch Logs shipper against a fake client: limits, order, retries, bounded memory."""

from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from berth_agent.config import LogConfig
from berth_agent.logship import EVENT_OVERHEAD, MAX_EVENT_BYTES, LogShipper, log_group, log_stream


def _error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "PutLogEvents")


class FakeLogs:
    """Checks every PutLogEvents limit on each batch, like the service would."""

    def __init__(
        self, fail_first: list[Exception] | None = None, gate: threading.Event | None = None
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.batches = 0
        self.fail = list(fail_first or [])
        self.gate = gate
        self.streams: list[str] = []
        self.lock = threading.Lock()

    def create_log_stream(self, **kw: Any) -> None:
        if kw["logStreamName"] in self.streams:
            raise _error("ResourceAlreadyExistsException")
        self.streams.append(kw["logStreamName"])

    def put_log_events(self, **kw: Any) -> dict[str, Any]:
        if self.gate is not None:
            self.gate.wait()
        if self.fail:
            raise self.fail.pop(0)
        events = kw["logEvents"]
        assert 1 <= len(events) <= 10_000
        assert sum(len(e["message"].encode()) + EVENT_OVERHEAD for e in events) <= 1_048_576
        ts = [e["timestamp"] for e in events]
        assert ts == sorted(ts) and ts[-1] - ts[0] <= 24 * 3600 * 1000
        assert all(e["message"] for e in events)
        with self.lock:
            self.events += events
            self.batches += 1
        return {"nextSequenceToken": "x"}


def _shipper(client: Any, **cfg: Any) -> LogShipper:
    settings = LogConfig(**{"flush_interval_s": 0.05, **cfg})
    return LogShipper(
        client, log_group("vision"), log_stream("j1", 1), settings=settings, backoff_base_s=0.001
    )


def test_names() -> None:
    assert log_group("vision") == "/berth/jobs/vision" and log_stream("j1", 2) == "j1/2"


def test_flood_of_200k_lines_arrives_complete_and_in_order() -> None:
    client = FakeLogs()
    s = _shipper(client, buffer_max_bytes=64 * 1024 * 1024)
    s.start()
    n = 200_000
    for i in range(n):
        assert s.emit(f"line {i} " + "x" * 20)
    assert s.close(timeout_s=60)
    assert len(client.events) == n
    assert [e["message"].split()[1] for e in client.events[:5]] == ["0", "1", "2", "3", "4"]
    assert all(e["message"].startswith(f"line {i} ") for i, e in enumerate(client.events))
    assert client.batches >= n // 10_000 and s.stats.dropped_lines == 0


def test_memory_stays_bounded_when_the_sink_stalls_and_the_gap_is_marked() -> None:
    gate = threading.Event()
    client = FakeLogs(gate=gate)
    bound = 2 * 1024 * 1024
    s = _shipper(client, buffer_max_bytes=bound, batch_max_bytes=128 * 1024)
    s.start()
    n = 200_000
    t0 = time.monotonic()
    tracemalloc.start()  # slow: traced over the first 30k lines only, far past the buffer filling up
    accepted = sum(s.emit(f"line {i} " + "y" * 50) for i in range(30_000))
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    accepted += sum(s.emit(f"line {i} " + "y" * 50) for i in range(30_000, n))
    assert time.monotonic() - t0 < 30  # emit never waited on the stalled sink
    assert s.stats.peak_buffered_bytes <= bound and s.buffered_bytes <= bound
    assert held < 1.2 * bound  # the bound is on real memory (line objects included), not just text
    assert s.stats.dropped_lines == n - accepted > 0
    gate.set()
    while s.buffered_bytes > bound // 2:
        time.sleep(0.01)
    assert s.emit("after the stall")
    assert s.close(timeout_s=30)
    messages = [e["message"] for e in client.events]
    assert len(messages) == accepted + 2  # one marker before "after the stall"
    assert messages[-2].startswith(f"[berth] {n - accepted} log lines") and messages[-1] == "after the stall"
    kept = [int(m.split()[1]) for m in messages[:-2]]
    assert kept == sorted(kept) and kept[0] == 0


def test_drops_at_the_end_are_marked_at_close() -> None:
    gate = threading.Event()
    client = FakeLogs(gate=gate)
    s = _shipper(client, buffer_max_bytes=64 * 1024)
    s.start()
    for i in range(5000):
        s.emit(f"{i} " + "z" * 100)
    gate.set()
    assert s.close(timeout_s=10)
    assert client.events[-1]["message"].startswith("[berth]") and "dropped" in client.events[-1]["message"]


def test_throttling_and_connection_errors_are_retried_without_loss_or_duplicates() -> None:
    errors: list[Exception] = [
        _error("ThrottlingException"),
        EndpointConnectionError(endpoint_url="https://logs"),
        _error("ServiceUnavailableException"),
        _error("ResourceNotFoundException"),
    ]
    client = FakeLogs(fail_first=errors)
    s = _shipper(client)
    s.start()
    for i in range(1000):
        s.emit(str(i))
    assert s.close(timeout_s=10)
    assert [e["message"] for e in client.events] == [str(i) for i in range(1000)]
    assert s.stats.retries == 4 and client.streams == ["j1/1"]


def test_a_permanent_refusal_drops_that_batch_only() -> None:
    client = FakeLogs(fail_first=[_error("InvalidParameterException")])
    s = _shipper(client, batch_max_events=10)
    s.start()
    for i in range(30):
        s.emit(str(i))
    assert s.close(timeout_s=10)
    assert [e["message"] for e in client.events] == [str(i) for i in range(10, 30)]
    assert s.stats.rejected_events == 10


def test_close_gives_up_at_its_deadline_when_the_sink_is_down() -> None:
    client = FakeLogs(fail_first=[_error("ThrottlingException")] * 10_000)
    s = _shipper(client)
    s.start()
    s.emit("never delivered")
    t0 = time.monotonic()
    assert s.close(timeout_s=0.3) is False
    assert time.monotonic() - t0 < 3


def test_timestamps_non_decreasing_oversized_and_empty_lines() -> None:
    client = FakeLogs()
    s = _shipper(client)
    s.start()
    s.emit("late", ts_ms=2000)
    s.emit("earlier clock", ts_ms=1000)
    s.emit("", ts_ms=1500)
    s.emit("é" * (MAX_EVENT_BYTES // 2 + 10), ts_ms=2000)
    assert s.close(timeout_s=10)
    ts = [e["timestamp"] for e in client.events]
    assert ts == [2000, 2000, 2000, 2000]
    assert client.events[2]["message"] == " "
    assert len(client.events[3]["message"].encode()) <= MAX_EVENT_BYTES


def test_batches_respect_the_byte_limit() -> None:
    client = FakeLogs()
    s = _shipper(client, buffer_max_bytes=8 * 1024 * 1024)
    s.start()
    for _ in range(20):
        s.emit("q" * 200_000)
    assert s.close(timeout_s=10)
    assert len(client.events) == 20 and client.batches >= 4


@pytest.mark.parametrize("code", ["ExpiredTokenException"])
def test_swapping_the_client_after_expired_credentials(code: str) -> None:
    old = FakeLogs(fail_first=[_error(code)] * 1_000_000)
    s = _shipper(old)
    s.start()
    s.emit("hello")
    time.sleep(0.1)
    new = FakeLogs()
    s.set_client(new)
    assert s.close(timeout_s=10)
    assert [e["message"] for e in new.events] == ["hello"]


def test_a_job_flooding_stdout_arrives_complete_and_in_order(tmp_path: Any) -> None:
    from berth_agent.executors import Launch, ProcessExecutor

    client = FakeLogs()
    s = _shipper(client, buffer_max_bytes=256 * 1024 * 1024)
    s.start()
    launch = Launch("j1", 1, "vision", ("seq", "200000"), tmp_path)
    result = ProcessExecutor().start(launch, s.emit_line).wait(60)
    assert result is not None and result.succeeded
    assert s.close(timeout_s=60)
    assert [e["message"] for e in client.events] == [str(i) for i in range(1, 200_001)]
