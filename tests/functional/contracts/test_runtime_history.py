"""RuntimeHistory contract, run against the in-memory fake and DynamoDB (moto): documents per tenant,
read for several tenants at once, and a writer that loses a race applies its change again on what
the other wrote (no observation lost)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from berth.domain.ports import RuntimeHistory
from berth.logic.runtimes import RunObservation, observed, predictor_for
from tests.functional.conftest import TABLES
from tests.unit.fakes import FakeRuntimeHistory


@pytest.fixture(params=["fake", "dynamodb"])
def histories(request: pytest.FixtureRequest) -> Iterator[tuple[RuntimeHistory, RuntimeHistory]]:
    """Two handles on one store (two function instances)."""
    if request.param == "fake":
        fake = FakeRuntimeHistory()
        yield fake, fake
        return
    request.getfixturevalue("aws")
    from berth.dal.runtimes import DynamoRuntimeHistory

    table = TABLES["BERTH_TENANTS_TABLE"]
    yield DynamoRuntimeHistory(table), DynamoRuntimeHistory(table)


def run(tenant: str, actual_s: float, family: str = "resnet") -> RunObservation:
    return RunObservation(tenant, family, "A100", 1, actual_s, None)


def test_documents_are_kept_per_tenant_and_read_together(
    histories: tuple[RuntimeHistory, RuntimeHistory],
) -> None:
    repo, _ = histories
    assert repo.read(["vision", "nlp"]) == {}
    assert repo.read([]) == {}
    for s in (100.0, 120.0, 140.0):
        repo.update("vision", lambda doc, s=s: observed(doc, run("vision", s)))
    repo.update("nlp", lambda doc: observed(doc, run("nlp", 3600.0, "bert")))
    docs = repo.read(["vision", "nlp", "platform"])
    assert set(docs) == {"vision", "nlp"}
    assert docs["vision"]["observed"] == 3 and docs["nlp"]["observed"] == 1
    predictor = predictor_for(repo, ["vision", "nlp"])
    vision = predictor.predict("vision", "resnet", "A100", 1, None, None)
    nlp = predictor.predict("nlp", "bert", "A100", 1, None, None)
    assert vision is not None and nlp is not None
    assert 100.0 <= vision.quantile(0.5) <= 140.0
    assert nlp.quantile(0.5) == pytest.approx(3600.0)


def test_a_writer_that_loses_the_race_applies_its_change_again(
    histories: tuple[RuntimeHistory, RuntimeHistory],
) -> None:
    a, b = histories
    a.update("vision", lambda doc: observed(doc, run("vision", 60.0)))
    calls = []

    def racing(doc: dict[str, Any] | None) -> dict[str, Any]:
        # The other function instance completes a job between this one's read and its write.
        calls.append(doc)
        if len(calls) == 1:
            b.update("vision", lambda d: observed(d, run("vision", 70.0)))
        return observed(doc, run("vision", 80.0))

    a.update("vision", racing)
    assert len(calls) == 2
    assert a.read(["vision"])["vision"]["observed"] == 3
