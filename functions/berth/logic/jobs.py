"""Job use cases: submit, read, list, cancel, history. Pure logic over repository ports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from berth.domain.errors import (
    AlreadySubmitted,
    Forbidden,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
)
from berth.domain.idempotency import submit_claim
from berth.domain.job import Job, JobEvent, new_job, new_job_id
from berth.domain.job_filter import JobFilter
from berth.domain.job_spec import JobSpec
from berth.domain.ports import JobRepository, Page, TenantRecord, TenantRepository
from berth.domain.status import JobStatus, cancel_target
from berth.domain.tenancy import Caller, Quota
from berth.logic.job_update import Keep, Save, update_job

Clock = Callable[[], datetime]
#: Raises a domain error (Infeasible) when no site could ever run the spec for this tenant
#: (``FleetService.check``); given the tenant's record the submit read (its quota).
FeasibilityCheck = Callable[[JobSpec, str, TenantRecord], None]
#: Raises a domain error (Forbidden, ValidationFailed) when the tenant may not use a bundle, data
#: source or secret the spec names (``StorageService.check_spec``); given the tenant's record the
#: submit read (its grants).
AccessCheck = Callable[[JobSpec, str, TenantRecord], None]

NO_FILTER = JobFilter()
MAX_LIST_LIMIT = 100
#: How long an Idempotency-Key keeps designating its job (the same as Powertools' record by default).
IDEMPOTENCY_TTL = timedelta(hours=24)


@dataclass(frozen=True)
class JobService:
    jobs: JobRepository
    tenants: TenantRepository
    clock: Clock
    feasibility: FeasibilityCheck | None = None
    access: AccessCheck | None = None
    idempotency_ttl: timedelta = IDEMPOTENCY_TTL
    #: Called with each newly stored job (starts its workflow execution).
    on_submitted: Callable[[Job], None] | None = None
    #: Called with (before, after) of each cancel that moved a job.
    on_canceled: Callable[[Job, Job], None] | None = None

    def submit(self, caller: Caller, spec: JobSpec, idempotency_key: str | None = None) -> Job:
        """Create a job. With an ``idempotency_key`` the key is claimed in the job's own transaction:
        a retry after a commit whose answer was lost returns that job (another spec: 409)."""
        if spec.array_task is not None:
            raise InvalidRequest("array_task is set by Berth on an array's tasks; submit an 'array' instead")
        # One read of the tenant's record serves the quota, the access and the feasibility checks.
        # The quota's limit is enforced by the create's condition, atomically with the write.
        record = self.tenants.record(caller.tenant)
        quota = record.quota or Quota()
        if self.access is not None:
            self.access(spec, caller.tenant, record)
        if self.feasibility is not None:
            self.feasibility(spec, caller.tenant, record)
        now = self.clock()
        actor = caller.actor or None
        job, event = new_job(new_job_id(now), caller.tenant, caller.principal, spec, now, actor)
        claim = (
            None
            if idempotency_key is None
            else submit_claim(caller.tenant, idempotency_key, spec, now + self.idempotency_ttl)
        )
        try:
            # The store enforces the limit atomically with the write, so racing submits cannot pass it.
            self.jobs.create(job, event, max_active=quota.max_active_jobs, claim=claim)
        except AlreadySubmitted as exc:
            if claim is None or exc.fingerprint != claim.fingerprint:
                raise IdempotencyMismatch(
                    "this Idempotency-Key was already used with a different job spec; use a new key"
                ) from exc
            return self.get(caller, exc.job_id)
        except QuotaExceeded as exc:
            raise QuotaExceeded(
                f"tenant {caller.tenant!r} already has {quota.max_active_jobs} active jobs "
                f"(quota max_active_jobs={quota.max_active_jobs}); wait for some to finish or cancel them",
                details={"max_active_jobs": quota.max_active_jobs},
            ) from exc
        if self.on_submitted is not None:
            self.on_submitted(job)
        return job

    def get(self, caller: Caller, job_id: str) -> Job:
        """Members reach their own tenant's jobs; platform admins (operators) reach any job."""
        job = self.jobs.get(job_id)
        # Another tenant's job is indistinguishable from a missing one.
        if job is None or (job.tenant != caller.tenant and not caller.is_admin):
            raise NotFound(f"job {job_id!r} not found")
        return job

    def list_jobs(
        self,
        caller: Caller,
        status: JobStatus | None,
        limit: int,
        next_token: str | None,
        tenant: str | None = None,
        filters: JobFilter = NO_FILTER,
        all_tenants: bool = False,
    ) -> Page:
        """The caller's tenant's jobs; an admin may name any tenant, or list every tenant's (operators
        find and stop jobs). ``filters`` as ``domain/job_filter.py`` says: ``since`` in the query,
        ``name`` and ``site`` on the page read (a page may then hold fewer than ``limit``)."""
        limit = min(limit, MAX_LIST_LIMIT)
        if all_tenants:
            if tenant is not None:
                raise InvalidRequest("all_tenants cannot be combined with tenant")
            if not caller.is_admin:
                raise Forbidden(f"only admins may list every tenant's jobs (you are in {caller.tenant!r})")
            page = self.jobs.list_all_tenants(status, limit, next_token, since=filters.since)
        else:
            tenant = caller.tenant if tenant is None else tenant
            if tenant != caller.tenant and not caller.is_admin:
                raise Forbidden(f"only admins may list another tenant's jobs (you are in {caller.tenant!r})")
            page = self.jobs.list_for_tenant(tenant, status, limit, next_token, since=filters.since)
        if not filters.filters_page:
            return page
        return Page(jobs=[j for j in page.jobs if filters.matches(j)], next_token=page.next_token)

    def events(self, caller: Caller, job_id: str) -> list[JobEvent]:
        self.get(caller, job_id)
        return self.jobs.events(job_id)

    def cancel(self, caller: Caller, job_id: str, reason: str | None = None) -> Job:
        """Cancel a job; safe to repeat (a job already canceling or canceled is returned as is).

        Lost races (another writer moved the job) are retried against the fresh record.
        """

        def cancel(job: Job) -> Save | Keep:
            if job.tenant != caller.tenant and not caller.is_admin:
                raise NotFound(f"job {job_id!r} not found")  # as get(): another tenant's is missing
            if job.status in (JobStatus.CANCELING, JobStatus.CANCELED):
                return Keep()
            target = cancel_target(job.status)
            if reason is not None:  # a bulk cancel of an array's tasks names its own
                text = (
                    reason
                    if target is JobStatus.CANCELED
                    else f"{reason}; waiting for the executor to stop it"
                )
            elif target is JobStatus.CANCELED:
                text = f"canceled by {caller.name}"
            else:
                text = f"cancel requested by {caller.name}; waiting for the executor to stop it"
            nxt, event = job.transition(target, text, self.clock())
            return Save(nxt, event)

        done = update_job(self.jobs, job_id, cancel, doing="canceling")
        if done.written and self.on_canceled is not None:
            self.on_canceled(done.before, done.after)
        return done.after
