"""Adapters for job logs (CloudWatch Logs) and usage samples (the JobMetrics table).

Both translate AWS failures into domain errors: a stream that does not exist yet is an empty page
(the job has printed nothing so far), throttling and outages are StoreUnavailable, a token that is
not ours InvalidRequest.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from berth.dal.aws import client
from berth.dal.errors import translated
from berth.dal.models import metric_model
from berth.dal.page_tokens import PageTokenCodec
from berth.domain.errors import InvalidRequest, StoreUnavailable
from berth.domain.log_pages import LOG_PAGE_BUDGET_BYTES, fit_page
from berth.domain.observability import LogEvent, LogPage, MetricSample, StoredSample

_ATTEMPT_DIGITS = 6
_MISSING = frozenset({"ResourceNotFoundException"})
_BAD_INPUT = frozenset({"InvalidParameterException"})
#: GetLogEvents' largest ``limit``.
_MAX_EVENTS_PER_CALL = 10_000


def sort_key(attempt: int, at: datetime, host_id: str) -> str:
    return f"{_attempt_prefix(attempt)}{int(at.timestamp() * 1000):013d}#{host_id}"


def _attempt_prefix(attempt: int) -> str:
    return f"{attempt:0{_ATTEMPT_DIGITS}d}#"


class DynamoMetricsRepository:
    def __init__(self, table_name: str) -> None:
        self._Row = metric_model(table_name)

    def put(
        self, job_id: str, attempt: int, host_id: str, samples: list[MetricSample], expires_at: int
    ) -> None:
        with translated("store usage samples"), self._Row.batch_write() as batch:
            for s in samples:
                batch.save(
                    self._Row(
                        job_id,
                        sort_key(attempt, s.at, host_id),
                        attempt=attempt,
                        host_id=host_id,
                        sample=s.model_dump(mode="json"),
                        expires_at=expires_at,
                    )
                )

    def samples(self, job_id: str, attempt: int, limit: int) -> list[StoredSample]:
        with translated("read usage samples"):
            rows = list(
                self._Row.query(
                    job_id,
                    self._Row.sk.startswith(_attempt_prefix(attempt)),
                    scan_index_forward=False,
                    limit=limit,
                )
            )
        return [
            StoredSample(
                attempt=int(r.attempt),
                host_id=r.host_id,
                sample=MetricSample.model_validate(r.sample),
            )
            for r in reversed(rows)
        ]


class CloudWatchLogReader:
    """GetLogEvents, oldest first. The page token it hands out wraps CloudWatch's token with the
    stream it belongs to and the ``since`` it was read with, MAC'd (``PageTokenCodec``), so a client
    can neither forge one nor carry one over to another job's stream.

    A page holds no more than ``max_bytes`` of JSON (``fit_page``). When the budget cuts a page
    short, its token names the CloudWatch position the page was read from (``t``; None: the start)
    and how many events from there were already served (``k``): the next read asks CloudWatch for
    the same position again and skips those. CloudWatch answers a position with the same events,
    so nothing is served twice or skipped."""

    def __init__(self, tokens: PageTokenCodec, logs: Callable[[], Any] | None = None) -> None:
        self._tokens = tokens
        self._logs = logs or (lambda: client("logs"))

    def read(
        self,
        group: str,
        stream: str,
        start_ms: int | None,
        next_token: str | None,
        limit: int,
        max_bytes: int = LOG_PAGE_BUDGET_BYTES,
    ) -> LogPage:
        position: str | None = None
        skip = 0
        if next_token is not None:
            data = self._tokens.decode(next_token)
            position, skip = data.get("t"), data.get("k", 0)
            if (
                data.get("g") != group
                or data.get("s") != stream
                or not (isinstance(position, str) or (position is None and "t" in data))
                or not isinstance(skip, int)
                or not 0 <= skip <= _MAX_EVENTS_PER_CALL
            ):
                raise InvalidRequest("next_token belongs to another job or attempt; start again without it")
            start_ms = data.get("since")
        kwargs: dict[str, Any] = {
            "logGroupName": group,
            "logStreamName": stream,
            "startFromHead": True,
            "limit": min(limit + skip, _MAX_EVENTS_PER_CALL),
        }
        if position is not None:
            kwargs["nextToken"] = position
        if start_ms is not None:
            # The same start with the token: the token continues the query it came from.
            kwargs["startTime"] = start_ms
        try:
            answer = self._logs().get_log_events(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _MISSING:
                return LogPage(events=[], next_token=None)
            if code in _BAD_INPUT:
                raise InvalidRequest(
                    "next_token is not valid for this query; start again without it"
                ) from exc
            raise StoreUnavailable(f"read the job's log: CloudWatch Logs unavailable ({code})") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(
                f"read the job's log: CloudWatch Logs unavailable ({exc.__class__.__name__})"
            ) from exc
        unread = [
            LogEvent(at=datetime.fromtimestamp(e["timestamp"] / 1000, UTC), message=e["message"])
            for e in answer.get("events", [])
        ][skip:]
        events = fit_page(unread[:limit], max_bytes)
        forward = answer.get("nextForwardToken")
        if len(events) < len(unread):  # cut short by the budget: this position again, further on
            state = {"t": position, "k": skip + len(events)}
        elif forward is not None:
            state = {"t": forward, "k": 0}
        else:
            return LogPage(events=events, next_token=None)
        token = self._tokens.encode({"g": group, "s": stream, **state, "since": start_ms})
        return LogPage(events=events, next_token=token)
