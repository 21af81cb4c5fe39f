"""DocumentRepository contract: versions written only against the version read, every one kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from berth.domain.errors import Conflict
from tests.functional.contracts.conftest import Store

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_versions_are_kept_and_readable(store: Store) -> None:
    docs = store.documents
    assert docs.current("policy") is None and docs.version("policy", 1) is None
    v1 = docs.put("policy", {"name": "a"}, 0, T0, "admin")
    v2 = docs.put("policy", {"name": "b", "burst": None}, 1, T0, "carol")
    assert (v1.version, v2.version) == (1, 2)
    assert docs.current("policy") == v2
    assert docs.version("policy", 1) == v1 and docs.version("policy", 2) == v2
    assert docs.version("policy", 3) is None and docs.version("policy", 0) is None
    assert v2.updated_by == "carol" and v2.updated_at == T0
    assert docs.current("offers") is None  # kinds are separate


def test_a_stale_writer_loses_and_changes_nothing(store: Store) -> None:
    docs = store.documents
    docs.put("policy", {"name": "a"}, 0, T0, "admin")
    for stale in (0, 2):
        with pytest.raises(Conflict):
            docs.put("policy", {"name": "x"}, stale, T0, "admin")
    current = docs.current("policy")
    assert current is not None and current.version == 1 and current.document == {"name": "a"}
    assert docs.version("policy", 2) is None
