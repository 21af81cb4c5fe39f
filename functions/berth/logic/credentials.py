"""Vend one job attempt's credentials (called by the agent API at claim and lease renewal, and by
the cloud dispatch for Batch jobs; both land with their issues)."""

from __future__ import annotations

from dataclasses import dataclass

from berth.domain.errors import Conflict
from berth.domain.job import Job
from berth.domain.job_access import (
    AccountScope,
    credential_seconds,
    session_name,
    session_policy,
    session_policy_json,
)
from berth.domain.ports import CredentialVendor, JobCredentials, TenantRepository
from berth.domain.storage import StorageLayout, dataset_names


@dataclass(frozen=True)
class CredentialService:
    layout: StorageLayout
    scope: AccountScope
    tenants: TenantRepository
    vendor: CredentialVendor

    def for_attempt(self, job: Job, attempt: int, remaining_lease_s: float) -> JobCredentials:
        if job.status.is_terminal:
            raise Conflict(f"job {job.id} is {job.status}; no credentials for a finished job")
        datasets = {name: self.tenants.dataset(name) for name in dataset_names(job.spec)}
        policy = session_policy(
            job, attempt, self.layout, self.tenants.grants(job.tenant), datasets, self.scope
        )
        return self.vendor.assume(
            session_name(job, attempt),
            session_policy_json(policy),
            credential_seconds(remaining_lease_s),
            source_identity=job.id.replace(":", "_"),
        )
