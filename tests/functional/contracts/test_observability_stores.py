"""MetricsRepository and LogReader contracts, run against the in-memory fakes and the real adapters
(DynamoDB and CloudWatch Logs on moto): what the API serves is what the agents sent, in order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from berth.domain.errors import InvalidRequest
from berth.domain.log_pages import EVENT_OVERHEAD_BYTES, json_size
from berth.domain.observability import GpuSample, MetricSample
from berth.domain.ports import LogReader, MetricsRepository
from tests.functional.conftest import TABLES
from tests.unit.fakes import FakeLogReader, FakeMetrics

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
GROUP, STREAM = "/berth/jobs/vision", "j-1/1"


@pytest.fixture(params=["fake", "dynamodb"])
def metrics(request: pytest.FixtureRequest) -> Iterator[MetricsRepository]:
    if request.param == "fake":
        yield FakeMetrics()
        return
    request.getfixturevalue("aws")
    from berth.dal.observability import DynamoMetricsRepository

    yield DynamoMetricsRepository(TABLES["BERTH_JOB_METRICS_TABLE"])


def sample(i: int, util: float = 50.0) -> MetricSample:
    return MetricSample(
        at=T0 + timedelta(seconds=10 * i),
        cpu_pct=100.0 + i,
        rss_mib=512.0 + i,
        processes=2,
        gpus=[GpuSample(uuid="GPU-a", utilization_pct=util, memory_used_mib=1000 + i)],
    )


def test_samples_come_back_per_attempt_oldest_first(metrics: MetricsRepository) -> None:
    metrics.put("j-1", 1, "h1", [sample(0), sample(1)], 2_000_000_000)
    metrics.put("j-1", 1, "h1", [sample(2)], 2_000_000_000)
    metrics.put("j-1", 2, "h1", [sample(5)], 2_000_000_000)
    metrics.put("j-2", 1, "h1", [sample(9)], 2_000_000_000)
    got = metrics.samples("j-1", 1, 100)
    assert [s.sample for s in got] == [sample(0), sample(1), sample(2)]
    assert {(s.attempt, s.host_id) for s in got} == {(1, "h1")}
    assert [s.sample for s in metrics.samples("j-1", 2, 100)] == [sample(5)]
    assert metrics.samples("j-1", 3, 100) == [] and metrics.samples("j-9", 1, 100) == []


def test_limit_keeps_the_latest(metrics: MetricsRepository) -> None:
    metrics.put("j-1", 1, "h1", [sample(i) for i in range(30)], 2_000_000_000)
    got = metrics.samples("j-1", 1, 5)
    assert [s.sample for s in got] == [sample(i) for i in range(25, 30)]


def test_a_batch_sent_twice_is_kept_once_and_hosts_are_apart(metrics: MetricsRepository) -> None:
    batch = [sample(0), sample(1)]
    metrics.put("j-1", 1, "h1", batch, 2_000_000_000)
    metrics.put("j-1", 1, "h1", batch, 2_000_000_000)
    metrics.put("j-1", 1, "h2", [sample(0, util=90.0)], 2_000_000_000)
    got = metrics.samples("j-1", 1, 100)
    assert len(got) == 3
    assert sorted(s.host_id for s in got) == ["h1", "h1", "h2"]


def test_attempt_10_does_not_mix_with_attempt_1(metrics: MetricsRepository) -> None:
    metrics.put("j-1", 1, "h1", [sample(0)], 2_000_000_000)
    metrics.put("j-1", 10, "h1", [sample(1)], 2_000_000_000)
    assert [s.sample for s in metrics.samples("j-1", 1, 100)] == [sample(0)]
    assert [s.sample for s in metrics.samples("j-1", 10, 100)] == [sample(1)]


# -- logs -------------------------------------------------------------------------------------------
class Logs:
    def __init__(self, reader: LogReader, write: object) -> None:
        self.reader = reader
        self.write = write  # (group, stream, at_ms, message) -> None


@pytest.fixture(params=["fake", "cloudwatch"])
def logs(request: pytest.FixtureRequest) -> Iterator[Logs]:
    if request.param == "fake":
        fake = FakeLogReader()
        yield Logs(fake, fake.write)
        return
    request.getfixturevalue("aws")
    from berth.dal.observability import CloudWatchLogReader
    from berth.dal.page_tokens import PageTokenCodec

    cw = boto3.client("logs", region_name="us-east-1")
    cw.create_log_group(logGroupName=GROUP)
    cw.create_log_group(logGroupName="/berth/jobs/nlp")

    def write(group: str, stream: str, at_ms: int, message: str) -> None:
        with contextlib.suppress(cw.exceptions.ResourceAlreadyExistsException):
            cw.create_log_stream(logGroupName=group, logStreamName=stream)
        cw.put_log_events(
            logGroupName=group, logStreamName=stream, logEvents=[{"timestamp": at_ms, "message": message}]
        )

    yield Logs(CloudWatchLogReader(PageTokenCodec(lambda: b"k" * 32)), write)


#: CloudWatch refuses events from the future (and older than its retention): log times are recent.
LOG_T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
MS0 = int(LOG_T0.timestamp() * 1000)


def test_events_page_in_order_and_follow(logs: Logs) -> None:
    for i in range(5):
        logs.write(GROUP, STREAM, MS0 + i, f"line {i}")  # type: ignore[operator]
    first = logs.reader.read(GROUP, STREAM, None, None, 3)
    assert [e.message for e in first.events] == ["line 0", "line 1", "line 2"]
    assert first.events[0].at == LOG_T0 and first.next_token
    second = logs.reader.read(GROUP, STREAM, None, first.next_token, 3)
    assert [e.message for e in second.events] == ["line 3", "line 4"]
    assert second.next_token is not None
    end = logs.reader.read(GROUP, STREAM, None, second.next_token, 3)
    assert end.events == [] and end.next_token is not None  # the end for now: keep the token
    logs.write(GROUP, STREAM, MS0 + 10, "line 5")  # type: ignore[operator]
    more = logs.reader.read(GROUP, STREAM, None, end.next_token, 3)
    assert [e.message for e in more.events] == ["line 5"]


def test_since_filters_and_sticks_to_the_token(logs: Logs) -> None:
    for i in range(6):
        logs.write(GROUP, STREAM, MS0 + 1000 * i, f"line {i}")  # type: ignore[operator]
    page = logs.reader.read(GROUP, STREAM, MS0 + 3000, None, 2)
    assert [e.message for e in page.events] == ["line 3", "line 4"]
    rest = logs.reader.read(GROUP, STREAM, None, page.next_token, 10)
    assert [e.message for e in rest.events] == ["line 5"]


def test_missing_stream_or_group_is_an_empty_page(logs: Logs) -> None:
    assert logs.reader.read(GROUP, "j-1/9", None, None, 10).events == []
    page = logs.reader.read("/berth/jobs/nobody", STREAM, None, None, 10)
    assert page.events == [] and page.next_token is None


def test_a_token_of_another_stream_is_refused(logs: Logs) -> None:
    logs.write(GROUP, STREAM, MS0, "vision's line")  # type: ignore[operator]
    logs.write("/berth/jobs/nlp", "j-2/1", MS0, "nlp's line")  # type: ignore[operator]
    token = logs.reader.read(GROUP, STREAM, None, None, 10).next_token
    with pytest.raises(InvalidRequest):
        logs.reader.read("/berth/jobs/nlp", "j-2/1", None, token, 10)
    with pytest.raises(InvalidRequest):
        logs.reader.read(GROUP, "j-1/2", None, token, 10)


def test_a_page_keeps_within_its_byte_budget_and_the_next_continues_exactly(logs: Logs) -> None:
    lines = [f"{i}:" + "x" * 300 for i in range(7)]
    for i, line in enumerate(lines):
        logs.write(GROUP, STREAM, MS0 + i, line)  # type: ignore[operator]
    budget = 2 * (json_size(lines[0]) + EVENT_OVERHEAD_BYTES) + 10  # two events a page
    got: list[str] = []
    token = None
    for _ in range(10):
        page = logs.reader.read(GROUP, STREAM, None, token, 5, budget)
        assert sum(json_size(e.message) + EVENT_OVERHEAD_BYTES for e in page.events) <= budget
        if not page.events:
            break
        assert len(page.events) <= 2
        got += [e.message for e in page.events]
        token = page.next_token
    assert got == lines  # every line once, in order: none skipped, none twice
    logs.write(GROUP, STREAM, MS0 + 100, "later")  # type: ignore[operator]
    assert [e.message for e in logs.reader.read(GROUP, STREAM, None, token, 5, budget).events] == ["later"]


def test_a_line_longer_than_the_budget_is_cut_with_a_marker_and_passed(logs: Logs) -> None:
    logs.write(GROUP, STREAM, MS0, "\x1b" * 5000)  # type: ignore[operator]  # escapes to 6 bytes each
    logs.write(GROUP, STREAM, MS0 + 1, "next")  # type: ignore[operator]
    first = logs.reader.read(GROUP, STREAM, None, None, 10, 4000)
    assert len(first.events) == 1
    cut = first.events[0].message
    assert cut.startswith("\x1b" * 100) and "more characters of this line not shown" in cut
    assert json_size(cut) + EVENT_OVERHEAD_BYTES <= 4000
    second = logs.reader.read(GROUP, STREAM, None, first.next_token, 10, 4000)
    assert [e.message for e in second.events] == ["next"]
