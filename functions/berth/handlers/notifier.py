"""Publishes every job state change to the Berth EventBridge bus: the job-events table's stream is
the outbox (an event row is written in the same transaction as the job's new state), so a change is
never lost between the store and the bus; delivery is at least once (consumers dedupe on job_id+seq)."""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from boto3.dynamodb.types import TypeDeserializer

from berth.handlers.runtime import event_publisher

logger = Logger()
_deserialize = TypeDeserializer().deserialize


def details(event: DynamoDBStreamEvent) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for record in event.records:
        if record.raw_event.get("eventName") != "INSERT":
            continue
        image = (record.raw_event.get("dynamodb") or {}).get("NewImage") or {}
        detail = image.get("detail")
        if detail is None:
            continue
        value = _deserialize(detail)
        if isinstance(value, str):  # pynamodb's JSONAttribute stores a JSON string
            value = json.loads(value)
        out.append(value)
    return out


@logger.inject_lambda_context(clear_state=True)
@event_source(data_class=DynamoDBStreamEvent)
def lambda_handler(event: DynamoDBStreamEvent, context: LambdaContext) -> dict[str, Any]:
    found = details(event)
    if found:
        event_publisher().publish(found)
    logger.info("published job state changes", extra={"count": len(found)})
    return {"published": len(found)}
