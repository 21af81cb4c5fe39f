"""The local cloud's event source mappings and scheduled rules, run the way AWS runs them.

moto invokes a mapping's function synchronously inside the write that fed it; AWS polls. These
pollers poll, through moto's public API like any AWS client:

- ``SqsPoller``: long-polls the queue, gathers up to ``BatchSize`` messages within
  ``MaximumBatchingWindowInSeconds`` of the first, invokes the function once per batch (Lambda's
  Invoke API, so the in-process runtime runs it) and deletes what succeeded; with
  ``ReportBatchItemFailures`` the failed items stay, and a function error makes the batch visible
  again after a short delay.
- ``StreamPoller``: reads a DynamoDB stream from ``StartingPosition`` and invokes the function per
  batch, in order, retrying a failed batch up to ``MaximumRetryAttempts``.
- ``ScheduleTimer``: a rule with a ``ScheduleExpression`` puts its target's input on its SQS target
  every interval (moto never fires scheduled rules); the interval may be shortened for tests.
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

    def step(self) -> None:
        m = self.mapping
        messages: list[dict[str, Any]] = []
        first_at: float | None = None
        while len(messages) < m.batch_size and not self.stopping.is_set():
            wait = 1 if first_at is None else max(0.0, m.window_s - (time.monotonic() - first_at))
            if first_at is not None and wait <= 0:
                break
            got = self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, m.batch_size - len(messages)),
                WaitTimeSeconds=int(min(1, max(0, round(wait)))) if first_at is None else 0,
                AttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                if first_at is None:
                    return
                if m.window_s > 0:
                    time.sleep(min(0.05, wait))
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
                    "messageAttributes": msg.get("MessageAttributes", {}),
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
    def __init__(self, streams: Any, lambda_client: Any, mapping: Mapping) -> None:
        super().__init__(f"esm-stream-{mapping.function_name}")
        self.streams, self.lambda_client, self.mapping = streams, lambda_client, mapping
        self.iterators: dict[str, str] = {}
        self.batches = 0

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
        if not self.iterators:
            self._refresh_shards()
        busy = False
        for sid, iterator in list(self.iterators.items()):
            got = self.streams.get_records(ShardIterator=iterator, Limit=self.mapping.batch_size)
            records = got.get("Records", [])
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
        if not busy:
            self.stopping.wait(0.05)


_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)")
_UNIT_S = {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}


def schedule_seconds(expression: str) -> float | None:
    m = _RATE.fullmatch(expression.strip())
    return None if m is None else int(m[1]) * _UNIT_S[m[2]]


class ScheduleTimer(_Loop):
    def __init__(self, send: Callable[[], None], interval_s: float, name: str) -> None:
        super().__init__(f"rule-{name}")
        self.send, self.interval_s = send, interval_s
        self.fired = 0

    def step(self) -> None:
        if self.stopping.wait(self.interval_s):
            return
        self.send()
        self.fired += 1
