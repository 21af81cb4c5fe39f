"""DynamoDB refuses a plain write to an item that a transaction is writing (``TransactionConflict``
Exception, which the SDK does not retry). A placement's transaction holds host items, so a heartbeat,
a release or a drain request landing meanwhile must be retried, never taken for "not registered" or
"already released". moto never raises it: it is injected here, once per write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError
from pynamodb.exceptions import UpdateError

from berth.domain.errors import NotFound
from berth.domain.fleet import HostInventory
from tests.functional.conftest import TABLES

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _conflict() -> UpdateError:
    cause = ClientError(
        {"Error": {"Code": "TransactionConflictException", "Message": "ongoing transaction"}}, "UpdateItem"
    )
    return UpdateError("update", cause=cause)


@pytest.fixture
def hosts(aws: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    from berth.dal.hosts import DynamoHostRepository
    from berth.dal.models import host_model

    repo = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    repo.register(
        HostInventory(host_id="h1", pool="p", gpu_type="A100", gpu_ids=("G0", "G1"), cpu=8, memory_gib=64),
        T0,
    )
    repo.hold("h1", "j-1#1", ("G0",), 1, 1)
    Row = host_model(TABLES["BERTH_HOSTS_TABLE"])
    real = Row.update
    refused: list[int] = []

    def update_refused_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(1)
            raise _conflict()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Row, "update", update_refused_once)
    repo.refused = refused
    return repo


def test_a_heartbeat_refused_by_a_transaction_is_retried(hosts: Any) -> None:
    hosts.heartbeat("h1", T0 + timedelta(minutes=5))
    assert hosts.refused == [1]
    assert hosts.get("h1").lease_expires_at == T0 + timedelta(minutes=5)


def test_a_release_refused_by_a_transaction_is_retried(hosts: Any) -> None:
    assert hosts.release("h1", "j-1#1") is True
    assert hosts.refused == [1] and hosts.get("h1").free_gpu_ids == ("G0", "G1")


def test_a_drain_request_refused_by_a_transaction_is_retried(hosts: Any) -> None:
    hosts.request_drain("h1", True)
    assert hosts.refused == [1] and hosts.get("h1").drain_requested
    with pytest.raises(NotFound):
        hosts.request_drain("nope", True)
