"""The idle back-off's view of the jobs table (berth_tools.localcloud.local_activity)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from berth_tools.localcloud.local_activity import jobs_in_flight

ACCOUNT = "123456789012"
REGION = "us-east-1"


@pytest.fixture
def ddb() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION)
        client.create_table(
            TableName="jobs",
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield client


def _put(ddb: Any, job_id: str, **attrs: str) -> None:
    ddb.put_item(TableName="jobs", Item={"job_id": {"S": job_id}, **{k: {"S": v} for k, v in attrs.items()}})


def test_an_empty_table_and_ended_jobs_are_idle(ddb: Any) -> None:
    assert not jobs_in_flight(ACCOUNT, REGION, "jobs")
    _put(ddb, "j-1", status="COMPLETED")
    _put(ddb, "j-2", status="CANCELED")
    assert not jobs_in_flight(ACCOUNT, REGION, "jobs")


def test_array_parents_and_counters_are_not_jobs(ddb: Any) -> None:
    _put(ddb, "j-a", kind="array")
    _put(ddb, "j-a#c0")
    assert not jobs_in_flight(ACCOUNT, REGION, "jobs")
    _put(ddb, "j-a:0", status="QUEUED")
    assert jobs_in_flight(ACCOUNT, REGION, "jobs")


def test_a_missing_table_is_not_idle(ddb: Any) -> None:
    assert jobs_in_flight(ACCOUNT, REGION, "no-such-table")
