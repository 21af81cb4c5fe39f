"""Batch Job State Change events (each region's rule forwards them to the home bus, a rule there to
``BatchEventsQueue``). The event only names the Batch job: ``CloudDispatchService.on_event`` re-reads
the job from the store and the Batch job from DescribeJobs before moving anything. A failure to
reach the store or Batch leaves the record on the queue (batch item failure) for a later delivery."""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.handlers.runtime import cloud_dispatch_service

logger = Logger()
processor = BatchProcessor(event_type=EventType.SQS)


def handle(record: SQSRecord) -> None:
    try:
        event = json.loads(record.body)
        detail = event["detail"]
        batch_job_id, name = str(detail["jobId"]), str(detail["jobName"])
    except (ValueError, KeyError, TypeError):
        logger.warning("not a Batch Job State Change event; dropped")
        return
    service = cloud_dispatch_service()
    if service is None:
        raise RuntimeError("no cloud dispatcher configured (BERTH_BATCH_SUBMIT_QUEUE_URL)")
    outcome = service.on_event(batch_job_id, name)
    logger.info(
        "batch event",
        extra={
            "batch_job_id": batch_job_id,
            "batch_job_name": name,
            "status": detail.get("status"),
            "outcome": outcome,
        },
    )


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return dict(
        process_partial_response(event=event, record_handler=handle, processor=processor, context=context)
    )
