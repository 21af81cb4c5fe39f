"""DynamoDB host repository: the on-prem fleet, one item per host, every write conditional.

A GPU UUID is either in the host's ``free_gpu_ids`` set or in exactly one attempt's hold. A hold
removes the UUIDs from the free set and records the hold in one update whose condition requires
every UUID to be free and the attempt to hold nothing yet; so two attempts (or two racing passes)
can never both get a GPU, and free GPUs never go negative. ``hold`` sends that update alone;
``add_hold`` adds it to a transaction (the scheduler's placement: ``berth.dal.placements``). Each
method writes its own attributes only (inventory, lease, holds), never the whole item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action
from pynamodb.transactions import TransactWrite

from berth.dal.errors import translated
from berth.dal.models import HostRow, host_model
from berth.domain.agent_wire import CachedDataset
from berth.domain.errors import Conflict, NotFound
from berth.domain.fleet import (
    Admission,
    Containment,
    Hold,
    HoldRequest,
    HostInventory,
    HostRecord,
    admission_for,
)
from berth.domain.gpu_health import CLEARED_KEPT, GpuFault

#: Register retries when a hold or release lands between its read and its conditional write.
REGISTER_RETRIES = 5
#: Retries of a heartbeat, release or drain request whose write was refused while the host still
#: qualifies: DynamoDB refuses a plain write to an item a transaction is writing
#: (``TransactionConflictException``, not retried by the SDK), e.g. a placement's hold.
CONFLICT_RETRIES = 5


def _faults(value: Any) -> dict[str, GpuFault]:
    return {g: GpuFault.model_validate(f) for g, f in (value or {}).items()}


def _faults_json(faults: Mapping[str, GpuFault]) -> dict[str, Any]:
    return {g: f.model_dump(mode="json") for g, f in faults.items()}


def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    return dict(value.as_dict() if hasattr(value, "as_dict") else value)


class DynamoHostRepository:
    def __init__(self, table_name: str) -> None:
        self._Row = host_model(table_name)

    @staticmethod
    def _record(row: HostRow) -> HostRecord:
        holds = {
            k: Hold(
                gpu_ids=tuple(v.get("gpu_ids") or ()),
                cpu=float(v.get("cpu") or 0),
                memory_gib=float(v.get("memory_gib") or 0),
                at=datetime.fromisoformat(v["at"]) if v.get("at") else None,
            )
            for k, v in _as_dict(row.holds).items()
        }
        return HostRecord(
            inventory=HostInventory(
                host_id=row.host_id,
                pool=row.pool or "",
                gpu_type=row.gpu_type or "",
                gpu_ids=tuple(row.gpu_ids or ()),
                cpu=float(row.cpu or 0),
                memory_gib=float(row.memory_gib or 0),
                labels=dict(row.labels or {}),
                containment=cast(Containment | None, row.containment),  # the model validates it
            ),
            healthy=bool(row.healthy) if row.healthy is not None else True,
            lease_expires_at=row.lease_expires_at,
            holds=holds,
            version=int(row.version or 0),
            draining=bool(row.draining),
            drain_requested=bool(row.drain_requested),
            admitted=None
            if row.admitted_gpu_type is None or row.admitted_gpus is None
            else Admission(gpu_type=row.admitted_gpu_type, gpus=int(row.admitted_gpus)),
            cached_datasets=tuple(CachedDataset.model_validate(c) for c in row.cached_datasets or ()),
            gpu_faults=_faults(row.gpu_faults),
            gpu_warnings=_faults(row.gpu_warnings),
            cleared_faults=tuple(row.cleared_faults or ()),
        )

    def get(self, host_id: str) -> HostRecord | None:
        with translated(f"read host {host_id}"):
            try:
                return self._record(self._Row.get(host_id, consistent_read=True))
            except self._Row.DoesNotExist:
                return None

    def list_hosts(self) -> list[HostRecord]:
        with translated("list hosts"):
            rows = list(self._Row.scan(consistent_read=True))
        return sorted((self._record(r) for r in rows), key=lambda h: h.host_id)

    def register(self, inventory: HostInventory, lease_expires_at: datetime) -> HostRecord:
        R = self._Row
        for _ in range(REGISTER_RETRIES):
            current = self.get(inventory.host_id)
            admitted = admission_for(current, inventory)
            held = set() if current is None else current.held_gpu_ids
            missing = held - set(inventory.gpu_ids)
            if missing:
                raise Conflict(
                    f"host {inventory.host_id!r} re-registered without GPUs that running attempts hold: "
                    f"{sorted(missing)}"
                )
            free = {g for g in inventory.gpu_ids if g not in held}
            version = 0 if current is None else current.version
            actions: list[Action] = [
                R.pool.set(inventory.pool),
                R.gpu_type.set(inventory.gpu_type),
                R.gpu_ids.set(list(inventory.gpu_ids)),
                R.cpu.set(inventory.cpu),
                R.memory_gib.set(inventory.memory_gib),
                R.labels.set(dict(inventory.labels)),
                R.containment.set(inventory.containment) if inventory.containment else R.containment.remove(),
                R.healthy.set(True),
                R.draining.set(False),
                R.lease_expires_at.set(lease_expires_at),
                R.free_gpu_ids.set(free) if free else R.free_gpu_ids.remove(),
                R.version.set(version + 1),
                R.admitted_gpu_type.set(admitted.gpu_type),
                R.admitted_gpus.set(admitted.gpus),
            ]
            if current is None:
                actions.append(R.holds.set({}))
                condition: Condition = R.host_id.does_not_exist()
            else:
                condition = R.version == version
            try:
                with translated(f"register host {inventory.host_id}"):
                    R(inventory.host_id).update(actions=actions, condition=condition)
            except Conflict:
                continue
            found = self.get(inventory.host_id)
            assert found is not None
            return found
        raise Conflict(f"host {inventory.host_id!r} kept changing while registering; try again")

    def heartbeat(
        self,
        host_id: str,
        lease_expires_at: datetime,
        healthy: bool = True,
        draining: bool = False,
        cached_datasets: Sequence[CachedDataset] | None = None,
    ) -> None:
        R = self._Row
        actions = [R.lease_expires_at.set(lease_expires_at), R.healthy.set(healthy), R.draining.set(draining)]
        if cached_datasets is not None:
            actions.append(R.cached_datasets.set([c.model_dump(mode="json") for c in cached_datasets]))
        self._update_existing(host_id, f"heartbeat host {host_id}", actions)

    def _update_existing(self, host_id: str, what: str, actions: Sequence[Action]) -> None:
        """Update a registered host; NotFound when it is not, retried while a transaction holds it."""
        R = self._Row
        for _ in range(CONFLICT_RETRIES):
            try:
                with translated(what):
                    R(host_id).update(actions=list(actions), condition=R.host_id.exists())
                return
            except Conflict as exc:
                if self.get(host_id) is None:
                    raise NotFound(f"host {host_id!r} is not registered") from exc
        raise Conflict(f"{what}: the host kept changing; try again")

    def _hold_update(
        self, attempt: str, gpu_ids: tuple[str, ...], cpu: float, memory_gib: float, at: datetime | None
    ) -> tuple[list[Action], Condition]:
        """The actions and condition that move ``gpu_ids`` from the free set into ``attempt``'s hold."""
        return self._holds_update([(attempt, HoldRequest("", gpu_ids, cpu, memory_gib, at))])

    def _holds_update(self, holds: Sequence[tuple[str, HoldRequest]]) -> tuple[list[Action], Condition]:
        """One update of a host that moves each (attempt, request)'s GPUs from the free set into that
        attempt's hold: every GPU free, named once in all, and no attempt holding anything there yet."""
        R = self._Row
        condition: Condition = R.host_id.exists()
        actions: list[Action] = []
        taken: list[str] = []
        for attempt, h in holds:
            gpu_ids = tuple(h.gpu_ids)
            if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
                raise Conflict(f"a hold names each GPU once and at least one ({list(gpu_ids)})")
            condition = condition & R.holds[attempt].does_not_exist()
            hold: dict[str, Any] = {"gpu_ids": list(gpu_ids), "cpu": h.cpu, "memory_gib": h.memory_gib}
            if h.at is not None:
                hold["at"] = h.at.isoformat()
            actions.append(R.holds[attempt].set(hold))
            taken.extend(gpu_ids)
        if len(set(taken)) != len(taken) or len({a for a, _ in holds}) != len(holds):
            raise Conflict(f"holds on one host name each GPU and each attempt once ({taken})")
        for g in taken:
            condition = condition & R.free_gpu_ids.contains(g)
        return [R.free_gpu_ids.delete(set(taken)), *actions, R.version.add(1)], condition

    def hold(
        self,
        host_id: str,
        attempt: str,
        gpu_ids: tuple[str, ...],
        cpu: float,
        memory_gib: float,
        at: datetime | None = None,
    ) -> None:
        actions, condition = self._hold_update(attempt, gpu_ids, cpu, memory_gib, at)
        try:
            with translated(f"hold GPUs on {host_id}"):
                self._Row(host_id).update(actions=actions, condition=condition)
        except Conflict as exc:
            if self.get(host_id) is None:
                raise NotFound(f"host {host_id!r} is not registered") from exc
            raise Conflict(
                f"GPUs {list(gpu_ids)} of host {host_id!r} are not all free, or attempt {attempt!r} "
                "already holds GPUs there"
            ) from exc

    def add_hold(
        self,
        tx: TransactWrite,
        host_id: str,
        attempt: str,
        gpu_ids: tuple[str, ...],
        cpu: float,
        memory_gib: float,
        at: datetime | None = None,
    ) -> None:
        """``hold`` as one item of the transaction ``tx`` (its condition fails the whole transaction)."""
        actions, condition = self._hold_update(attempt, gpu_ids, cpu, memory_gib, at)
        tx.update(self._Row(host_id), actions=actions, condition=condition)

    def add_holds(self, tx: TransactWrite, host_id: str, holds: Sequence[tuple[str, HoldRequest]]) -> None:
        """Several attempts' holds on one host as one item of the transaction ``tx``."""
        actions, condition = self._holds_update(holds)
        tx.update(self._Row(host_id), actions=actions, condition=condition)

    def release(self, host_id: str, attempt: str, gpu_ids: tuple[str, ...] | None = None) -> bool:
        R = self._Row
        if gpu_ids:
            # The placement's GPUs are the hold's (written together, never changed): one UpdateItem,
            # no read. Refused (released meanwhile, or a transaction held the item): as below.
            try:
                with translated(f"release GPUs on {host_id}"):
                    R(host_id).update(
                        actions=[
                            R.free_gpu_ids.add(set(gpu_ids)),
                            R.holds[attempt].remove(),
                            R.version.add(1),
                        ],
                        condition=R.holds[attempt].exists(),
                    )
                return True
            except Conflict:
                pass
        for _ in range(CONFLICT_RETRIES):
            current = self.get(host_id)
            hold = None if current is None else current.holds.get(attempt)
            if hold is None:
                return False  # none, or released concurrently: the GPUs went back once
            actions: list[Action] = [R.holds[attempt].remove(), R.version.add(1)]
            if hold.gpu_ids:
                actions.insert(0, R.free_gpu_ids.add(set(hold.gpu_ids)))
            try:
                with translated(f"release GPUs on {host_id}"):
                    R(host_id).update(actions=actions, condition=R.holds[attempt].exists())
            except Conflict:
                continue  # re-read: released meanwhile, or refused while a transaction held the item
            return True
        return False  # still held: a later pass releases it as an orphan

    def mark_lost(self, host_id: str, expired_before: datetime) -> bool:
        R = self._Row
        try:
            with translated(f"mark host {host_id} lost"):
                R(host_id).update(
                    actions=[R.healthy.set(False), R.version.add(1)],
                    condition=R.host_id.exists()
                    & (R.healthy == True)  # noqa: E712
                    & (R.lease_expires_at < expired_before),
                )
        except Conflict:
            return False
        return True

    def admit(self, host_id: str, admission: Admission) -> None:
        R = self._Row
        actions = [
            R.admitted_gpu_type.set(admission.gpu_type),
            R.admitted_gpus.set(admission.gpus),
            R.version.add(1),
        ]
        self._update_existing(host_id, f"admit host {host_id}", actions)

    def request_drain(self, host_id: str, drain: bool) -> None:
        R = self._Row
        self._update_existing(
            host_id, f"drain host {host_id}", [R.drain_requested.set(drain), R.version.add(1)]
        )

    # -- GPU faults (berth.logic.gpu_faults) ----------------------------------------------------
    def add_gpu_faults(self, host_id: str, faults: Mapping[str, GpuFault]) -> HostRecord:
        R = self._Row
        for _ in range(CONFLICT_RETRIES):
            current = self.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            new = {g: f for g, f in faults.items() if g not in current.gpu_faults}
            if not new:
                return current
            merged = {**current.gpu_faults, **new}
            try:
                with translated(f"record GPU faults of host {host_id}"):
                    R(host_id).update(
                        actions=[R.gpu_faults.set(_faults_json(merged)), R.version.add(1)],
                        condition=R.version == current.version,
                    )
            except Conflict:
                continue  # a hold, release or heartbeat moved the version: read again
            return current.model_copy(update={"gpu_faults": merged, "version": current.version + 1})
        raise Conflict(f"host {host_id!r} kept changing while recording GPU faults; try again")

    def set_gpu_warnings(self, host_id: str, warnings: Mapping[str, GpuFault]) -> None:
        R = self._Row
        action = R.gpu_warnings.set(_faults_json(warnings)) if warnings else R.gpu_warnings.remove()
        self._update_existing(host_id, f"record GPU warnings of host {host_id}", [action])

    def clear_gpu_fault(self, host_id: str, gpu_id: str) -> GpuFault | None:
        R = self._Row
        for _ in range(CONFLICT_RETRIES):
            current = self.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            fault = current.gpu_faults.get(gpu_id)
            if fault is None:
                return None
            rest = {g: f for g, f in current.gpu_faults.items() if g != gpu_id}
            cleared = [*current.cleared_faults, fault.fault_id][-CLEARED_KEPT:]
            try:
                with translated(f"clear a GPU fault of host {host_id}"):
                    R(host_id).update(
                        actions=[
                            R.gpu_faults.set(_faults_json(rest)),
                            R.cleared_faults.set(cleared),
                            R.version.add(1),
                        ],
                        condition=R.version == current.version,
                    )
            except Conflict:
                continue
            return fault
        raise Conflict(f"host {host_id!r} kept changing while clearing a GPU fault; try again")
