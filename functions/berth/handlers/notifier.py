"""The job-events table's stream consumer. It publishes every job state change to the Berth
EventBridge bus: the stream is the outbox (an event row is written in the same transaction as the
job's new state), so a change is never lost between the store and the bus; delivery is at least once
(consumers dedupe on job_id+seq). Then it asks the scheduler for one pass when the batch's changes
can let it place a job (``berth.logic.pass_triggers``), and learns the batch's completed runs into
their tenants' run-time histories, one update per tenant per batch (``berth.logic.runtimes.learn``).
Both are best effort: a failure is logged and the batch still succeeds (the scheduler's timer runs a
pass anyway; the history is advisory), while a failure to publish fails it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.dal import job_stream
from berth.handlers.runtime import event_publisher, pass_trigger, runtime_history
from berth.logic.pass_triggers import pass_reason
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


def request_pass(images: Iterable[Mapping[str, Any]]) -> bool:
    """Ask the scheduler for one pass when these rows' changes can let it place a job; whether one
    was asked. Never raises: a lost request only delays placement until the timer's pass (at most a
    minute), while failing the batch would publish its notifications again."""
    reason = pass_reason(job_stream.events(images))
    if reason is None:
        return False
    try:
        pass_trigger().request(reason)
    except Exception:
        logger.exception(
            "could not ask for a scheduling pass (the timer's pass runs anyway)", extra={"reason": reason}
        )
        return False
    return True


@logger.inject_lambda_context(clear_state=True)
@event_source(data_class=DynamoDBStreamEvent)
def lambda_handler(event: DynamoDBStreamEvent, context: LambdaContext) -> dict[str, Any]:
    images = job_stream.inserted(event.raw_event.get("Records") or [])
    found = job_stream.details(images)
    if found:
        # A failure fails the batch (retried, bisected) before anything else: a retry asks and learns once.
        event_publisher().publish(found)
    requested = request_pass(images)
    learnt = learn_runs(images)
    logger.info(
        "published job state changes",
        extra={"count": len(found), "pass_requested": requested, "learnt": learnt},
    )
    return {"published": len(found), "pass_requested": requested, "learnt": learnt}
