"""HostRepository contract: registration, leases, and GPUs that are free or held by exactly one attempt."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import Conflict, NotFound
from berth.domain.fleet import Hold, HostInventory, attempt_key
from tests.functional.conftest import Calls
from tests.functional.contracts.conftest import Store

T0 = datetime(2026, 12, 1, tzinfo=UTC)
GPUS = tuple(f"GPU-{i}" for i in range(4))


def _inventory(host_id: str = "h1", gpus: tuple[str, ...] = GPUS, **kw: object) -> HostInventory:
    return HostInventory.model_validate(
        {
            "host_id": host_id,
            "pool": "default",
            "gpu_type": "A100",
            "gpu_ids": gpus,
            "cpu": 64,
            "memory_gib": 512,
            "labels": {"rack": "r1"},
            **kw,
        }
    )


def test_register_round_trip(store: Store) -> None:
    assert store.hosts.get("h1") is None
    rec = store.hosts.register(_inventory(), T0)
    assert rec == store.hosts.get("h1")
    assert rec.inventory == _inventory()
    assert rec.gpus == 4 and rec.free_gpus == 4 and rec.free_gpu_ids == GPUS
    assert rec.healthy and rec.lease_expires_at == T0 and rec.holds == {}
    store.hosts.register(_inventory("h0", gpus=("GPU-x",)), T0)
    assert [h.host_id for h in store.hosts.list_hosts()] == ["h0", "h1"]


def test_heartbeat_moves_only_lease_and_health(store: Store) -> None:
    store.hosts.register(_inventory(), T0)
    store.hosts.hold("h1", "j-1#1", GPUS[:2], 8, 64)
    store.hosts.heartbeat("h1", T0 + timedelta(minutes=1), healthy=False)
    rec = store.hosts.get("h1")
    assert rec is not None
    assert rec.lease_expires_at == T0 + timedelta(minutes=1) and not rec.healthy
    assert rec.holds == {"j-1#1": Hold(gpu_ids=GPUS[:2], cpu=8, memory_gib=64)}
    assert not rec.alive(T0) and rec.free_gpus == 2
    with pytest.raises(NotFound):
        store.hosts.heartbeat("nope", T0)


def test_heartbeat_keeps_what_the_cache_holds(store: Store) -> None:
    from berth.domain.agent_wire import CachedDataset

    store.hosts.register(_inventory(), T0)
    held = (CachedDataset(source="s3://data/vision/ds/", version="v1", size_bytes=123),)
    store.hosts.heartbeat("h1", T0, cached_datasets=held)
    rec = store.hosts.get("h1")
    assert rec is not None and rec.cached_datasets == held
    store.hosts.heartbeat("h1", T0 + timedelta(minutes=1))  # None: left as stored
    rec = store.hosts.get("h1")
    assert (
        rec is not None and rec.cached_datasets == held and rec.lease_expires_at == T0 + timedelta(minutes=1)
    )
    store.hosts.heartbeat("h1", T0, cached_datasets=())
    rec = store.hosts.get("h1")
    assert rec is not None and rec.cached_datasets == ()


def test_release_with_the_placements_gpus(store: Store) -> None:
    """``release`` given the GPUs the placement holds (issue 18: no read of the host first): the same
    effect and answers as without them, released once."""
    store.hosts.register(_inventory(), T0)
    a, b = attempt_key("j-a", 1), attempt_key("j-b", 1)
    store.hosts.hold("h1", a, GPUS[:2], 8, 64)
    store.hosts.hold("h1", b, GPUS[2:], 8, 64)
    assert store.hosts.release("h1", a, GPUS[:2]) is True
    assert store.hosts.release("h1", a, GPUS[:2]) is False  # released once
    assert store.hosts.release("nope", a, GPUS[:2]) is False
    rec = store.hosts.get("h1")
    assert rec is not None and set(rec.free_gpu_ids) == set(GPUS[:2]) and list(rec.holds) == [b]
    assert rec.free_cpu == 56 and rec.free_memory_gib == 448


def test_release_with_the_placements_gpus_makes_one_call(store: Store, calls: Calls) -> None:
    if not hasattr(store.hosts, "_Row"):
        pytest.skip("only DynamoDB's calls are counted")
    store.hosts.register(_inventory(), T0)
    a = attempt_key("j-a", 1)
    store.hosts.hold("h1", a, GPUS[:2], 8, 64)
    calls.clear()
    assert store.hosts.release("h1", a, GPUS[:2]) is True
    assert calls.operations() == ["UpdateItem"]
    calls.clear()
    assert store.hosts.release("h1", a, GPUS[:2]) is False  # refused, then read: nothing held
    assert calls.operations() == ["UpdateItem", "GetItem"]


def test_hold_and_release(store: Store) -> None:
    store.hosts.register(_inventory(), T0)
    a, b = attempt_key("j-a", 1), attempt_key("j-b", 1)
    store.hosts.hold("h1", a, GPUS[:3], 12, 96)
    rec = store.hosts.get("h1")
    assert rec is not None
    assert rec.free_gpu_ids == GPUS[3:] and rec.free_cpu == 52 and rec.free_memory_gib == 416
    # a GPU already given out, or the same attempt twice, or a GPU the host does not have: refused
    for attempt, gpus in ((b, GPUS[2:4]), (a, GPUS[3:]), (b, ("GPU-9",)), (b, ())):
        with pytest.raises(Conflict):
            store.hosts.hold("h1", attempt, gpus, 0, 0)
    after = store.hosts.get("h1")
    assert after is not None and after.holds == rec.holds and after.free_gpu_ids == GPUS[3:]
    with pytest.raises(NotFound):
        store.hosts.hold("nope", b, GPUS[3:], 0, 0)
    store.hosts.hold("h1", b, GPUS[3:], 0, 0)
    full = store.hosts.get("h1")
    assert full is not None and full.free_gpus == 0 and full.pick_free(1) is None
    assert store.hosts.release("h1", a) is True
    assert store.hosts.release("h1", a) is False  # idempotent: the GPUs went back once
    assert store.hosts.release("nope", a) is False
    rec = store.hosts.get("h1")
    assert rec is not None and set(rec.free_gpu_ids) == set(GPUS[:3]) and list(rec.holds) == [b]


@pytest.fixture
def serializable() -> Iterator[None]:
    """DynamoDB applies each UpdateItem atomically; moto interleaves concurrent ones. The local
    cloud restores that guarantee (``dynamodb_isolation``); so does this test, so that it checks
    the repository's conditions rather than moto's missing lock (without it, moto lets two
    racing holds both pass their condition)."""
    from berth_tools.localcloud import dynamodb_isolation

    undo = dynamodb_isolation.install()
    yield
    undo()


def test_racing_holds_never_give_a_gpu_twice(store: Store, serializable: None) -> None:
    store.hosts.register(_inventory(), T0)
    won: list[str] = []
    barrier = threading.Barrier(8)

    def grab(i: int) -> None:
        barrier.wait()
        try:
            store.hosts.hold("h1", f"j-{i}#1", GPUS[i % 2 * 2 : i % 2 * 2 + 2], 0, 0)
            won.append(f"j-{i}#1")
        except Conflict:
            pass

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec = store.hosts.get("h1")
    assert rec is not None
    assert sorted(rec.holds) == sorted(won) and len(won) == 2
    held = [g for h in rec.holds.values() for g in h.gpu_ids]
    assert sorted(held) == sorted(GPUS) and rec.free_gpus == 0


def test_reregistration_keeps_holds_and_refuses_to_drop_held_gpus(store: Store) -> None:
    store.hosts.register(_inventory(), T0)
    store.hosts.hold("h1", "j-1#1", GPUS[:1], 1, 1)
    rec = store.hosts.register(
        _inventory(gpus=(*GPUS[:3], "GPU-new"), labels={"rack": "r2"}), T0 + timedelta(1)
    )
    assert list(rec.holds) == ["j-1#1"]
    assert rec.free_gpu_ids == (*GPUS[1:3], "GPU-new") and rec.inventory.labels == {"rack": "r2"}
    with pytest.raises(Conflict):
        store.hosts.register(_inventory(gpus=GPUS[1:]), T0)
    kept = store.hosts.get("h1")
    assert kept is not None and kept.inventory.gpu_ids == (*GPUS[:3], "GPU-new")


def test_draining_comes_from_heartbeats_and_a_drain_request_survives_registration(store: Store) -> None:
    store.hosts.register(_inventory(), T0 + timedelta(minutes=1))
    store.hosts.heartbeat("h1", T0 + timedelta(minutes=1), draining=True)
    rec = store.hosts.get("h1")
    assert rec is not None and rec.draining and rec.alive(T0) and not rec.schedulable(T0)
    store.hosts.register(_inventory(), T0 + timedelta(minutes=1))  # a restarted agent is not draining
    rec = store.hosts.get("h1")
    assert rec is not None and not rec.draining and rec.schedulable(T0)
    store.hosts.request_drain("h1", True)
    store.hosts.register(_inventory(), T0 + timedelta(minutes=1))
    store.hosts.heartbeat("h1", T0 + timedelta(minutes=1))
    rec = store.hosts.get("h1")
    assert rec is not None and rec.drain_requested and not rec.draining and not rec.schedulable(T0)
    store.hosts.request_drain("h1", False)
    rec = store.hosts.get("h1")
    assert rec is not None and not rec.drain_requested and rec.schedulable(T0)
    with pytest.raises(NotFound):
        store.hosts.request_drain("nope", True)


def test_the_first_registration_bounds_what_a_host_may_register(store: Store) -> None:
    """Finding 8c: a host's inventory is bounded by what it was admitted with: its first registration
    (at most MAX_HOST_GPUS), or what an admin admitted since. It may shrink (a GPU failed), never grow
    or change type on its own say."""
    from berth.domain.fleet import MAX_HOST_GPUS, Admission, InventoryRefused

    with pytest.raises(InventoryRefused):
        store.hosts.register(_inventory("big", gpus=tuple(f"G-{i}" for i in range(512)), gpu_type="H200"), T0)
    assert store.hosts.get("big") is None
    rec = store.hosts.register(_inventory(), T0)
    assert rec.admitted == Admission(gpu_type="A100", gpus=4)
    shrunk = store.hosts.register(_inventory(gpus=GPUS[:3]), T0)  # one GPU failed
    assert shrunk.gpus == 3 and shrunk.admitted == Admission(gpu_type="A100", gpus=4)
    assert store.hosts.register(_inventory(), T0).gpus == 4  # and came back
    more = (*GPUS, "GPU-4")
    with pytest.raises(InventoryRefused):
        store.hosts.register(_inventory(gpus=more), T0)
    with pytest.raises(InventoryRefused):
        store.hosts.register(_inventory(gpu_type="H200"), T0)
    after = store.hosts.get("h1")
    assert after is not None and after.gpus == 4 and after.inventory.gpu_type == "A100"
    store.hosts.admit("h1", Admission(gpu_type="A100", gpus=5))  # an admin approves the fifth
    assert store.hosts.register(_inventory(gpus=more), T0).gpus == 5
    with pytest.raises(NotFound):
        store.hosts.admit("nope", Admission(gpu_type="A100", gpus=MAX_HOST_GPUS))


def test_gpu_faults_keep_the_first_survive_registration_and_clear(store: Store) -> None:
    """GPU health at run time: a GPU keeps its first fatal fault (neither free nor held), across a
    re-registration and heartbeats, until it is cleared (its id then remembered); warnings replace."""
    from berth.domain.gpu_health import CLEARED_KEPT, GpuFault, GpuFaultKind

    def fault(fault_id: str, xid: int = 79) -> GpuFault:
        return GpuFault(fault_id=fault_id, kind=GpuFaultKind.XID, xid=xid, at=T0)

    store.hosts.register(_inventory(), T0)
    store.hosts.hold("h1", "j-1#1", GPUS[:1], 8, 64)
    rec = store.hosts.add_gpu_faults("h1", {GPUS[0]: fault("a"), GPUS[1]: fault("b")})
    assert rec == store.hosts.get("h1")
    assert rec.faulted_gpu_ids == {GPUS[0], GPUS[1]} and rec.free_gpu_ids == GPUS[2:]
    assert rec.held_gpu_ids == {GPUS[0]}
    rec = store.hosts.add_gpu_faults("h1", {GPUS[1]: fault("c", 48)})
    assert rec.gpu_faults[GPUS[1]].fault_id == "b"  # the first is kept
    store.hosts.register(_inventory(), T0 + timedelta(minutes=1))
    store.hosts.heartbeat("h1", T0 + timedelta(minutes=2))
    hot = GpuFault(fault_id="t", kind=GpuFaultKind.THERMAL_SLOWDOWN, value=91, at=T0)
    store.hosts.set_gpu_warnings("h1", {GPUS[3]: hot})
    rec = store.hosts.get("h1")
    assert (
        rec is not None and set(rec.gpu_faults) == {GPUS[0], GPUS[1]} and rec.gpu_warnings == {GPUS[3]: hot}
    )
    assert store.hosts.clear_gpu_fault("h1", GPUS[1]) == fault("b")
    assert store.hosts.clear_gpu_fault("h1", GPUS[1]) is None
    rec = store.hosts.get("h1")
    assert rec is not None and rec.cleared_faults == ("b",) and rec.free_gpu_ids == GPUS[1:]
    store.hosts.set_gpu_warnings("h1", {})
    for i in range(CLEARED_KEPT + 1):
        store.hosts.add_gpu_faults("h1", {GPUS[2]: fault(f"x{i}")})
        store.hosts.clear_gpu_fault("h1", GPUS[2])
    rec = store.hosts.get("h1")
    assert rec is not None and rec.gpu_warnings == {} and len(rec.cleared_faults) == CLEARED_KEPT
    assert rec.cleared_faults[-1] == f"x{CLEARED_KEPT}" and "b" not in rec.cleared_faults
    for call in (
        lambda: store.hosts.add_gpu_faults("nope", {}),
        lambda: store.hosts.set_gpu_warnings("nope", {}),
        lambda: store.hosts.clear_gpu_fault("nope", GPUS[0]),
    ):
        with pytest.raises(NotFound):
            call()
