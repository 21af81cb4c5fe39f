"""The circuits item on DynamoDB (moto): a success reads the item only where it may have something
to clear. A success on a circuit this function instance saw clean within ``CLEAN_MEMO_S`` reads
nothing; a failure through the same instance always reads and writes, so its success after it
closes it; a failure another instance recorded meanwhile is closed by the first success once the
memo has lapsed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.functional.conftest import TABLES


@pytest.fixture
def reads(aws: None, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from berth.dal import circuits as module

    clock = {"now": 1000.0, "reads": 0}
    monkeypatch.setattr(module.time, "monotonic", lambda: clock["now"])
    original = module.DynamoCircuitRepository._read

    def counted(self: Any) -> Any:
        clock["reads"] += 1
        return original(self)

    monkeypatch.setattr(module.DynamoCircuitRepository, "_read", counted)
    return clock


def test_successes_on_a_clean_circuit_read_once_per_window(reads: dict[str, Any]) -> None:
    from berth.dal.circuits import CLEAN_MEMO_S, DynamoCircuitRepository

    repo = DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"])
    for i in range(20):
        repo.record_success("us-east-1", "g5.xlarge", 100.0 + i)
    assert reads["reads"] == 1 and repo.list() == []
    reads["now"] += CLEAN_MEMO_S + 0.1
    repo.record_success("us-east-1", "g5.xlarge", 200.0)
    assert reads["reads"] == 3  # the memo lapsed: read again (and list() read once)


def test_a_failure_is_always_closed_by_the_next_success_of_the_same_instance(reads: dict[str, Any]) -> None:
    from berth.dal.circuits import DynamoCircuitRepository

    repo = DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"])
    repo.record_success("us-east-1", "*", 10.0)
    repo.record_failure("us-east-1", "*", 11.0)
    repo.record_success("us-east-1", "*", 12.0)
    (entry,) = repo.list()
    assert entry.failures == (11.0,) and entry.last_success_at == 12.0


def test_another_instances_failure_is_closed_once_the_memo_lapses(reads: dict[str, Any]) -> None:
    from berth.dal.circuits import CLEAN_MEMO_S, DynamoCircuitRepository

    events = DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"])
    submit = DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"])
    events.record_success("us-west-2", "p4d.24xlarge", 10.0)
    submit.record_failure("us-west-2", "p4d.24xlarge", 11.0)
    events.record_success("us-west-2", "p4d.24xlarge", 12.0)  # within the memo: not seen yet
    assert events.list()[0].last_success_at is None
    reads["now"] += CLEAN_MEMO_S
    events.record_success("us-west-2", "p4d.24xlarge", 13.0)
    assert events.list()[0].last_success_at == 13.0
