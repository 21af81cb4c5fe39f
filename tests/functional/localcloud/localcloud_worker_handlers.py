"""Lambda handlers for the worker-process runtime's tests (`test_lambda_workers`)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import boto3

#: Set at import (the init phase): a fresh sandbox has a fresh value.
STARTED = time.time()


def echo(event: dict[str, Any], context: Any) -> dict[str, Any]:
    print(f"echo {event.get('say', '')}")
    print("to stderr", file=sys.stderr)
    if event.get("sleep"):
        time.sleep(float(event["sleep"]))
    return {
        "pid": os.getpid(),
        "event": event,
        "env": dict(os.environ),
        "started": STARTED,
        "request_id": context.aws_request_id,
        "remaining_ms": context.get_remaining_time_in_millis(),
    }


def crash(event: dict[str, Any], context: Any) -> dict[str, Any]:
    print("about to exit", flush=True)
    os._exit(int(event.get("code", 3)))


def call_aws(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """An SDK call from the sandbox, with the function's own credentials and endpoint."""
    identity = boto3.client("sts").get_caller_identity()
    return {"arn": identity["Arn"], "pid": os.getpid()}


def not_serialisable(event: dict[str, Any], context: Any) -> Any:
    return {"at": object()}
