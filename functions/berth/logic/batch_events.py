"""One SQS batch of Batch Job State Change events, read once (docs/workflow.md, "The cloud branch").

The events only name Batch jobs; what they say is re-read before anything moves. A batch of up to
ten events reads the Berth jobs they name with one BatchGetItem and the Batch jobs with one
DescribeJobs per region (100 ids a call), not one GetItem and one DescribeJobs per event. Several
events of one Batch job in a batch are acted on once (the state read is the same for all): the
one that reported its outcome, else the first; the others are done as duplicates. A read that
fails leaves those events to read on their own (and fail on their own, back to the queue).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from berth.domain.cloud import BatchJob, BatchStatus, CloudError, batch_job_task
from berth.domain.errors import StoreUnavailable
from berth.domain.job import Job
from berth.logic.cloud_dispatch import CloudDispatchService, EventReads, region_of

#: DescribeJobs takes at most 100 ids.
DESCRIBE_IDS = 100


@dataclass(frozen=True, slots=True)
class BatchEvent:
    """What a state-change event names: the Batch job, its name, the status it reported."""

    batch_job_id: str
    name: str
    reported: BatchStatus | None = None


def parse_event(body: str) -> BatchEvent | None:
    """The event in an SQS record's body; None when it is not a Batch Job State Change."""
    try:
        detail = json.loads(body)["detail"]
        batch_job_id, name = str(detail["jobId"]), str(detail["jobName"])
    except (ValueError, KeyError, TypeError):
        return None
    status = detail.get("status")
    reported = BatchStatus(status) if status in BatchStatus.__members__ else None
    return BatchEvent(batch_job_id, name, reported)


def read_once(service: CloudDispatchService, events: Sequence[BatchEvent]) -> EventReads:
    """The jobs and Batch jobs ``events`` name, in one BatchGetItem and a DescribeJobs per region."""
    named = {e.batch_job_id: batch_job_task(e.batch_job_id, e.name) for e in events}
    job_ids = sorted({p[0] for p in named.values() if p is not None})
    if not job_ids:
        return EventReads()
    try:
        found = service.jobs.get_many(job_ids)
    except StoreUnavailable:
        return EventReads()
    jobs: dict[str, Job | None] = {i: found.get(i) for i in job_ids}
    by_region: defaultdict[str, list[str]] = defaultdict(list)
    for batch_job_id, parsed in named.items():
        job = jobs.get(parsed[0]) if parsed is not None else None
        region = region_of(job) if job is not None else None
        if region is not None:
            by_region[region].append(batch_job_id)
    states: dict[str, BatchJob | None] = {}
    for region, ids in sorted(by_region.items()):
        for i in range(0, len(ids), DESCRIBE_IDS):
            chunk = ids[i : i + DESCRIBE_IDS]
            try:
                described = {b.batch_job_id: b for b in service.batch.describe(region, chunk)}
            except CloudError:
                continue  # these events describe their own
            states.update({b: described.get(b) for b in chunk})
    return EventReads(jobs=jobs, states=states)


class EventBatch:
    """The events of one SQS batch, reconciled with one read of everything they name."""

    def __init__(self, service: CloudDispatchService, events: Sequence[BatchEvent]) -> None:
        self.service = service
        self.reads = read_once(service, events)
        self._acted: dict[str, BatchEvent] = {}
        for event in events:
            chosen = self._acted.get(event.batch_job_id)
            if chosen is None or (event.reported is not None and event.reported.is_terminal):
                self._acted[event.batch_job_id] = event

    def handle(self, event: BatchEvent) -> str:
        """What ``CloudDispatchService.on_event`` did, or ``duplicate`` for an event whose Batch job
        another event of the batch acts on."""
        if self._acted.get(event.batch_job_id) is not event:
            return "duplicate"
        return self.service.on_event(event.batch_job_id, event.name, event.reported, self.reads)


__all__ = ["BatchEvent", "EventBatch", "parse_event", "read_once"]
