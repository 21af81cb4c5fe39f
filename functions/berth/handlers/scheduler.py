"""The scheduler service's Lambda: every batch of trigger messages (submits, finishes, capacity
changes, ``wake_at``, the timer) runs one pass. Reserved concurrency 1 keeps it to one pass at a time;
a burst of triggers arrives as a few batches, so it costs a few passes."""

from __future__ import annotations

import contextlib
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.domain.errors import DomainError, StoreUnavailable
from berth.handlers import telemetry
from berth.handlers.runtime import array_expander, pass_trigger, scheduler_service

logger = Logger()
metrics = Metrics(namespace=telemetry.NAMESPACE, service=telemetry.SCHEDULER_SERVICE)


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    records = event.get("Records") or []
    expander = array_expander()
    try:
        more = expander.run()
    except DomainError as exc:  # the store is down: the pass says so too; the next one resumes
        logger.warning("array expansion stopped", extra={"error": str(exc)})
        more = True
    if more or expander.stats.get("tasks_created"):
        # Work left on an array: the next invocation goes on with it (else the timer's does). New
        # tasks get one more pass soon too (their own first waits do not ask for one, and the queue
        # index this pass reads may not show them yet).
        with contextlib.suppress(StoreUnavailable):
            pass_trigger().request("array expansion continues" if more else "array tasks created")
    # The pass stops starting placements well before the invocation's timeout (pass_apply.Deadline).
    report = scheduler_service().run_pass(time_left=lambda: context.get_remaining_time_in_millis() / 1000)
    out = report.as_dict()
    if expander.stats.get("starts_failed"):
        logger.warning("array task executions not started", extra={"error": expander.last_error})
    logger.info("scheduling pass", extra={"triggers": len(records), "arrays": expander.stats, **out})
    metrics.add_metric("JobsPlaced", MetricUnit.Count, report.placed)
    metrics.add_metric("JobsPending", MetricUnit.Count, report.pending)
    metrics.add_metric("PlacementsDeferred", MetricUnit.Count, report.deferred)
    metrics.add_metric("PassSeconds", MetricUnit.Seconds, report.load_s + report.decide_s + report.apply_s)
    metrics.add_metric("HostsLost", MetricUnit.Count, len(report.lost_hosts))
    metrics.add_metric("JobsNotConsidered", MetricUnit.Count, report.not_considered)
    metrics.add_metric("OldestQueuedSeconds", MetricUnit.Seconds, report.figures.oldest_queued_s)
    telemetry.scheduling_pass(report)
    return {"batchItemFailures": [], "pass": out}
