"""One Lambda sandbox: a worker process that imports a function's handler once and runs its events.

Started by `lambda_workers.WorkerProcess` as ``python -u -m berth_tools.localcloud.lambda_worker FD``
with the function's own environment (its ``Environment.Variables``, Lambda's reserved variables, the
execution role's temporary credentials, ``AWS_ENDPOINT_URL`` pointing at the moto server over
loopback). ``FD`` is its end of a socket pair carrying `multiprocessing.connection` messages, JSON
each way:

- parent -> worker, first: ``{"handler": "module.function", "hooks": [["module:callable", [args]]]}``;
  each hook is called before the handler is imported (the local cloud's botocore hooks, such as an
  added per-call latency); the worker answers ``{"ready": true, "init_ms": ...}`` or
  ``{"ready": false, "error": {...}}`` (Lambda's ``Runtime.ImportModuleError``);
- parent -> worker, per event: ``{"request_id", "event", "deadline" (epoch seconds), "trace_id",
  "function_arn", "function_name", "function_version", "memory_mb", "log_group", "log_stream"}``;
  the worker answers ``{"payload": "<json>"}`` or ``{"error": {errorMessage, errorType, ...}}`` with
  ``"max_rss_mb"`` and ``"duration_ms"``.

The handler's stdout and stderr are the process's own (one pipe the parent reads: its logs). Before
each answer the worker flushes them and writes `END_MARK` and the request id on a line of its own, so
the parent knows where one invocation's output ends. One event at a time, as in a Lambda sandbox.
This module imports nothing but the standard library (the handler brings its own dependencies).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

#: Starts the line that closes one invocation's output (never in a handler's text: a control char).
END_MARK = "\x1eberth-end "


class LambdaContext:
    """The ``context`` object of the Python Lambda runtime."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.function_name: str = message["function_name"]
        self.function_version: str = message["function_version"]
        self.invoked_function_arn: str = message["function_arn"]
        self.memory_limit_in_mb: int = int(message["memory_mb"])
        self.aws_request_id: str = message["request_id"]
        self.log_group_name: str = message["log_group"]
        self.log_stream_name: str = message["log_stream"]
        self.identity = None
        self.client_context = None
        self._deadline = float(message["deadline"])

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.time()) * 1000))


def _error(exc: BaseException, error_type: str | None = None, request_id: str = "") -> dict[str, Any]:
    trace = traceback.format_exception(exc)
    error: dict[str, Any] = {
        "errorMessage": str(exc),
        "errorType": error_type or type(exc).__name__,
        "stackTrace": [line.rstrip("\n") for line in trace[1:]],
    }
    if request_id:
        error["requestId"] = request_id
    return error


def _max_rss_mb() -> int:
    return max(1, round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))  # KiB on Linux


def _end_of_output(request_id: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, f"\n{END_MARK}{request_id}\n".encode())


def _init(conn: Connection) -> Any:
    message = json.loads(conn.recv_bytes())
    started = time.monotonic()
    try:
        for target, args in message.get("hooks") or []:
            module_name, _, attr = str(target).partition(":")
            getattr(importlib.import_module(module_name), attr)(*args)
        module_name, _, attr = str(message["handler"]).rpartition(".")
        if not module_name:
            raise ImportError(f"Bad handler '{message['handler']}': expected module.function")
        handler = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        print(f"[ERROR] Runtime.ImportModuleError: {exc}\n{''.join(traceback.format_exception(exc))}")
        _end_of_output("init")
        conn.send_bytes(
            json.dumps({"ready": False, "error": _error(exc, "Runtime.ImportModuleError")}).encode()
        )
        return None
    _end_of_output("init")
    init_ms = (time.monotonic() - started) * 1000
    conn.send_bytes(json.dumps({"ready": True, "init_ms": init_ms}).encode())
    return handler


def _invoke(handler: Any, message: dict[str, Any]) -> dict[str, Any]:
    request_id = message["request_id"]
    os.environ["_X_AMZN_TRACE_ID"] = message.get("trace_id") or ""
    started = time.monotonic()
    answer: dict[str, Any]
    try:
        result = handler(message["event"], LambdaContext(message))
    except Exception as exc:
        error = _error(exc, request_id=request_id)
        print(f"[ERROR] {type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}", end="")
        answer = {"error": error}
    else:
        try:
            answer = {"payload": json.dumps(result)}
        except (TypeError, ValueError) as exc:
            answer = {"error": _error(exc, "Runtime.MarshalError", request_id)}
            print(f"[ERROR] Runtime.MarshalError: {exc}")
    answer["duration_ms"] = (time.monotonic() - started) * 1000
    answer["max_rss_mb"] = _max_rss_mb()
    return answer


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[1]))
    handler = _init(conn)
    if handler is None:
        return 1
    while True:
        try:
            message = json.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the local cloud closed the sandbox (or is gone)
            return 0
        answer = _invoke(handler, message)
        _end_of_output(message["request_id"])
        try:
            conn.send_bytes(json.dumps(answer).encode())
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
