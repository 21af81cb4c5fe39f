"""Batch Job State Change events (each region's rule forwards RUNNING, SUCCEEDED and FAILED to the
home bus, a rule there to ``BatchEventsQueue``). The event only names the Batch job: the batch's
events are read at once (``berth.logic.batch_events``: one BatchGetItem, one DescribeJobs per region)
and ``CloudDispatchService.on_event`` reconciles each from what was read before moving anything. A
failure to reach the store or Batch leaves the record on the queue (batch item failure) for a later
delivery."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.handlers.runtime import cloud_dispatch_service
from berth.logic.batch_events import BatchEvent, EventBatch, parse_event

logger = Logger()
processor = BatchProcessor(event_type=EventType.SQS)


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    records = event.get("Records") or []
    parsed: dict[str, BatchEvent | None] = {
        str(r.get("messageId")): parse_event(str(r.get("body", ""))) for r in records
    }
    events = [e for e in parsed.values() if e is not None]
    batch: EventBatch | None = None
    if events:
        service = cloud_dispatch_service()
        if service is None:
            raise RuntimeError("no cloud dispatcher configured (BERTH_BATCH_SUBMIT_QUEUE_URL)")
        batch = EventBatch(service, events)

    def handle(record: SQSRecord) -> None:
        found = parsed.get(record.message_id)
        if found is None or batch is None:
            logger.warning("not a Batch Job State Change event; dropped")
            return
        outcome = batch.handle(found)
        logger.info(
            "batch event",
            extra={
                "batch_job_id": found.batch_job_id,
                "batch_job_name": found.name,
                "status": found.reported,
                "outcome": outcome,
            },
        )

    return dict(
        process_partial_response(event=event, record_handler=handle, processor=processor, context=context)
    )
