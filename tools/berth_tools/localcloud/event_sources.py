"""The local cloud's event source mappings and scheduled rules, run the way AWS runs them.

moto invokes a mapping's function synchronously inside the write that fed it; AWS polls. These
pollers poll, through moto's public API like any AWS client:

- ``SqsPoller``: long-polls the queue (``LONG_POLL_S``, as Lambda's pollers do: moto answers as soon
  as a message arrives), gathers up to ``BatchSize`` messages within
  ``MaximumBatchingWindowInSeconds`` of the first, invokes the function once per batch (Lambda's
  Invoke API, so the in-process runtime runs it) and deletes what succeeded; with
  ``ReportBatchItemFailures`` the failed items stay, and a function error makes the batch visible
  again after a short delay.
- ``StreamPoller``: reads a DynamoDB stream from ``StartingPosition`` (records found with a batching
  window: read again once the window has passed, up to the batch size) and invokes the function per
  batch, in order, retrying a failed batch up to ``MaximumRetryAttempts``. Given a ``signal``
  (``moto_streams.SIGNAL``) it sleeps until a stream write wakes it (at most ``STREAM_IDLE_S``),
  instead of reading every ``STREAM_POLL_S``.
- ``ScheduleTimer``: a rule with a ``ScheduleExpression`` puts its target's input on its SQS target
  every interval (moto never fires scheduled rules); the interval may be shortened for tests. Given
  an ``active`` predicate, it fires at ``idle_interval_s`` while the predicate is false (nothing for
  a pass to do sooner), and at its interval again as soon as it is true.

All of them stop promptly: ``stop()`` wakes whatever they wait on.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: How long a failed batch stays invisible before it is retried.
RETRY_DELAY_S = 1
#: How long an SQS poller's ReceiveMessage waits for a first message (Lambda's pollers use 20 s).
LONG_POLL_S = 20
#: How often a stream poller reads its stream without a wake-up signal (and between busy reads).
STREAM_POLL_S = 0.05
#: With a signal: the longest a stream poller sleeps without a wake-up (a safety net).
STREAM_IDLE_S = 5.0
#: While a batching window is open: how long a poller waits between empty receives.
WINDOW_POLL_S = 0.25


@dataclass
class Mapping:
    function_name: str
    source_arn: str
    batch_size: int = 10
    window_s: float = 0.0
    partial_batch: bool = False
    starting_position: str = "TRIM_HORIZON"
    max_retries: int = 10


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.timestamp()  # stream records carry epoch seconds, as Lambda passes them
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _invoke(lambda_client: Any, function_name: str, event: dict[str, Any]) -> tuple[bool, Any]:
    request = json.dumps(event, default=_json_default).encode()
    response = lambda_client.invoke(FunctionName=function_name, Payload=request)
    body = response["Payload"].read()
    answer: Any
    try:
        answer = json.loads(body) if body else None
    except ValueError:
        answer = None
    return "FunctionError" not in response, answer


class _Loop(threading.Thread):
    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.errors = 0
        self.last_error = ""

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.step()
            except Exception as exc:  # the emulator keeps polling, as AWS would
                self.errors += 1
                self.last_error = repr(exc)
                if self.stopping.wait(0.5):
                    return

    def step(self) -> None:
        raise NotImplementedError


class SqsPoller(_Loop):
    def __init__(self, sqs: Any, lambda_client: Any, queue_url: str, mapping: Mapping) -> None:
        super().__init__(f"esm-sqs-{mapping.function_name}")
        self.sqs, self.lambda_client, self.queue_url, self.mapping = sqs, lambda_client, queue_url, mapping
        self.batches = 0
        self.long_poll_s = LONG_POLL_S

    def step(self) -> None:
        m = self.mapping
        messages: list[dict[str, Any]] = []
        first_at: float | None = None
        while len(messages) < m.batch_size and not self.stopping.is_set():
            remaining = 0.0 if first_at is None else m.window_s - (time.monotonic() - first_at)
            if first_at is not None and remaining <= 0 and m.window_s > 0:
                break
            got = self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, m.batch_size - len(messages)),
                WaitTimeSeconds=self.long_poll_s if first_at is None else 0,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                if first_at is None:
                    return
                if m.window_s > 0:
                    # the window stays open: wait for more rather than asking for them 20 times a second
                    self.stopping.wait(min(WINDOW_POLL_S, max(0.0, remaining)))
                    continue
                break
            if first_at is None:
                first_at = time.monotonic()
            messages += got
            if m.window_s <= 0 and len(got) < 10:
                break
        if not messages:
            return
        event = {
            "Records": [
                {
                    "messageId": msg["MessageId"],
                    "receiptHandle": msg["ReceiptHandle"],
                    "body": msg["Body"],
                    "attributes": msg.get("Attributes", {}),
                    "messageAttributes": lambda_message_attributes(msg.get("MessageAttributes") or {}),
                    "md5OfBody": msg.get("MD5OfBody", ""),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": m.source_arn,
                    "awsRegion": m.source_arn.split(":")[3],
                }
                for msg in messages
            ]
        }
        ok, payload = _invoke(self.lambda_client, m.function_name, event)
        self.batches += 1
        failed: set[str] = set()
        if not ok:
            failed = {msg["MessageId"] for msg in messages}
        elif m.partial_batch and isinstance(payload, dict):
            failed = {f.get("itemIdentifier") for f in payload.get("batchItemFailures") or []}
        done = [msg for msg in messages if msg["MessageId"] not in failed]
        for i in range(0, len(done), 10):
            self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(j), "ReceiptHandle": msg["ReceiptHandle"]}
                    for j, msg in enumerate(done[i : i + 10])
                ],
            )
        for msg in messages:
            if msg["MessageId"] in failed:
                with contextlib.suppress(Exception):
                    self.sqs.change_message_visibility(
                        QueueUrl=self.queue_url,
                        ReceiptHandle=msg["ReceiptHandle"],
                        VisibilityTimeout=RETRY_DELAY_S,
                    )


class StreamPoller(_Loop):
    def __init__(self, streams: Any, lambda_client: Any, mapping: Mapping, signal: Any = None) -> None:
        super().__init__(f"esm-stream-{mapping.function_name}")
        self.streams, self.lambda_client, self.mapping = streams, lambda_client, mapping
        self.signal = signal  # moto_streams.StreamSignal (None: read every STREAM_POLL_S)
        self.iterators: dict[str, str] = {}
        self.batches = 0
        self.reads = 0

    def stop(self) -> None:
        super().stop()
        if self.signal is not None:
            self.signal.bump()  # wake it from its wait

    def _refresh_shards(self) -> None:
        shards = self.streams.describe_stream(StreamArn=self.mapping.source_arn)["StreamDescription"][
            "Shards"
        ]
        for shard in shards:
            sid = shard["ShardId"]
            if sid not in self.iterators:
                self.iterators[sid] = self.streams.get_shard_iterator(
                    StreamArn=self.mapping.source_arn,
                    ShardId=sid,
                    ShardIteratorType=self.mapping.starting_position
                    if self.mapping.starting_position in ("TRIM_HORIZON", "LATEST")
                    else "TRIM_HORIZON",
                )["ShardIterator"]

    def step(self) -> None:
        seen = None if self.signal is None else self.signal.generation  # before the read: no wake-up lost
        if not self.iterators:
            self._refresh_shards()
        busy = False
        for sid, iterator in list(self.iterators.items()):
            self.reads += 1
            got = self.streams.get_records(ShardIterator=iterator, Limit=self.mapping.batch_size)
            records = got.get("Records", [])
            window = self.mapping.window_s
            if records and window > 0 and len(records) < self.mapping.batch_size:
                # MaximumBatchingWindowInSeconds: Lambda gathers records for up to the window (or a full
                # batch) before it invokes; here one more read once the window has passed
                self.stopping.wait(window)
                iterator = got.get("NextShardIterator") or iterator
                self.reads += 1
                got = self.streams.get_records(
                    ShardIterator=iterator, Limit=self.mapping.batch_size - len(records)
                )
                records = records + got.get("Records", [])
            if records:
                busy = True
                event = {"Records": [{**r, "eventSourceARN": self.mapping.source_arn} for r in records]}
                for attempt in range(self.mapping.max_retries + 1):
                    ok, answer = _invoke(self.lambda_client, self.mapping.function_name, event)
                    if ok or self.stopping.is_set():
                        break
                    self.errors += 1
                    self.last_error = str(answer)[:500]
                    time.sleep(min(5.0, 0.2 * 2**attempt))
                self.batches += 1
            self.iterators[sid] = got.get("NextShardIterator") or iterator
        if busy or self.stopping.is_set():
            return
        if self.signal is None or seen is None:
            self.stopping.wait(STREAM_POLL_S)
        else:
            self.signal.wait(seen, STREAM_IDLE_S)


def lambda_message_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """SQS's ``MessageAttributes`` (ReceiveMessage's form) as Lambda's SQS event carries them:
    ``{"stringValue", "binaryValue", "stringListValues", "binaryListValues", "dataType"}``."""
    return {
        name: {
            "stringValue": a.get("StringValue"),
            "binaryValue": a.get("BinaryValue"),
            "stringListValues": a.get("StringListValues", []),
            "binaryListValues": a.get("BinaryListValues", []),
            "dataType": a.get("DataType", "String"),
        }
        for name, a in attributes.items()
    }


_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)")
_UNIT_S = {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}


def schedule_seconds(expression: str) -> float | None:
    m = _RATE.fullmatch(expression.strip())
    return None if m is None else int(m[1]) * _UNIT_S[m[2]]


class ScheduleTimer(_Loop):
    def __init__(
        self,
        send: Callable[[], None],
        interval_s: float,
        name: str,
        active: Callable[[], bool] | None = None,
        idle_interval_s: float | None = None,
    ) -> None:
        super().__init__(f"rule-{name}")
        self.send, self.interval_s = send, interval_s
        self.active, self.idle_interval_s = active, idle_interval_s
        self.fired = 0
        self.skipped = 0

    def step(self) -> None:
        if self.active is None or self.idle_interval_s is None or self.idle_interval_s <= self.interval_s:
            if self.stopping.wait(self.interval_s):
                return
            self.send()
            self.fired += 1
            return
        # Idle: look every interval whether there is anything to do; fire at least every idle interval.
        since = time.monotonic()
        while not self.stopping.wait(self.interval_s):
            if self.active() or time.monotonic() - since >= self.idle_interval_s:
                self.send()
                self.fired += 1
                return
            self.skipped += 1
