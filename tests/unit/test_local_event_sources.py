"""The local cloud's pollers and timer wait for work instead of spinning: the stream poller sleeps until
a stream write wakes it, the timer backs off while nothing is in flight, and stop() wakes both."""

from __future__ import annotations

import threading
import time
from typing import Any

from berth_tools.localcloud import event_sources
from berth_tools.localcloud.moto_streams import StreamSignal


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


class FakeStreams:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.reads = 0
        self.delivered = 0  # records handed out by get_records
        self.lock = threading.Lock()

    def describe_stream(self, StreamArn: str) -> dict[str, Any]:
        return {"StreamDescription": {"Shards": [{"ShardId": "s"}]}}

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        return {"ShardIterator": "0"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        with self.lock:
            self.reads += 1
            start = int(ShardIterator)
            got = self.records[start : start + Limit]
            self.delivered += len(got)
            return {"Records": got, "NextShardIterator": str(start + len(got))}


class FakeLambda:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def invoke(self, FunctionName: str, Payload: bytes) -> dict[str, Any]:
        import io
        import json

        self.events.append(json.loads(Payload))
        return {"Payload": io.BytesIO(b"null")}


def test_a_stream_poller_with_a_signal_reads_only_when_woken() -> None:
    streams, lam, signal = FakeStreams(), FakeLambda(), StreamSignal()
    poller = event_sources.StreamPoller(
        streams, lam, event_sources.Mapping("f", "arn:aws:dynamodb:us-east-1:1:t"), signal
    )
    poller.start()
    try:
        _until(lambda: streams.reads >= 1)
        time.sleep(1.0)
        idle_reads = streams.reads
        assert idle_reads <= 2  # without a signal it reads 20 times a second
        with streams.lock:
            streams.records.append({"eventName": "INSERT", "dynamodb": {}})
        signal.bump()  # what moto_streams does on StreamShard.add
        _until(lambda: len(lam.events) == 1)
        assert lam.events[0]["Records"][0]["eventName"] == "INSERT"
    finally:
        poller.stop()
    poller.join(timeout=5)
    assert not poller.is_alive()  # stop() woke it from its wait


def test_a_stream_poller_without_a_signal_still_polls() -> None:
    streams, lam = FakeStreams(), FakeLambda()
    poller = event_sources.StreamPoller(
        streams, lam, event_sources.Mapping("f", "arn:aws:dynamodb:us-east-1:1:t")
    )
    poller.start()
    try:
        with streams.lock:
            streams.records.append({"eventName": "MODIFY", "dynamodb": {}})
        _until(lambda: len(lam.events) == 1)
    finally:
        poller.stop()
        poller.join(timeout=5)


def test_a_stream_poller_with_a_batching_window_invokes_once_per_window() -> None:
    """MaximumBatchingWindowInSeconds on a stream mapping (the notifier's, issue 18): records written
    within the window after the first reach the function in one invocation. The later records are
    written once the poller has read the first, so they land inside its window by construction."""
    streams, lam, signal = FakeStreams(), FakeLambda(), StreamSignal()
    mapping = event_sources.Mapping("f", "arn:aws:dynamodb:us-east-1:1:t", batch_size=100, window_s=2.0)
    poller = event_sources.StreamPoller(streams, lam, mapping, signal)
    poller.start()
    try:
        _until(lambda: streams.reads >= 1)
        with streams.lock:
            streams.records.append({"eventName": "INSERT", "dynamodb": {"n": 0}})
        signal.bump()
        _until(lambda: streams.delivered >= 1)  # the first record read: the window is open
        with streams.lock:
            streams.records.extend({"eventName": "INSERT", "dynamodb": {"n": i}} for i in range(1, 5))
        signal.bump()
        _until(lambda: sum(len(e["Records"]) for e in lam.events) == 5)
        time.sleep(0.2)
        assert len(lam.events) == 1
    finally:
        poller.stop()
        poller.join(timeout=5)


def test_the_signal_does_not_lose_a_write_between_the_read_and_the_wait() -> None:
    signal = StreamSignal()
    seen = signal.generation
    assert signal.wait(seen, 0) == seen  # nothing written: the generation has not moved
    signal.bump()  # a write lands after the read, before the wait: the wait sees it without sleeping
    assert signal.wait(seen, 0) == seen + 1


def test_the_timer_backs_off_while_idle_and_fires_again_when_work_appears() -> None:
    fired: list[float] = []
    busy = threading.Event()
    timer = event_sources.ScheduleTimer(
        lambda: fired.append(time.monotonic()), 0.05, "t", active=busy.is_set, idle_interval_s=60.0
    )
    timer.start()
    try:
        _until(lambda: timer.skipped >= 5)
        assert fired == []  # idle: it looks every interval but does not fire
        busy.set()
        _until(lambda: len(fired) >= 3)  # in flight: every interval
    finally:
        timer.stop()
    timer.join(timeout=5)
    assert not timer.is_alive()


def test_the_timer_fires_at_the_idle_interval_when_nothing_is_in_flight() -> None:
    fired: list[float] = []
    timer = event_sources.ScheduleTimer(
        lambda: fired.append(1.0), 0.02, "t", active=lambda: False, idle_interval_s=0.2
    )
    timer.start()
    try:
        _until(lambda: len(fired) >= 2)
        assert timer.skipped >= 2
    finally:
        timer.stop()
        timer.join(timeout=5)


def test_a_timer_without_a_predicate_fires_every_interval() -> None:
    fired: list[float] = []
    timer = event_sources.ScheduleTimer(lambda: fired.append(1.0), 0.02, "t")
    timer.start()
    try:
        _until(lambda: len(fired) >= 3)
        assert timer.skipped == 0
    finally:
        timer.stop()
        timer.join(timeout=5)
