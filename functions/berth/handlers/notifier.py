"""The job-events table's stream consumer. It publishes every job state change to the Berth
EventBridge bus: the stream is the outbox (an event row is written in the same transaction as the
job's new state), so a change is never lost between the store and the bus; delivery is at least once
(consumers dedupe on job_id+seq). Then it learns the batch's completed runs into their tenants'
run-time histories, one update per tenant per batch (``berth.logic.runtimes.learn``): advisory, so a
failure to learn is logged and the batch still succeeds, while a failure to publish fails it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.dal import job_stream
from berth.handlers.runtime import event_publisher, runtime_history
from berth.logic.runtimes import learn

logger = Logger()


def learn_runs(images: Iterable[Mapping[str, Any]]) -> int:
    """Learn the completed runs these rows carry; the number learnt. Never raises: the history is
    advisory, a run it could not learn is lost (logged)."""
    runs = job_stream.observations(images)
    if not runs:
        return 0
    try:
        learnt = learn(runtime_history(), runs)
    except Exception:
        logger.exception("could not learn completed runs (advisory)", extra={"runs": len(runs)})
        return 0
    if learnt.failed:
        logger.warning(
            "run-time history unavailable; runs not learnt (advisory)",
            extra={"tenants": list(learnt.failed), "runs": len(runs) - learnt.runs},
        )
    return learnt.runs


@logger.inject_lambda_context(clear_state=True)
@event_source(data_class=DynamoDBStreamEvent)
def lambda_handler(event: DynamoDBStreamEvent, context: LambdaContext) -> dict[str, Any]:
    images = job_stream.inserted(event.raw_event.get("Records") or [])
    found = job_stream.details(images)
    if found:
        # A failure fails the batch (retried, bisected); before learning, so a retry learns once.
        event_publisher().publish(found)
    learnt = learn_runs(images)
    logger.info("published job state changes", extra={"count": len(found), "learnt": learnt})
    return {"published": len(found), "learnt": learnt}
