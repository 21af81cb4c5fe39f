"""What one ``POST /v1/jobs`` asks of AWS, call by call (docs/operations.md, "Per route"), and that the
guarantees the fewer calls rest on still hold: quotas under concurrent submits, replays, isolation.

Every AWS call the API Lambda makes goes through botocore's ``BaseClient._make_api_call`` (pynamodb's
and Powertools' clients alike); the ``calls`` fixture records each one's operation and item key.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from tests.functional.conftest import TABLES, Calls, Invoke, arn, cold_start

ALICE = arn("alice")


@pytest.fixture
def warm_fleet(api: Invoke, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    """The steady state, whatever the machine's load: the feasibility check's fleet cached for the
    whole test (by default 5 s per sandbox, which a loaded test machine may outlast)."""
    monkeypatch.setenv("BERTH_FEASIBILITY_CACHE_S", "3600")
    cold_start()
    return api


def _stored_jobs() -> int:
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    return int(ddb.scan(TableName=TABLES["BERTH_JOBS_TABLE"], Select="COUNT")["Count"])


def test_keyed_submit_makes_five_calls(warm_fleet: Invoke, spec: dict[str, Any], calls: Calls) -> None:
    """Steady state (the feasibility check's fleet cached, the member's identity kept from the first
    request, ``BERTH_IDENTITY_CACHE_S``): the rate counter, Powertools' in-progress record, the
    tenant's item (once, for quota, grants and feasibility), the job's transaction and Powertools'
    completed record. No read of the member's item, nor of the job just created."""
    assert warm_fleet("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": "warm"})[0] == 201
    calls.clear()
    status, job = warm_fleet("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": "second"})
    assert status == 201 and job["status"] == "QUEUED" and job["tenant"] == "vision"
    assert calls.ops() == {"GetItem": 1, "UpdateItem": 2, "PutItem": 1, "TransactWriteItems": 1}
    assert calls.keys("GetItem") == ["TENANT#vision"]
    # the answer is the stored job (and, as a fact of the submit only, which defaults it got)
    stored = warm_fleet("GET", f"/v1/jobs/{job['id']}")[1]
    assert stored == {k: v for k, v in job.items() if k != "defaults_applied"}


def test_unkeyed_submit_makes_three_calls(warm_fleet: Invoke, spec: dict[str, Any], calls: Calls) -> None:
    assert warm_fleet("POST", "/v1/jobs", body=spec)[0] == 201
    calls.clear()
    assert warm_fleet("POST", "/v1/jobs", body=spec)[0] == 201
    assert calls.ops() == {"GetItem": 1, "UpdateItem": 1, "TransactWriteItems": 1}
    assert calls.keys("GetItem") == ["TENANT#vision"]


def test_the_first_request_of_a_sandbox_reads_the_members_item(
    api: Invoke, spec: dict[str, Any], calls: Calls
) -> None:
    cold_start()
    calls.clear()
    assert api("GET", "/v1/jobs")[0] == 200
    assert f"PRINCIPAL#{ALICE}" in calls.keys("GetItem")


def test_cold_feasibility_cache_reads_no_circuits(api: Invoke, spec: dict[str, Any], calls: Calls) -> None:
    """When the check's fleet is not cached: the policy, the offers and the hosts, not the circuits
    (an open circuit never makes a job infeasible)."""
    cold_start()
    calls.clear()
    assert api("POST", "/v1/jobs", body=spec)[0] == 201
    assert calls.ops() == {"GetItem": 4, "UpdateItem": 1, "TransactWriteItems": 1, "Scan": 1}
    assert sorted(calls.keys("GetItem")) == sorted(
        [f"PRINCIPAL#{ALICE}", "TENANT#vision", "DOC#policy#HEAD", "DOC#offers#HEAD"]
    )


def test_replay_returns_the_same_job_as_it_is_now(api: Invoke, spec: dict[str, Any], calls: Calls) -> None:
    """A replay is answered from Powertools' record and reads the job afresh: the same job, in its
    current state, and nothing written."""
    headers = {"Idempotency-Key": "replayed"}
    status, first = api("POST", "/v1/jobs", body=spec, headers=headers)
    assert status == 201
    assert api("POST", f"/v1/jobs/{first['id']}/cancel")[0] == 202
    calls.clear()
    status, again = api("POST", "/v1/jobs", body=spec, headers=headers)
    assert status == 201 and again["id"] == first["id"] and again["status"] == "CANCELED"
    assert "TransactWriteItems" not in calls.ops() and "PutItem" in calls.ops()  # Powertools' check
    assert _stored_jobs() == 1
    # Another body under the same key is refused; another tenant's same key is its own job.
    assert api("POST", "/v1/jobs", body={**spec, "name": "other"}, headers=headers)[0] == 409
    status, bobs = api("POST", "/v1/jobs", body=spec, headers=headers, user="bob")
    assert status == 201 and bobs["id"] != first["id"] and bobs["tenant"] == "nlp"


def test_keyed_array_answer_is_the_stored_array(api: Invoke, spec: dict[str, Any], calls: Calls) -> None:
    from berth.handlers import runtime, services

    for f in (services.arrays, runtime.array_repository, runtime.job_repository):
        f.cache_clear()  # type: ignore[attr-defined]
    body = {**spec, "name": "sweep", "array": {"size": 3}}
    calls.clear()
    status, array = api("POST", "/v1/jobs", body=body, headers={"Idempotency-Key": "sweep"})
    assert status == 201 and array["array"]["size"] == 3
    assert calls.keys("GetItem").count("TENANT#vision") == 1
    assert not [k for k in calls.keys("GetItem") if k.startswith("j-")]  # the array is not read back
    assert api("GET", f"/v1/jobs/{array['id']}")[1] == {
        k: v for k, v in array.items() if k != "defaults_applied"
    }
    status, again = api("POST", "/v1/jobs", body=body, headers={"Idempotency-Key": "sweep"})
    assert status == 201 and again == array


def test_quota_of_the_one_tenant_read_holds_under_concurrent_submits(seeded: None) -> None:
    """The submit reads its tenant's quota once; the create's condition on the counter still admits
    exactly ``max_active_jobs`` of racing submits (keyed and not), and stores nothing for the rest."""
    from berth.dal.jobs import DynamoJobRepository
    from berth.dal.tenants import DynamoTenantRepository
    from berth.domain.errors import QuotaExceeded
    from berth.domain.job_spec import JobSpec
    from berth.domain.tenancy import Caller, Quota, Role
    from berth.logic.jobs import JobService
    from berth_tools.localcloud import dynamodb_isolation

    undo = dynamodb_isolation.install()  # DynamoDB's transaction isolation, which moto lacks
    try:
        tenants = DynamoTenantRepository(TABLES["BERTH_TENANTS_TABLE"])
        tenants.put_quota("vision", Quota(max_active_jobs=3))
        repo = DynamoJobRepository(
            TABLES["BERTH_JOBS_TABLE"],
            TABLES["BERTH_JOB_EVENTS_TABLE"],
            TABLES["BERTH_TENANTS_TABLE"],
            TABLES["BERTH_IDEMPOTENCY_TABLE"],
        )
        svc = JobService(repo, tenants, clock=lambda: datetime.now(UTC))
        caller = Caller(ALICE, "vision", Role.MEMBER)
        spec = JobSpec.model_validate({"name": "r", "image": "busybox", "command": ["true"]})
        ok: list[str] = []
        refused: list[int] = []
        barrier = threading.Barrier(8)

        def submit(i: int) -> None:
            barrier.wait()
            try:
                ok.append(svc.submit(caller, spec, f"k{i}" if i % 2 else None).id)
            except QuotaExceeded:
                refused.append(i)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ok) == 3 and len(refused) == 5
        assert repo.count_active("vision") == 3 and _stored_jobs() == 3

        # Racing retries of one key (past Powertools' record, e.g. after it expired): one job.
        tenants.put_quota("vision", Quota(max_active_jobs=100))
        same: list[str] = []
        barrier = threading.Barrier(6)

        def retry() -> None:
            barrier.wait()
            same.append(svc.submit(caller, spec, "one-key").id)

        threads = [threading.Thread(target=retry) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(same) == 6 and len(set(same)) == 1
        assert repo.count_active("vision") == 4 and _stored_jobs() == 4
    finally:
        undo()
