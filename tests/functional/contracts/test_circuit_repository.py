"""CircuitRepository contract, run against the in-memory fake and DynamoDB (moto): failures and
successes per (region, instance type or '*'), old failures pruned, successes without a failure since
the last one free, and writers that interleave never lose each other's records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from berth.domain.cloud import CIRCUIT_KEEP_FAILURES, CIRCUIT_KEEP_S
from berth.domain.ports import CircuitEntry, CircuitRepository
from tests.functional.conftest import TABLES
from tests.unit.fakes import FakeCircuits


@pytest.fixture(params=["fake", "dynamodb"])
def circuits(request: pytest.FixtureRequest) -> Iterator[tuple[CircuitRepository, CircuitRepository]]:
    """Two handles on one store (two function instances)."""
    if request.param == "fake":
        fake = FakeCircuits()
        yield fake, fake
        return
    request.getfixturevalue("aws")
    from berth.dal.circuits import DynamoCircuitRepository

    yield (
        DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"]),
        DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"]),
    )


def test_failures_and_successes_are_kept_per_circuit(
    circuits: tuple[CircuitRepository, CircuitRepository],
) -> None:
    repo, _ = circuits
    assert repo.list() == []
    repo.record_success("us-east-1", "*", 10.0)  # nothing to close: no record needed
    assert repo.list() == []
    repo.record_failure("us-east-1", "*", 100.0)
    repo.record_failure("us-east-1", "p4d.24xlarge", 101.0)
    repo.record_failure("us-east-1", "*", 102.0)
    repo.record_success("us-east-1", "*", 103.0)
    assert repo.list() == [
        CircuitEntry("us-east-1", "*", (100.0, 102.0), 103.0),
        CircuitEntry("us-east-1", "p4d.24xlarge", (101.0,), None),
    ]


def test_old_failures_are_pruned_and_the_count_bounded(
    circuits: tuple[CircuitRepository, CircuitRepository],
) -> None:
    repo, _ = circuits
    repo.record_failure("us-west-2", "g5.xlarge", 0.0)
    for i in range(CIRCUIT_KEEP_FAILURES + 5):
        repo.record_failure("us-west-2", "g5.xlarge", CIRCUIT_KEEP_S + 10 + i)
    (entry,) = repo.list()
    assert len(entry.failures) == CIRCUIT_KEEP_FAILURES and min(entry.failures) > CIRCUIT_KEEP_S


def test_interleaved_writers_keep_every_record(circuits: tuple[CircuitRepository, CircuitRepository]) -> None:
    a, b = circuits
    for i in range(5):
        a.record_failure("eu-west-1", "*", float(i))
        b.record_failure("eu-west-1", "g6.xlarge", float(i))
    entries = {(e.region, e.instance_type): e for e in a.list()}
    assert len(entries[("eu-west-1", "*")].failures) == 5
    assert len(entries[("eu-west-1", "g6.xlarge")].failures) == 5


def test_an_admin_reset_forgets_one_circuit_or_a_whole_region(
    circuits: tuple[CircuitRepository, CircuitRepository],
) -> None:
    repo, other = circuits
    for t in (1.0, 2.0, 3.0):
        repo.record_failure("us-east-1", "p5.48xlarge", t)
        repo.record_failure("us-east-1", "*", t)
        repo.record_failure("us-west-2", "p5.48xlarge", t)
    assert other.reset("us-east-1", "p5.48xlarge") == [("us-east-1", "p5.48xlarge")]
    assert {(e.region, e.instance_type) for e in repo.list()} == {
        ("us-east-1", "*"),
        ("us-west-2", "p5.48xlarge"),
    }
    assert other.reset("us-east-1", "p5.48xlarge") == []  # nothing left to reset
    repo.record_failure("us-east-1", "g5.xlarge", 4.0)
    assert other.reset("us-east-1", None) == [("us-east-1", "*"), ("us-east-1", "g5.xlarge")]
    assert [(e.region, e.instance_type) for e in repo.list()] == [("us-west-2", "p5.48xlarge")]
    repo.record_failure("us-east-1", "*", 5.0)  # a reset circuit records failures again
    assert [e.failures for e in repo.list() if e.region == "us-east-1"] == [(5.0,)]
