"""A host's containment mode (what its agent says at registration) is stored and read back."""

from __future__ import annotations

from datetime import UTC, datetime

from berth.domain.fleet import HostInventory
from tests.functional.conftest import TABLES

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_containment_is_stored_replaced_and_dropped(aws: None) -> None:
    from berth.dal.hosts import DynamoHostRepository

    repo = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    inv = HostInventory(host_id="h1", pool="p", gpu_type="A100", gpu_ids=("G0",), cpu=8, memory_gib=64)
    repo.register(inv.model_copy(update={"containment": "process-group"}), T0)
    assert (rec := repo.get("h1")) is not None and rec.inventory.containment == "process-group"
    repo.register(inv.model_copy(update={"containment": "cgroup-v2"}), T0)
    assert (rec := repo.get("h1")) is not None and rec.inventory.containment == "cgroup-v2"
    repo.register(inv, T0)  # an older agent that does not say
    assert (rec := repo.get("h1")) is not None and rec.inventory.containment is None
