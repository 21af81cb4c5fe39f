"""A queued job's place in its team's queue, as the job API shows it: read from the team's queue
summary, which the scheduling pass writes from the core's forecast (``berth.domain.queue_summary``).
One read per team per answer; advisory, so a store that cannot answer leaves the fields empty rather
than failing the read of the job."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from berth.domain.errors import StoreUnavailable
from berth.domain.ports import QueueSummaries
from berth.domain.queue_summary import QueueSummary, no_queue_view
from berth.domain.status import JobStatus


def with_queue(jobs: Iterable[dict[str, Any]], summaries: QueueSummaries | None) -> list[dict[str, Any]]:
    """Each public job (``Job.public()``) with ``queue_position``, ``queue_length``,
    ``estimated_start``, ``estimated_start_basis`` and ``queue_as_of`` (None unless it is QUEUED and
    the last pass ranked it; an array's parent is not queued itself)."""
    read: dict[str, QueueSummary | None] = {}
    out = []
    for job in jobs:
        view = no_queue_view()
        queued = job.get("status") == str(JobStatus.QUEUED) and not job.get("array")
        if queued and summaries is not None:
            tenant = job["tenant"]
            if tenant not in read:
                try:
                    read[tenant] = summaries.get(tenant)
                except StoreUnavailable:
                    read[tenant] = None
            summary = read[tenant]
            if summary is not None:
                view = summary.view(job["id"])
        out.append({**job, **view})
    return out
