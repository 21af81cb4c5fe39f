"""The order in which a pass serves pending jobs: tenants by weighted dominant share (progressive
filling), within a tenant by priority then submit time (or longest predicted run); or FIFO."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from operator import attrgetter

from berth.domain.arrays import order_id
from berth.scheduler.context import RANK, PassContext
from berth.scheduler.snapshot import PendingJob

_JOB_ID = attrgetter("job_id")
_SUBMITTED = attrgetter("submitted_at")


def _order_id(job: PendingJob) -> str:
    return order_id(job.job_id)


def job_order_key(job: PendingJob) -> tuple[int, float, str]:
    """Within a tenant: higher priority first, then earlier submission."""
    return (-RANK[job.priority], job.submitted_at, order_id(job.job_id))


def longest_first(ctx: PassContext) -> Callable[[PendingJob], tuple[int, float, float, str]]:
    """Within a tenant: higher priority first, then longest predicted run, then earlier submission."""
    q = ctx.policy.runtime.wait_q

    def key(job: PendingJob) -> tuple[int, float, float, str]:
        return (
            -RANK[job.priority],
            -(ctx.remaining_s(job, q) or 0.0),
            job.submitted_at,
            order_id(job.job_id),
        )

    return key


def submit_order(pending: tuple[PendingJob, ...]) -> tuple[list[PendingJob], list[str]]:
    """``pending`` by (submit time, job id), and their ids: two stable single-key sorts (no key
    tuples to build; each is linear on a queue already nearly in order, the usual case)."""
    ordered = sorted(pending, key=_order_id)
    ordered.sort(key=_SUBMITTED)
    return ordered, list(map(_JOB_ID, ordered))


def ordered(ctx: PassContext) -> Iterator[PendingJob]:
    pending = ctx.snapshot.pending
    if ctx.policy.fair_share.ordering == "fifo":
        yield from submit_order(pending)[0]
        return
    queues: dict[str, list[PendingJob]] = {}
    for job in pending:
        queues.setdefault(job.tenant, []).append(job)
    key = job_order_key if ctx.policy.fair_share.within_tenant == "submit" else longest_first(ctx)
    for q in queues.values():
        q.sort(key=key, reverse=True)  # pop() from the end
    heap = [(ctx.fair.key(t), t) for t in queues]
    heapq.heapify(heap)
    while heap:
        _, tenant = heapq.heappop(heap)
        q = queues[tenant]
        yield q.pop()
        if q:
            heapq.heappush(heap, (ctx.fair.key(tenant), tenant))
