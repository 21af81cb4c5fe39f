"""A team's queue in the order the scheduler serves it, at any depth: the head its last pass ranked
(the team's queue summary, ``berth.domain.queue_summary``), each of those jobs read once (one batch
read), never a walk of the team's jobs. Pure logic over the job, tenant and summary ports.

A job the pass ranked that has since started, ended or been canceled is left out, so positions may
skip; ``as_of`` says which pass the positions are from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from berth.domain.errors import Forbidden, NotFound
from berth.domain.job import Job
from berth.domain.ports import QueueSummaries, TenantRepository
from berth.domain.queue_summary import QueueSummary
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller

#: At most this many jobs per answer (the summary holds ``MAX_PLACES``).
MAX_LIMIT = 100


@dataclass(frozen=True)
class TeamQueue:
    tenant: str
    summary: QueueSummary | None
    """None: no pass has ranked this team's queue yet (or it has never had a waiting job)."""
    jobs: list[Job]
    """Still QUEUED, in the pass's order."""

    @property
    def as_of(self) -> datetime | None:
        return None if self.summary is None else self.summary.as_of

    @property
    def waiting(self) -> int:
        return 0 if self.summary is None else self.summary.waiting


@dataclass(frozen=True)
class TeamQueueService:
    get_many: Callable[[list[str]], dict[str, Job]]
    summaries: QueueSummaries
    tenants: TenantRepository

    def queue(self, caller: Caller, tenant: str, limit: int = 50) -> TeamQueue:
        """The first ``limit`` waiting jobs of ``tenant`` (members: their own team; admins: any)."""
        if not caller.is_admin and caller.tenant != tenant:
            raise Forbidden(f"only admins may read tenant {tenant!r}'s queue")
        if caller.tenant != tenant and not self.tenants.tenant_exists(tenant):
            raise NotFound(f"tenant {tenant!r} not found")
        summary = self.summaries.get(tenant)
        if summary is None:
            return TeamQueue(tenant, None, [])
        ranked = sorted(summary.places.items(), key=lambda item: item[1].position)
        ids = [job_id for job_id, _ in ranked[: max(1, min(limit, MAX_LIMIT))]]
        found = self.get_many(ids) if ids else {}
        jobs = [
            job
            for job in (found.get(job_id) for job_id in ids)
            if job is not None and job.tenant == tenant and job.status == JobStatus.QUEUED
        ]
        return TeamQueue(tenant, summary, jobs)
