"""Count what the control plane would be billed for: every AWS request that reaches the local cloud.

One process-global `Meter` (`METER`; moto's backends are process-global too) sees

- every request to the moto server (`MeterMiddleware`, a WSGI middleware around the server's app,
  installed by `MotoServer.start()`), and every request the in-process transport serves
  (`InProcessTransport` calls `METER.observe`), as (service, operation) counts, the service taken from
  the SigV4 credential scope and the operation from `X-Amz-Target`, `Action=` or the REST path; and the
  same counts per caller (`requests_by_caller`): the Lambda function whose role credentials signed the
  request (`name_caller`, called by `lambda_runtime`), else ``other``; and per caller and activity
  (`requests_by_activity`): what the signing sandbox was serving at the time (`begin_activity`; the
  runtime names an API Gateway invocation by its method and resource, ``GET /v1/jobs/{id}``), so a
  benchmark can tell the calls that served its own reads from the control plane's;
- DynamoDB capacity units, computed as DynamoDB does from item sizes (`item_size`): writes from the
  stored item before and after the write (read from moto's tables under the DynamoDB write lock, so
  nothing else writes in between), 1 WRU per started KB of the larger, 2x in transactions, a failed
  conditional write charged for the existing item (minimum 1), plus the writes each secondary index
  receives (`_index_write_units`; counted under `table/index`); reads from the items in the response,
  0.5 RRU per started 4 KB eventually consistent, 1 strongly consistent, 2x in transactions, a GetItem
  of a missing item 1 unit, Query and Scan by the total size of the returned items (minimum 1 unit);
- SQS requests in 64 KB chunks of message payload (body plus message attributes), EventBridge
  PutEvents entries in 64 KB chunks (entry size as AWS computes it), CloudWatch Logs ingestion
  (message bytes plus 26 per event, for PutLogEvents calls and the Lambda runtime's own log lines);
- Lambda invocations with their billed duration and configured memory (`record_lambda`, called by
  `lambda_runtime` for every invocation, whatever invoked it);
- Step Functions state transitions: every `...StateEntered` history event of every execution, counted
  as moto's execution engine records it, plus every retry a state's `Retry` grants (AWS bills retries as
  transitions) (`install_state_machine_hook`);
- API Gateway REST requests (`record_api_request`, called by the front door for each request that
  passes authentication and reaches its integration).

`GET /_berth/meter` on the moto server port answers `snapshot()` with the bill (`aws_prices.bill`),
`POST /_berth/meter/reset` zeroes it; both only to 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import io
import json
import math
import re
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

from berth_tools.localcloud import aws_latency, dynamodb_isolation, moto_compat

METER_PATH = "/_berth/meter"
METER_RESET_PATH = "/_berth/meter/reset"
LOCAL_ADDRESSES = frozenset({"127.0.0.1", "::1", "localhost"})

KB = 1024
WRITE_UNIT_BYTES = 1 * KB
READ_UNIT_BYTES = 4 * KB
SQS_CHUNK_BYTES = 64 * KB
EVENTS_CHUNK_BYTES = 64 * KB
LOG_EVENT_OVERHEAD_BYTES = 26  # CloudWatch Logs counts each event's message plus 26 bytes

#: (status, headers, body) of one answered request.
Answer = tuple[int, list[tuple[str, str]], bytes]

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_LAMBDA_PATH = re.compile(r"^/[\d-]+/functions/[^/]+/invocations$")
_DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_DYNAMODB_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
#: Errors after which DynamoDB still charges the write (the condition was evaluated on the item).
_CHARGED_WRITE_ERRORS = ("ConditionalCheckFailedException", "TransactionCanceledException")
_STATE_MACHINE_HOOK = "moto.stepfunctions.parser.asl.eval.event.event_manager:EventManager.add_event"
_RETRY_HOOK = "moto.stepfunctions.parser.asl.component.state.exec.execute_state:ExecutionState._handle_retry"
#: The `by_type` key under which retries (a Retry that runs the state again) are counted as transitions.
RETRY_TRANSITION = "Retry"


# -- item sizes, as DynamoDB computes them ------------------------------------------------------------------
def _number_size(text: Any) -> int:
    """1 byte per two significant digits plus 1 (leading and trailing zeroes do not count)."""
    try:
        digits = Decimal(str(text)).normalize().as_tuple().digits
    except InvalidOperation:
        return len(str(text))
    significant = "".join(map(str, digits)).strip("0") or "0"
    return math.ceil(len(significant) / 2) + 1


def _binary_size(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    try:
        return len(base64.b64decode(str(value), validate=False))
    except ValueError:
        return len(str(value).encode())


def value_size(value: dict[str, Any]) -> int:
    """Size of one attribute value in DynamoDB's wire format (`{"S": "..."}`, `{"M": {...}}`, ...)."""
    (kind, inner), *_ = value.items()
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        return _number_size(inner)
    if kind == "B":
        return _binary_size(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(v).encode()) for v in inner)
    if kind == "NS":
        return sum(_number_size(v) for v in inner)
    if kind == "BS":
        return sum(_binary_size(v) for v in inner)
    if kind == "L":  # 3 bytes of overhead plus 1 per element
        return 3 + sum(value_size(v) + 1 for v in inner)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in inner.items())
    return len(json.dumps(inner, default=str).encode())


def item_size(item: dict[str, Any] | None) -> int:
    """Bytes DynamoDB counts for an item in wire format: attribute names plus values."""
    if not item:
        return 0
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def write_units(size: int) -> int:
    """1 WRU per started KB, at least 1."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def read_units(size: int, consistent: bool) -> float:
    """0.5 RRU (eventually consistent) or 1 (strongly) per started 4 KB, at least one 4 KB unit."""
    chunks = max(1, math.ceil(size / READ_UNIT_BYTES))
    return chunks * (1.0 if consistent else 0.5)


def _chunks(size: int, chunk: int) -> int:
    return max(1, math.ceil(size / chunk))


# -- what a request is --------------------------------------------------------------------------------------
class ObservedRequest:
    """The parts of an AWS API request the meter reads (headers by lower-case name)."""

    def __init__(self, method: str, path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes):
        self.method = method.upper()
        self.path = path or "/"
        self.query = query
        self.headers = {name.lower(): value for name, value in headers}
        self.body = body
        match = _CREDENTIAL.search(self.headers.get("authorization", ""))
        self.access_key = match.group(1) if match else ""
        self.region = match.group(2) if match else ""
        target = self.headers.get("x-amz-target", "")
        self.service = match.group(3) if match else _service_from_target(target)
        self.operation = self._operation(target)

    def _operation(self, target: str) -> str:
        if target:
            return target.rsplit(".", 1)[-1]
        for source in (self.query, self._form_body()):
            action = urllib.parse.parse_qs(source).get("Action")
            if action:
                return action[0]
        if self.service == "lambda" and self.method == "POST" and _LAMBDA_PATH.match(self.path):
            return "Invoke"
        segments = [part for part in self.path.split("/") if part][:2]
        return f"{self.method} /{'/'.join(segments)}"

    def _form_body(self) -> str:
        if "x-www-form-urlencoded" not in self.headers.get("content-type", ""):
            return ""
        return self.body.decode(errors="replace")

    def json_body(self) -> dict[str, Any]:
        try:
            parsed = json.loads(self.body or b"{}")
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    def form(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self._form_body() or self.query)


def _service_from_target(target: str) -> str:
    prefix = target.split(".", 1)[0]
    if prefix.startswith("DynamoDB"):
        return "dynamodb"
    return {
        "AmazonSQS": "sqs",
        "AWSEvents": "events",
        "AWSStepFunctions": "states",
        "Logs_20140328": "logs",
    }.get(prefix, "unknown")


def _json(payload: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(payload or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _error_type(payload: bytes) -> str:
    return str(_json(payload).get("__type", "")).rsplit("#", 1)[-1]


# -- the meter ----------------------------------------------------------------------------------------------
#: Who is calling, in the calling thread's context (set with `caller()`; a thread pool that copies the
#: context, like the scheduler's apply pool, keeps it): requests and units are also counted per tag.
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("berth_meter_caller", default="")


@contextlib.contextmanager
def caller(tag: str) -> Iterator[None]:
    """Count the requests made in this context (and contexts copied from it) under `tag` too."""
    token = CALLER.set(tag)
    try:
        yield
    finally:
        CALLER.reset(token)


class Meter:
    """Thread-safe counters of what the control plane would be billed for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: access key -> the caller it belongs to (a Lambda function's role credentials); kept by reset()
        self._caller_names: dict[str, str] = {}
        #: access key -> caller tag (`tag_access_key`): a client in another thread or process, whose
        #: context variable the server never sees, is counted under its tag; kept by reset()
        self._key_tags: dict[str, str] = {}
        #: caller tag -> (its calls the emulator is serving now, since when); kept by reset()
        self._in_flight: dict[str, tuple[int, float]] = {}
        #: access key -> what the sandbox holding it serves now (`begin_activity`); kept by reset()
        self._activities: dict[str, str] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            serving = {tag: n for tag, (n, _) in self._in_flight.items() if n > 0}
            if serving:  # calls in flight count from here on
                now = time.perf_counter()
                self._in_flight = {tag: (n, now) for tag, n in serving.items()}
            self._requests: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
            #: Requests and DynamoDB units by caller tag (`caller()`: e.g. a benchmark's own calls).
            self._callers: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
            #: caller (a function's name, else "other") -> service -> operation -> count
            self._by_caller: defaultdict[str, defaultdict[str, defaultdict[str, int]]] = defaultdict(
                lambda: defaultdict(lambda: defaultdict(int))
            )
            #: caller -> activity -> service -> operation -> count (calls made while an activity ran)
            self._by_activity: defaultdict[str, defaultdict[str, defaultdict[str, defaultdict[str, int]]]] = (
                defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(int))))
            )
            #: caller -> activity -> how many times a sandbox began serving it (its invocations)
            self._activity_counts: defaultdict[str, defaultdict[str, int]] = defaultdict(
                lambda: defaultdict(int)
            )
            self._dynamodb: defaultdict[str, dict[str, float]] = defaultdict(
                lambda: {"write_units": 0.0, "read_units": 0.0}
            )
            self._sqs = {"requests": 0, "billed_requests": 0, "payload_bytes": 0}
            self._events = {"put_events": 0, "entries": 0, "billed_events": 0}
            self._lambda: defaultdict[str, dict[str, float]] = defaultdict(
                lambda: {"invocations": 0, "billed_ms": 0, "gb_seconds": 0.0, "memory_mb": 0}
            )
            self._transitions: defaultdict[str, int] = defaultdict(int)
            self._api_requests = 0
            self._log_bytes = 0

    # -- recorders (hooks for code that serves AWS without an API request) ----------------------------------
    def name_caller(self, access_key: str, caller: str) -> None:
        """Attribute requests signed with `access_key` to `caller` (the Lambda runtime names each
        function's role credentials after the function)."""
        with self._lock:
            self._caller_names[access_key] = caller

    def tag_access_key(self, access_key: str, tag: str) -> None:
        """Count requests signed with `access_key` (and their DynamoDB units) under caller tag `tag`,
        as `caller(tag)` does for calls made in the server's own context."""
        with self._lock:
            self._key_tags[access_key] = tag

    def begin_activity(self, access_key: str, activity: str) -> None:
        """Until `end_activity`, requests signed with `access_key` also count under `activity` (a
        Lambda sandbox serves one event at a time, so its calls meanwhile are that event's)."""
        with self._lock:
            self._activities[access_key] = activity
            self._activity_counts[self._caller_names.get(access_key, "other")][activity] += 1

    def end_activity(self, access_key: str) -> None:
        with self._lock:
            self._activities.pop(access_key, None)

    def tag_of(self, access_key: str) -> str:
        return CALLER.get() or self._key_tags.get(access_key, "")

    def record_request(self, service: str, operation: str, access_key: str = "") -> None:
        tag = self.tag_of(access_key)
        with self._lock:
            self._requests[service][operation] += 1
            name = self._caller_names.get(access_key, "other")
            self._by_caller[name][service][operation] += 1
            activity = self._activities.get(access_key)
            if activity is not None:
                self._by_activity[name][activity][service][operation] += 1
            if tag:
                self._callers[tag][f"{service}:{operation}"] += 1

    def record_dynamodb(self, table: str, *, write_units: float = 0.0, read_units: float = 0.0) -> None:
        tag = CALLER.get()
        with self._lock:
            entry = self._dynamodb[table]
            entry["write_units"] += write_units
            entry["read_units"] += read_units
            if tag:
                self._callers[tag]["dynamodb_write_units"] += write_units
                self._callers[tag]["dynamodb_read_units"] += read_units

    def record_sqs(self, payload_bytes: int) -> None:
        with self._lock:
            self._sqs["requests"] += 1
            self._sqs["billed_requests"] += _chunks(payload_bytes, SQS_CHUNK_BYTES)
            self._sqs["payload_bytes"] += payload_bytes

    def record_put_events(self, entry_sizes: list[int]) -> None:
        with self._lock:
            self._events["put_events"] += 1
            self._events["entries"] += len(entry_sizes)
            self._events["billed_events"] += sum(_chunks(size, EVENTS_CHUNK_BYTES) for size in entry_sizes)

    def record_lambda(self, function_name: str, duration_ms: float, memory_mb: int) -> None:
        """One invocation: Lambda bills its duration rounded up to the millisecond at its memory size."""
        billed_ms = max(1, math.ceil(duration_ms))
        with self._lock:
            entry = self._lambda[function_name]
            entry["invocations"] += 1
            entry["billed_ms"] += billed_ms
            entry["gb_seconds"] += billed_ms / 1000 * memory_mb / 1024
            entry["memory_mb"] = memory_mb

    def record_state_entered(self, event_type: str) -> None:
        with self._lock:
            self._transitions[event_type] += 1

    def record_api_request(self) -> None:
        with self._lock:
            self._api_requests += 1

    def record_log_bytes(self, size: int) -> None:
        with self._lock:
            self._log_bytes += size

    # -- reading ---------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            tables = {name: dict(units) for name, units in self._dynamodb.items()}
            functions = {name: dict(entry) for name, entry in self._lambda.items()}
            return {
                "requests": {svc: dict(ops) for svc, ops in self._requests.items()},
                "by_caller": {tag: dict(counts) for tag, counts in self._callers.items()},
                "requests_by_caller": {
                    caller: {svc: dict(ops) for svc, ops in services.items()}
                    for caller, services in self._by_caller.items()
                },
                "requests_by_activity": {
                    caller: {
                        activity: {svc: dict(ops) for svc, ops in services.items()}
                        for activity, services in activities.items()
                    }
                    for caller, activities in self._by_activity.items()
                },
                "activities_by_caller": {
                    caller: dict(counts) for caller, counts in self._activity_counts.items()
                },
                "dynamodb": {
                    "write_units": sum(t["write_units"] for t in tables.values()),
                    "read_units": sum(t["read_units"] for t in tables.values()),
                    "tables": tables,
                },
                "sqs": dict(self._sqs),
                "events": dict(self._events),
                "lambda": {
                    "invocations": int(sum(f["invocations"] for f in functions.values())),
                    "billed_ms": int(sum(f["billed_ms"] for f in functions.values())),
                    "gb_seconds": sum(f["gb_seconds"] for f in functions.values()),
                    "functions": functions,
                },
                "stepfunctions": {
                    "state_transitions": sum(self._transitions.values()),
                    "by_type": dict(self._transitions),
                },
                "apigateway": {"requests": self._api_requests},
                "logs": {"ingested_bytes": self._log_bytes},
            }

    # -- the request path --------------------------------------------------------------------------------
    def observe(self, request: ObservedRequest, call: Callable[[], Answer]) -> Answer:
        """Serve `request` with `call()` and count it (DynamoDB writes run under the write lock), after
        the added AWS latency (`aws_latency`, slept before any lock is taken)."""
        aws_latency.wait()
        tag = self.tag_of(request.access_key)
        if not tag:
            return self._observe(request, call)
        self._busy(tag, +1)
        try:
            with caller(tag):
                return self._observe(request, call)
        finally:
            self._busy(tag, -1)

    def _busy(self, tag: str, delta: int) -> None:
        """The wall time during which the emulator serves at least one of the tag's calls (the added
        latency not in it): what a benchmark takes off its figure to show its design's cost apart
        from moto's (``emulator_s``)."""
        now = time.perf_counter()
        with self._lock:
            serving, since = self._in_flight.get(tag, (0, now))
            if serving > 0:
                self._callers[tag]["emulator_s"] += now - since
            self._in_flight[tag] = (serving + delta, now)

    def _observe(self, request: ObservedRequest, call: Callable[[], Answer]) -> Answer:
        service, operation = request.service, request.operation
        if service == "dynamodb" and operation in _DYNAMODB_WRITES:
            answer = self._dynamodb_write(request, call)
        else:
            answer = call()
        try:
            self.record_request(service, operation, request.access_key)
            if service == "dynamodb" and operation in _DYNAMODB_READS:
                self._dynamodb_read(request, answer)
            elif service == "sqs":
                self._sqs_request(request, answer)
            elif service == "events" and operation == "PutEvents":
                self._put_events(request)
            elif service == "logs" and operation == "PutLogEvents":
                events = request.json_body().get("logEvents") or []
                self.record_log_bytes(
                    sum(len(str(e.get("message", "")).encode()) + LOG_EVENT_OVERHEAD_BYTES for e in events)
                )
        except Exception:  # metering must never break a request
            pass
        return answer

    # DynamoDB -------------------------------------------------------------------------------------
    def _dynamodb_write(self, request: ObservedRequest, call: Callable[[], Answer]) -> Answer:
        body = request.json_body()
        with dynamodb_isolation.WRITE_LOCK:
            try:
                backend = _dynamodb_backend(request)
                targets = list(_written_items(backend, request.operation, body))
                before = [_stored_item(backend, table, key) for table, key, _factor, _new in targets]
            except Exception:
                backend, targets, before = None, [], []
            answer = call()
            try:
                after = [_stored_item(backend, table, key) for table, key, _factor, _new in targets]
            except Exception:
                after = [None] * len(targets)
        status, _, payload = answer
        if status >= 300 and _error_type(payload) not in _CHARGED_WRITE_ERRORS:
            return answer  # a validation error or a missing table is not charged
        for (table, _key, factor, new), old, now in zip(targets, before, after, strict=True):
            size = max(item_size(old), item_size(now), new)
            self.record_dynamodb(table, write_units=factor * write_units(size))
            try:
                for index, units in _index_write_units(backend.get_table(table), old, now):
                    self.record_dynamodb(f"{table}/{index}", write_units=units)
            except Exception:
                pass
        return answer

    def _dynamodb_read(self, request: ObservedRequest, answer: Answer) -> None:
        status, _, payload = answer
        if status >= 300:
            return
        body, result = request.json_body(), _json(payload)
        operation = request.operation
        if operation == "GetItem":
            units = read_units(item_size(result.get("Item")), bool(body.get("ConsistentRead")))
            self.record_dynamodb(body.get("TableName", ""), read_units=units)
        elif operation in ("Query", "Scan"):
            size = sum(item_size(item) for item in result.get("Items") or [])
            units = read_units(size, bool(body.get("ConsistentRead")))
            self.record_dynamodb(body.get("TableName", ""), read_units=units)
        elif operation == "BatchGetItem":
            for table, items in (result.get("Responses") or {}).items():
                spec = (body.get("RequestItems") or {}).get(table) or {}
                consistent = bool(spec.get("ConsistentRead"))
                missing = max(0, len(spec.get("Keys") or []) - len(items))
                units = sum(read_units(item_size(item), consistent) for item in items)
                self.record_dynamodb(table, read_units=units + missing * read_units(0, consistent))
        elif operation == "TransactGetItems":
            requested = body.get("TransactItems") or []
            for spec, response in zip(requested, result.get("Responses") or [], strict=False):
                table = (spec.get("Get") or {}).get("TableName", "")
                self.record_dynamodb(table, read_units=2 * read_units(item_size(response.get("Item")), True))

    # SQS and EventBridge --------------------------------------------------------------------
    def _sqs_request(self, request: ObservedRequest, answer: Answer) -> None:
        operation = request.operation
        body = request.json_body()
        size = 0
        if operation == "SendMessage":
            size = _sqs_message_size(body) if body else _sqs_form_size(request.form(), "")
        elif operation == "SendMessageBatch":
            if body:
                size = sum(_sqs_message_size(entry) for entry in body.get("Entries") or [])
            else:
                form = request.form()
                prefixes = {k.rsplit(".", 1)[0] for k in form if k.endswith(".MessageBody")}
                size = sum(_sqs_form_size(form, prefix + ".") for prefix in prefixes)
        elif operation == "ReceiveMessage":
            result = _json(answer[2])
            size = sum(_sqs_message_size(message) for message in result.get("Messages") or [])
        self.record_sqs(size)

    def _put_events(self, request: ObservedRequest) -> None:
        entries = request.json_body().get("Entries") or []
        self.record_put_events([_event_entry_size(entry) for entry in entries])


def _sqs_message_size(message: dict[str, Any]) -> int:
    size = len(str(message.get("MessageBody", message.get("Body", ""))).encode())
    for name, attribute in (message.get("MessageAttributes") or {}).items():
        size += len(name.encode()) + len(str(attribute.get("DataType", "")).encode())
        if "StringValue" in attribute:
            size += len(str(attribute["StringValue"]).encode())
        if "BinaryValue" in attribute:
            size += _binary_size(attribute["BinaryValue"])
    return size


def _sqs_form_size(form: dict[str, list[str]], prefix: str) -> int:
    """Payload of a query-protocol send (`MessageBody` and `MessageAttribute.N.*` values)."""
    size = len((form.get(prefix + "MessageBody") or [""])[0].encode())
    for key, values in form.items():
        if key.startswith(prefix + "MessageAttribute.") and key.rsplit(".", 1)[-1] in (
            "Name",
            "DataType",
            "StringValue",
        ):
            size += len(values[0].encode())
    return size


def _event_entry_size(entry: dict[str, Any]) -> int:
    """EventBridge's PutEvents entry size: 14 bytes for Time, plus Source, DetailType, Detail, Resources."""
    size = 14 if entry.get("Time") else 0
    for field_name in ("Source", "DetailType", "Detail"):
        size += len(str(entry.get(field_name) or "").encode())
    size += sum(len(str(resource).encode()) for resource in entry.get("Resources") or [])
    return size


def _dynamodb_backend(request: ObservedRequest) -> Any:
    account = moto_compat.surface("moto.iam.models:get_account_id_from")(request.access_key)
    return moto_compat.surface("moto.dynamodb.models:dynamodb_backends")[account][request.region]


def _written_items(
    backend: Any, operation: str, body: dict[str, Any]
) -> Iterable[tuple[str, dict[str, Any], int, int]]:
    """(table, key, factor, size of the item written or 0) for each item a write request touches."""

    def key_of(table_name: str, item: dict[str, Any]) -> dict[str, Any]:
        table = backend.get_table(table_name)
        names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
        return {name: item[name] for name in names if name in item}

    if operation == "PutItem":
        item = body.get("Item") or {}
        yield body["TableName"], key_of(body["TableName"], item), 1, item_size(item)
    elif operation in ("UpdateItem", "DeleteItem"):
        yield body["TableName"], body.get("Key") or {}, 1, 0
    elif operation == "BatchWriteItem":
        for table_name, requests in (body.get("RequestItems") or {}).items():
            for spec in requests:
                if "PutRequest" in spec:
                    item = spec["PutRequest"].get("Item") or {}
                    yield table_name, key_of(table_name, item), 1, item_size(item)
                elif "DeleteRequest" in spec:
                    yield table_name, spec["DeleteRequest"].get("Key") or {}, 1, 0
    elif operation == "TransactWriteItems":
        for spec in body.get("TransactItems") or []:
            for kind, action in spec.items():
                table_name = action.get("TableName", "")
                if kind == "Put":
                    item = action.get("Item") or {}
                    yield table_name, key_of(table_name, item), 2, item_size(item)
                else:  # Update, Delete, ConditionCheck
                    yield table_name, action.get("Key") or {}, 2, 0


def _stored_item(backend: Any, table_name: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The item stored under `key` now, in wire format (None when there is none or no such table)."""
    if backend is None:
        return None
    try:
        table = backend.get_table(table_name)
        hash_key, range_key = backend.get_keys_value(table, key)
        stored = table.get_item(hash_key, range_key)
    except Exception:
        return None
    if stored is None:
        return None
    attributes: dict[str, Any] = stored.to_json()["Attributes"]
    return attributes


def _project(
    item: dict[str, Any] | None, keys: list[str], table_keys: list[str], projection: dict[str, Any]
) -> dict[str, Any] | None:
    """What an index holds of `item` (None: the item lacks the index's key, a sparse index skips it)."""
    if item is None or any(name not in item for name in keys):
        return None
    kind = projection.get("ProjectionType", "ALL")
    if kind == "ALL":
        return item
    wanted = set(table_keys) | set(keys)
    if kind == "INCLUDE":
        wanted |= set(projection.get("NonKeyAttributes") or [])
    return {name: value for name, value in item.items() if name in wanted}


def _index_write_units(
    table: Any, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> Iterable[tuple[str, int]]:
    """WRUs a write costs in each secondary index, as DynamoDB counts them.

    An item enters an index when it has the index's key attributes. Putting an item into an index or
    removing it is one index write of its projected size; changing its index key is two (a delete and a
    put); changing a projected attribute only is one, of the larger projection; changing nothing projected
    is none (so a failed conditional write costs nothing in the indexes)."""
    table_keys = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
    for index in list(table.global_indexes or []) + list(table.indexes or []):
        keys = [part["AttributeName"] for part in index.schema]
        projection = index.projection or {}

        old, new = (
            _project(before, keys, table_keys, projection),
            _project(after, keys, table_keys, projection),
        )
        if old is None and new is None:
            continue
        if old is None or new is None:
            units = write_units(item_size(old if new is None else new))
        elif any(old[name] != new[name] for name in keys):
            units = write_units(item_size(old)) + write_units(item_size(new))
        elif old != new:
            units = write_units(max(item_size(old), item_size(new)))
        else:
            continue
        yield index.name, units


#: The meter of this process (moto's backends, and so the local cloud, are process-global).
METER = Meter()


# -- the moto server: middleware and the local-only route -------------------------------------------
class MeterMiddleware:
    """WSGI middleware around moto's server app: meters each AWS request, serves `/_berth/meter`."""

    #: Services whose request and response bodies the meter reads; others pass through untouched (but for
    #: query-protocol requests, whose operation is in the form-encoded body).
    BODY_SERVICES = frozenset({"dynamodb", "sqs", "events", "logs"})

    def __init__(self, app: Any, meter: Meter | None = None) -> None:
        self.app = app
        self.meter = meter if meter is not None else METER

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith(METER_PATH):
            return self._meter_route(environ, start_response, path)
        if path == aws_latency.LATENCY_PATH:
            return self._latency_route(environ, start_response)
        if path.startswith("/moto-api"):
            return self.app(environ, start_response)
        headers = [
            (key[5:].replace("_", "-"), str(value))
            for key, value in environ.items()
            if key.startswith("HTTP_")
        ]
        headers.append(("content-type", environ.get("CONTENT_TYPE", "")))
        probe = ObservedRequest(
            environ.get("REQUEST_METHOD", "GET"), path, environ.get("QUERY_STRING", ""), headers, b""
        )
        from berth_tools.localcloud import faults  # (faults imports this module)

        blocked = faults.fault_answer(probe)  # `berth local fault region-outage`, `ddb-throttle`
        if blocked is not None:
            status, pairs, payload = blocked
            start_response(f"{status} {'Bad Request' if status == 400 else 'Service Unavailable'}", pairs)
            return [payload]
        form_encoded = "x-www-form-urlencoded" in environ.get("CONTENT_TYPE", "")  # Action= in the body
        if probe.service not in self.BODY_SERVICES and not form_encoded:
            self.meter.record_request(probe.service, probe.operation, probe.access_key)
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        request = ObservedRequest(probe.method, path, probe.query, headers, body)
        captured: dict[str, Any] = {}

        def call() -> Answer:
            def capture(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                captured["status"], captured["headers"] = status, response_headers
                return lambda _data: None

            app_iter = self.app(environ, capture)
            try:
                payload = b"".join(app_iter)
            finally:
                close = getattr(app_iter, "close", None)
                if close is not None:
                    close()
            return int(captured["status"].split(" ", 1)[0]), list(captured["headers"]), payload

        _, _, payload = self.meter.observe(request, call)
        start_response(captured["status"], captured["headers"])
        return [payload]

    def _latency_route(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ.get("REMOTE_ADDR", "127.0.0.1") not in LOCAL_ADDRESSES:
            return _json_answer(start_response, "403 Forbidden", {"message": "127.0.0.1 only"})
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        status, answer = aws_latency.handle_http(environ.get("REQUEST_METHOD", "GET"), body)
        return _json_answer(start_response, f"{status} {'OK' if status == 200 else 'Error'}", answer)

    def _meter_route(self, environ: dict[str, Any], start_response: Any, path: str) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if environ.get("REMOTE_ADDR", "127.0.0.1") not in LOCAL_ADDRESSES:
            return _json_answer(
                start_response, "403 Forbidden", {"message": "the meter answers 127.0.0.1 only"}
            )
        if path == METER_PATH and method == "GET":
            return _json_answer(start_response, "200 OK", report(self.meter))
        if path == METER_RESET_PATH and method == "POST":
            self.meter.reset()
            return _json_answer(start_response, "200 OK", report(self.meter))
        return _json_answer(start_response, "404 Not Found", {"message": f"no {method} {path}"})


def _json_answer(start_response: Any, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body, sort_keys=True).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def report(meter: Meter | None = None) -> dict[str, Any]:
    """The meter's snapshot with its bill at list prices (what `GET /_berth/meter` answers)."""
    from berth_tools.localcloud import aws_prices

    snapshot = (meter or METER).snapshot()
    return {"meter": snapshot, "bill": aws_prices.bill(snapshot)}


def read_meter(endpoint_url: str, reset: bool = False, timeout: float = 10.0) -> dict[str, Any]:
    """A bench client's view: `GET /_berth/meter` (or `POST /_berth/meter/reset`) of the local cloud whose
    AWS endpoint (`AWS_ENDPOINT_URL`, the moto server) is `endpoint_url`: `{"meter": ..., "bill": ...}`."""
    import urllib.request

    path = METER_RESET_PATH if reset else METER_PATH
    request = urllib.request.Request(endpoint_url.rstrip("/") + path, data=b"" if reset else None)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def wrap_server(server: Any, meter: Meter | None = None) -> None:
    """Put `MeterMiddleware` around the WSGI app of a started moto `ThreadedMotoServer` (idempotent)."""
    werkzeug_server = server._server  # declared: moto_compat ThreadedMotoServer#_server
    if not isinstance(werkzeug_server.app, MeterMiddleware):
        werkzeug_server.app = MeterMiddleware(werkzeug_server.app, meter)


# -- Step Functions: count StateEntered events as moto's execution engine records them -----------------------
_SFN_PATCH: list[moto_compat.Patch] = []


def install_state_machine_hook(meter: Meter | None = None) -> None:
    """Count every `...StateEntered` history event of every execution (idempotent)."""
    if _SFN_PATCH:
        return
    original = moto_compat.surface(_STATE_MACHINE_HOOK)
    target = meter if meter is not None else METER

    def add_event(self: Any, context: Any, event_type: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(getattr(event_type, "value", event_type))
        if name.endswith("StateEntered"):
            target.record_state_entered(name)
        return original(self, context, event_type, *args, **kwargs)

    add_event.__wrapped__ = original  # type: ignore[attr-defined]
    original_retry = moto_compat.surface(_RETRY_HOOK)

    def handle_retry(self: Any, env: Any, failure_event: Any) -> Any:
        outcome = original_retry(self, env, failure_event)
        if getattr(outcome, "name", None) == "CanRetry":
            target.record_state_entered(RETRY_TRANSITION)
        return outcome

    handle_retry.__wrapped__ = original_retry  # type: ignore[attr-defined]
    _SFN_PATCH.append(moto_compat.replace(_STATE_MACHINE_HOOK, add_event))
    _SFN_PATCH.append(moto_compat.replace(_RETRY_HOOK, handle_retry))
