"""The queue index on DynamoDB (moto): the item attributes that put a job in (and out of) the sparse
indexes, BatchGetItem's unprocessed keys and throttling, and a pass whose hydration fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from berth.dal.jobs import BATCH_GET_ROUNDS, DynamoJobRepository
from berth.domain.errors import StoreUnavailable
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import HostGpus, OnPremPlacement, Site
from berth.domain.queue import QUEUE_SHARDS, entry_document, entry_from_document, queue_entry
from berth.domain.status import JobStatus
from tests.functional.conftest import TABLES
from tests.unit.test_workflow_services import NOW

SPEC = JobSpec.model_validate(
    {
        "name": "r",
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu_type": "A100", "gpus": 2},
        "constraints": {"max_cost_usd": 10, "regions": ["us-east-1"]},
        "data": [{"source": "dataset://imagenet/train", "mount": "/data"}],
        "expected_duration_minutes": 30,
    }
)


@pytest.fixture
def repo(aws: Any) -> DynamoJobRepository:
    return DynamoJobRepository(
        TABLES["BERTH_JOBS_TABLE"],
        TABLES["BERTH_JOB_EVENTS_TABLE"],
        TABLES["BERTH_TENANTS_TABLE"],
        sleep=lambda s: None,
    )


def _create(repo: DynamoJobRepository, n: int, tenant: str = "vision") -> list[Job]:
    out = []
    for i in range(n):
        at = NOW + timedelta(milliseconds=i)
        job, ev = new_job(new_job_id(at), tenant, "alice", SPEC, at)
        repo.create(job, ev, max_active=1000)
        out.append(job)
    return out


def _item(job_id: str) -> dict[str, Any]:
    ddb = boto3.client("dynamodb")
    return ddb.get_item(TableName=TABLES["BERTH_JOBS_TABLE"], Key={"job_id": {"S": job_id}})["Item"]


def test_the_index_attributes_move_with_the_status_in_the_same_write(repo: DynamoJobRepository) -> None:
    [job] = _create(repo, 1)
    item = _item(job.id)
    shard = item["queue_pk"]["S"].rsplit("#", 1)
    assert shard[0] == "vision" and 0 <= int(shard[1]) < QUEUE_SHARDS
    assert (
        item["queue_sk"]["S"] == f"1#{NOW.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}#{job.id}"
    )
    assert "placed_status" not in item
    where = OnPremPlacement(pool="p", gpu_type="A100", hosts=(HostGpus(host_id="h", gpus=2),))
    nxt, ev = job.transition(JobStatus.STARTING, "placed", NOW, site=Site.ONPREM, placement=where)
    repo.save(nxt, ev)
    item = _item(job.id)
    assert {"queue_pk", "queue_sk", "queue_entry"}.isdisjoint(item)
    assert item["placed_status"] == {"S": "STARTING"}


def test_the_entry_is_compact_and_round_trips(repo: DynamoJobRepository) -> None:
    [job] = _create(repo, 1)
    entry = queue_entry(job)
    doc = entry_document(entry)
    assert entry_from_document(job.id, job.tenant, job.version, job.reason, doc) == entry
    stored = _item(job.id)["queue_entry"]["S"]
    # what the core reads, not the spec: no image, command, env or secrets
    assert "busybox" not in stored and len(stored) < 400
    assert repo.queue_head("vision", 1).entries == [entry]


class _Partial:
    """BatchGetItem that leaves keys unprocessed (as DynamoDB does when throttled) ``rounds`` times."""

    def __init__(self, real: Any, rounds: int, table: str) -> None:
        self.real, self.rounds, self.table, self.calls = real, rounds, table, 0

    def __call__(self, keys: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls > self.rounds:
            return dict(self.real(keys, **kwargs))
        served, left = keys[: len(keys) // 2], keys[len(keys) // 2 :]
        data = dict(self.real(served, **kwargs)) if served else {"Responses": {self.table: []}}
        data["UnprocessedKeys"] = {self.table: {"Keys": [{"job_id": {"S": k["job_id"]}} for k in left]}}
        return data


def test_unprocessed_keys_are_asked_for_again_with_a_growing_pause(
    repo: DynamoJobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _create(repo, 150)
    pauses: list[float] = []
    repo._sleep = pauses.append
    conn = repo._Job._get_connection()
    partial = _Partial(conn.batch_get_item, rounds=2, table=TABLES["BERTH_JOBS_TABLE"])
    monkeypatch.setattr(conn, "batch_get_item", partial)
    found = repo.get_many(j.id for j in jobs)
    assert set(found) == {j.id for j in jobs}
    # 100 keys: two partial rounds then the rest; then 50 keys served at once
    assert partial.calls == 4
    assert pauses == [0.05, 0.1]


def test_keys_left_unprocessed_every_round_are_a_store_error(
    repo: DynamoJobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _create(repo, 3)
    conn = repo._Job._get_connection()
    partial = _Partial(conn.batch_get_item, rounds=10**6, table=TABLES["BERTH_JOBS_TABLE"])
    monkeypatch.setattr(conn, "batch_get_item", partial)
    with pytest.raises(StoreUnavailable, match="unprocessed"):
        repo.get_many(j.id for j in jobs)
    assert partial.calls == BATCH_GET_ROUNDS


def _throttled(*args: Any, **kwargs: Any) -> Any:
    from pynamodb.exceptions import GetError

    cause = ClientError(
        {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}}, "BatchGetItem"
    )
    raise GetError("Failed to batch get items", cause)


def test_throttling_past_the_sdk_retries_is_a_store_error(
    repo: DynamoJobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _create(repo, 2)
    monkeypatch.setattr(repo._Job._get_connection(), "batch_get_item", _throttled)
    with pytest.raises(StoreUnavailable):
        repo.get_many(j.id for j in jobs)


def test_a_pass_whose_hydration_fails_places_nothing_and_the_next_one_does(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.dal.documents import DynamoDocumentRepository
    from berth.dal.hosts import DynamoHostRepository
    from berth.dal.placements import DynamoPlacementWriter
    from berth.dal.tenants import DynamoTenantRepository
    from berth.dal.usage import DynamoUsageLedger
    from tests.functional.contracts.conftest import Store
    from tests.functional.contracts.test_scheduler_service import _held, _world

    repo = DynamoJobRepository(
        TABLES["BERTH_JOBS_TABLE"], TABLES["BERTH_JOB_EVENTS_TABLE"], TABLES["BERTH_TENANTS_TABLE"]
    )
    hosts = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    store = Store(
        repo,
        DynamoTenantRepository(TABLES["BERTH_TENANTS_TABLE"]),
        hosts,
        DynamoDocumentRepository(TABLES["BERTH_TENANTS_TABLE"]),
        DynamoUsageLedger(TABLES["BERTH_USAGE_TABLE"]),
        DynamoPlacementWriter(repo, hosts),
    )
    scheduler, _, _ = _world(store, gpus_per_host=4, hosts=1)
    jobs = _create(repo, 2)
    conn = repo._Job._get_connection()
    real = conn.batch_get_item
    monkeypatch.setattr(conn, "batch_get_item", _throttled)
    with pytest.raises(StoreUnavailable):
        scheduler.run_pass()
    assert _held(store) == []  # hydration comes before any hold
    monkeypatch.setattr(conn, "batch_get_item", real)
    assert {j.status for j in repo.get_many(j.id for j in jobs).values()} == {JobStatus.QUEUED}
    report = scheduler.run_pass()
    assert report.placed == 2 and len(_held(store)) == 4
