"""Vend one job attempt's credentials (called by the agent API at claim and lease renewal, and by
the cloud dispatch for Batch jobs; both land with their issues)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
from berth.domain.storage import DataGrants, Dataset, StorageLayout, dataset_names
from berth.logic.kept_answers import KeptAnswers


@dataclass(frozen=True)
class CredentialService:
    layout: StorageLayout
    scope: AccountScope
    tenants: TenantRepository
    vendor: CredentialVendor
    #: How long a sandbox reuses a team's grants and a dataset's record it read (0: read each time).
    #: A revoked grant stops appearing in new credentials within it; credentials already vended
    #: keep what they were given until they expire (up to an hour), which is the longer delay.
    grants_cache_s: float = 0.0
    _grants: KeptAnswers[str, DataGrants] = field(init=False, repr=False, compare=False)
    _datasets: KeptAnswers[str, Dataset | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_grants", KeptAnswers(self.grants_cache_s))
        object.__setattr__(self, "_datasets", KeptAnswers(self.grants_cache_s))

    def for_attempt(self, job: Job, attempt: int, remaining_lease_s: float) -> JobCredentials:
        if job.status.is_terminal:
            raise Conflict(f"job {job.id} is {job.status}; no credentials for a finished job")
        datasets = {name: self._datasets.get(name, self.tenants.dataset) for name in dataset_names(job.spec)}
        grants = self._grants.get(job.tenant, self.tenants.grants)
        policy = session_policy(job, attempt, self.layout, grants, datasets, self.scope)
        return self.vendor.assume(
            session_name(job, attempt),
            session_policy_json(policy),
            credential_seconds(remaining_lease_s),
            source_identity=job.id.replace(":", "_"),
        )
