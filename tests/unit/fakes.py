"""In-memory fakes of the repository ports, with the same conditional-write semantics."""

from __future__ import annotations

import threading
from collections.abc import Callable

from berth.domain.errors import AlreadySubmitted, Conflict, QuotaExceeded
from berth.domain.idempotency import SubmitClaim
from berth.domain.job import Job, JobEvent
from berth.domain.ports import Member, Page
from berth.domain.status import JobStatus
from berth.domain.tenancy import Quota, Role


class FakeJobs:
    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.history: dict[str, list[JobEvent]] = {}
        self._lock = threading.Lock()
        #: Called inside save() before the version check, to simulate a racing writer.
        self.before_save: Callable[[Job], None] | None = None
        self.claims: dict[str, tuple[str, SubmitClaim]] = {}

    def create(self, job: Job, event: JobEvent, max_active: int, claim: SubmitClaim | None = None) -> None:
        with self._lock:
            if claim is not None and claim.key in self.claims:
                job_id, held = self.claims[claim.key]
                if held.expires_at > job.created_at:
                    raise AlreadySubmitted(job_id, held.fingerprint)
            if job.id in self.jobs:
                raise Conflict("exists")
            if self.count_active(job.tenant) >= max_active:
                raise QuotaExceeded("at max_active")
            self.jobs[job.id] = job
            self.history[job.id] = [event]
            if claim is not None:
                self.claims[claim.key] = (job.id, claim)

    def save(self, job: Job, event: JobEvent) -> None:
        if self.before_save is not None:
            hook, self.before_save = self.before_save, None
            hook(job)
        with self._lock:
            if self.jobs[job.id].version != job.version - 1:
                raise Conflict("version moved")
            self.jobs[job.id] = job
            self.history[job.id].append(event)

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def list_for_tenant(
        self, tenant: str, status: JobStatus | None, limit: int, next_token: str | None
    ) -> Page:
        rows = sorted(
            (j for j in self.jobs.values() if j.tenant == tenant and (status is None or j.status == status)),
            key=lambda j: (j.created_at, j.id),
            reverse=True,
        )
        start = int(next_token or 0)
        page = rows[start : start + limit]
        more = start + limit < len(rows)
        return Page(jobs=page, next_token=str(start + limit) if more else None)

    def events(self, job_id: str) -> list[JobEvent]:
        return list(self.history.get(job_id, []))

    def count_active(self, tenant: str) -> int:
        return sum(1 for j in self.jobs.values() if j.tenant == tenant and j.status.is_active)


class FakeTenants:
    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self.quotas: dict[str, Quota | None] = {}

    def member(self, principal: str) -> Member | None:
        return self.members.get(principal)

    def put_member(self, principal: str, tenant: str, role: str, unique_id: str | None = None) -> None:
        self.members[principal] = Member(principal, tenant, Role(role), unique_id)
        self.quotas.setdefault(tenant, None)

    def quota(self, tenant: str) -> Quota | None:
        return self.quotas.get(tenant)

    def put_quota(self, tenant: str, quota: Quota) -> None:
        self.quotas[tenant] = quota

    def tenant_exists(self, tenant: str) -> bool:
        return tenant in self.quotas
