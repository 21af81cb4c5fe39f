"""A stand-in Lambda handler for the local cloud's tests: echoes what it received."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    print(f"fake handler: {event.get('httpMethod')} {event.get('path')}")
    if event.get("path", "").endswith("/boom"):
        raise RuntimeError("boom requested")
    if event.get("queryStringParameters") and "sleep" in event["queryStringParameters"]:
        time.sleep(float(event["queryStringParameters"]["sleep"]))
    env = {
        key: os.environ.get(key) for key in ("BERTH_JOBS_TABLE", "AWS_ENDPOINT_URL", "AWS_REGION", "_HANDLER")
    }
    echo = {
        "event": event,
        "env": env,
        "context": {
            "function_name": context.function_name,
            "memory_limit_in_mb": context.memory_limit_in_mb,
            "invoked_function_arn": context.invoked_function_arn,
            "aws_request_id": context.aws_request_id,
            "remaining_ms": context.get_remaining_time_in_millis(),
            "log_group_name": context.log_group_name,
        },
    }
    if event.get("httpMethod") is None:  # a direct invocation, not through the front door
        return echo
    return {
        "statusCode": 200,
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {"X-Echo": ["a", "b"]},
        "body": json.dumps(echo),
        "isBase64Encoded": False,
    }
