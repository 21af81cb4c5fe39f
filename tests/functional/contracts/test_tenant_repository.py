"""TenantRepository contract: membership, tenants, and quotas that never disturb the job counter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import QuotaExceeded
from berth.domain.job import new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.ports import Member
from berth.domain.tenancy import Quota, Role
from tests.functional.contracts.conftest import Store

T0 = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = JobSpec.model_validate({"name": "r", "image": "busybox", "command": ["true"]})
ALICE = "arn:aws:iam::123456789012:user/alice"


def _submit(store: Store, tenant: str, i: int, max_active: int) -> str:
    now = T0 + timedelta(seconds=i)
    job, ev = new_job(new_job_id(now), tenant, ALICE, SPEC, now)
    store.jobs.create(job, ev, max_active=max_active)
    return job.id


def test_unknown_principal_and_tenant(store: Store) -> None:
    assert store.tenants.member(ALICE) is None
    assert not store.tenants.tenant_exists("vision")
    assert store.tenants.quota("vision") is None


def test_member_round_trip_creates_the_tenant(store: Store) -> None:
    store.tenants.put_member(ALICE, "vision", "member")
    assert store.tenants.member(ALICE) == Member(ALICE, "vision", Role.MEMBER)
    assert store.tenants.tenant_exists("vision")
    assert store.tenants.quota("vision") is None


def test_quota_round_trip_and_adding_members_keeps_it(store: Store) -> None:
    store.tenants.put_member(ALICE, "vision", "member")
    quota = Quota(max_active_jobs=3, weight=2.0, monthly_cloud_budget_usd=500.0)
    store.tenants.put_quota("vision", quota)
    store.tenants.put_member("arn:aws:iam::123456789012:user/carol", "vision", "admin")
    assert store.tenants.quota("vision") == quota


def test_quota_update_keeps_the_active_job_counter(store: Store) -> None:
    """The bug of issue 6: an admin's quota PUT replaced the tenant record and dropped the counter."""
    store.tenants.put_member(ALICE, "vision", "member")
    store.tenants.put_quota("vision", Quota(max_active_jobs=3))
    _submit(store, "vision", 0, 3)
    _submit(store, "vision", 1, 3)
    store.tenants.put_quota("vision", Quota(max_active_jobs=3))
    assert store.jobs.count_active("vision") == 2
    _submit(store, "vision", 2, 3)
    with pytest.raises(QuotaExceeded):
        _submit(store, "vision", 3, 3)
    assert store.jobs.count_active("vision") == 3


def test_quota_may_be_set_before_any_job_and_counter_starts_at_zero(store: Store) -> None:
    store.tenants.put_member(ALICE, "vision", "member")
    store.tenants.put_quota("vision", Quota(max_active_jobs=1))
    assert store.jobs.count_active("vision") == 0
    _submit(store, "vision", 0, 1)
    assert store.jobs.count_active("vision") == 1


def test_record_is_the_quota_and_grants_in_one(store: Store) -> None:
    from berth.domain.ports import TenantRecord
    from berth.domain.storage import DataGrants

    assert store.tenants.record("vision") == TenantRecord()
    store.tenants.put_member(ALICE, "vision", "member")
    assert store.tenants.record("vision") == TenantRecord()
    quota = Quota(max_active_jobs=3)
    grants = DataGrants(s3_prefixes=["s3://berth-data/shared/"])
    store.tenants.put_quota("vision", quota)
    store.tenants.put_grants("vision", grants)
    record = store.tenants.record("vision")
    assert record == TenantRecord(quota=quota, grants=grants)
    assert (store.tenants.quota("vision"), store.tenants.grants("vision")) == (record.quota, record.grants)
