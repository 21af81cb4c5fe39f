"""The Batch submit queue's consumer: one ``SubmitRequest`` per message, each submitted at most once
(``CloudDispatchService.submit``). Throttled beyond the adapter's backoff, or the store briefly
unavailable, the message is reported as a batch item failure and SQS delivers it again later: never
dropped. A malformed message cannot become valid by waiting: it is logged and dropped."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from berth.dal.batch import FIRST_ATTRIBUTE
from berth.domain.cloud import SubmitRequest
from berth.handlers.runtime import cloud_dispatch_service

logger = Logger()
metrics = Metrics(namespace="Berth")
processor = SqsFifoPartialProcessor(skip_group_on_error=True)


def first_delivery(record: SQSRecord) -> bool:
    """The dispatch's own request (``berth-first``), received for the first time: no SubmitJob of its
    attempt can have been made (``CloudDispatchService.submit``)."""
    marked = ((record.get("messageAttributes") or {}).get(FIRST_ATTRIBUTE) or {}).get("stringValue") == "1"
    return marked and (record.get("attributes") or {}).get("ApproximateReceiveCount") == "1"


def handle(record: SQSRecord) -> None:
    try:
        request = SubmitRequest.model_validate_json(record.body)
    except ValidationError as exc:
        logger.error("malformed submit request dropped", extra={"errors": exc.errors(include_url=False)})
        return
    service = cloud_dispatch_service()
    if service is None:
        raise RuntimeError("no cloud dispatcher configured (BERTH_BATCH_SUBMIT_QUEUE_URL)")
    # CloudThrottled / StoreUnavailable propagate: the record is a batch item failure, redelivered.
    outcome = service.submit(request, first=first_delivery(record))
    logger.info(
        "batch submit", extra={"job_id": request.job_id, "attempt": request.attempt, "outcome": outcome}
    )
    metrics.add_metric(f"BatchSubmit_{outcome}", MetricUnit.Count, 1)


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return dict(
        process_partial_response(event=event, record_handler=handle, processor=processor, context=context)
    )
