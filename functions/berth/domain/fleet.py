"""The on-prem fleet as the control plane stores it, and the organisation's stored documents. Pure.

A host item holds its inventory (pool, GPU model, device UUIDs, CPU, memory, labels), its health
and lease, and the GPUs each running attempt holds. Free GPUs are the UUIDs no attempt holds; the
store moves a UUID between "free" and an attempt's hold in one conditional write, so free GPUs
never go negative and no GPU is given to two attempts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from berth.domain.agent_wire import CachedDataset
from berth.domain.errors import Forbidden
from berth.domain.gpu_health import GpuFault, Severity

#: Host ids name the host's work queue (``berth-host-<host id>``) and its IAM tag, so they use only
#: what an SQS queue name allows.
HOST_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
POOL_RE = r"^[a-z0-9][a-z0-9._-]{0,63}$"
#: An agent's containment mode (berth_agent.containment.Mode).
Containment = Literal["cgroup-v2", "process-group", "container", "kubernetes"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def attempt_key(job_id: str, attempt: int) -> str:
    """The key of one attempt's hold on a host."""
    return f"{job_id}#{attempt}"


@dataclass(frozen=True, slots=True)
class HoldRelease:
    """One host's hold of an ended attempt, given back in the same transaction as the job's own write
    (``JobRepository.save``): the GPUs return to the host's free set and the hold goes, if the hold
    is still there (one already released is left as it is)."""

    host_id: str
    attempt: str  # attempt_key(job_id, attempt)
    gpu_ids: tuple[str, ...]


class Hold(_Frozen):
    """What one running attempt holds on a host: GPUs by UUID, CPU and memory."""

    gpu_ids: tuple[str, ...] = ()
    cpu: Annotated[float, Field(ge=0)] = 0.0
    memory_gib: Annotated[float, Field(ge=0)] = 0.0
    at: datetime | None = None
    """When the hold was taken (a hold no job claims after a grace period is an orphan)."""


@dataclass(frozen=True, slots=True)
class HoldRequest:
    """The GPUs (by UUID), CPU and memory one attempt is to hold on one host (a placement's part)."""

    host_id: str
    gpu_ids: tuple[str, ...]
    cpu: float
    memory_gib: float
    at: datetime | None = None


#: DynamoDB's limit of items in one transaction, and the placement's items besides its holds (the job
#: and its event): a placement holds GPUs on at most 98 hosts (a job spans at most ``MAX_NODES``).
MAX_TRANSACTION_ITEMS = 100
PLACEMENT_JOB_ITEMS = 2


def placement_group_items(holds_per_job: Sequence[Sequence[HoldRequest]], array_tasks: int = 0) -> int:
    """The transaction items of placements written together: each host's update once, each job's own
    items, and one array counter update per array task among them."""
    hosts = {h.host_id for holds in holds_per_job for h in holds}
    return len(hosts) + PLACEMENT_JOB_ITEMS * len(holds_per_job) + array_tasks


def check_placement_group(holds_per_job: Sequence[Sequence[HoldRequest]], array_tasks: int = 0) -> None:
    """Each placement's holds valid (``check_hold_requests``) and all of them one transaction (ValueError)."""
    for holds in holds_per_job:
        check_hold_requests(holds)
    if placement_group_items(holds_per_job, array_tasks) > MAX_TRANSACTION_ITEMS:
        raise ValueError(f"{len(holds_per_job)} placements do not fit one transaction")


def check_hold_requests(holds: Sequence[HoldRequest]) -> None:
    """One hold per host, and few enough to fit one transaction with the job's items (ValueError)."""
    hosts = [h.host_id for h in holds]
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"a placement holds GPUs on each host once, not {hosts}")
    if len(holds) + PLACEMENT_JOB_ITEMS > MAX_TRANSACTION_ITEMS:
        raise ValueError(f"a placement on {len(holds)} hosts does not fit one transaction")


class HostInventory(_Frozen):
    """What a host reports when it registers: identity and hardware. Its health and lease move apart."""

    host_id: Annotated[str, Field(pattern=HOST_ID_RE)]
    pool: Annotated[str, Field(pattern=POOL_RE)]
    gpu_type: Annotated[str, Field(min_length=1, max_length=32)]
    gpu_ids: tuple[str, ...] = ()
    """The devices' UUIDs (NVML), one per GPU."""
    cpu: Annotated[float, Field(ge=0)]
    memory_gib: Annotated[float, Field(ge=0)]
    labels: dict[str, str] = Field(default_factory=dict)
    containment: Containment | None = None
    """How its agent holds a job's processes together (docs/agent.md, Containment); None: an agent
    that does not say."""

    @model_validator(mode="after")
    def _unique_gpus(self) -> HostInventory:
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ValueError("gpu_ids must be unique")
        return self


#: The most GPUs one host may register with (the largest servers carry 8 or 16): a host claiming more
#: is refused, whatever it says.
MAX_HOST_GPUS = 16


class Admission(_Frozen):
    """What a host may register at most: its GPU type and count. Fixed by its first registration (or
    by an admin); a later registration may report fewer GPUs (one failed), never more or another
    type, until an admin admits more."""

    gpu_type: Annotated[str, Field(min_length=1, max_length=32)]
    gpus: Annotated[int, Field(ge=0, le=MAX_HOST_GPUS)]


class InventoryRefused(Forbidden):
    """A host registered more (or other) GPUs than it was admitted with, or more than any host has."""

    code = "InventoryRefused"


def admission_for(current: HostRecord | None, inventory: HostInventory) -> Admission:
    """The admission the host keeps after registering ``inventory``: the first registration fixes it
    (at most ``MAX_HOST_GPUS``); a host registered before admissions were kept is admitted with what
    it had. Raises ``InventoryRefused`` for more GPUs, or another type, than admitted."""
    count = len(inventory.gpu_ids)
    if count > MAX_HOST_GPUS:
        raise InventoryRefused(
            f"host {inventory.host_id!r} registered {count} GPUs; a host has at most {MAX_HOST_GPUS}",
            details={"gpus": count, "max": MAX_HOST_GPUS},
        )
    if current is None:
        return Admission(gpu_type=inventory.gpu_type, gpus=count)
    admitted = current.admitted or Admission(
        gpu_type=current.inventory.gpu_type, gpus=min(MAX_HOST_GPUS, current.gpus)
    )
    if inventory.gpu_type != admitted.gpu_type or count > admitted.gpus:
        raise InventoryRefused(
            f"host {inventory.host_id!r} registered {count} {inventory.gpu_type} GPUs; it is admitted "
            f"with at most {admitted.gpus} {admitted.gpu_type}: an admin must admit more "
            f"(berth admit {inventory.host_id} --gpu-type {inventory.gpu_type} --gpus {count})",
            details={
                "admitted": admitted.model_dump(),
                "registered": {"gpu_type": inventory.gpu_type, "gpus": count},
            },
        )
    return admitted


class HostRecord(_Frozen):
    """A host as stored: inventory, health, lease expiry, and the holds of running attempts."""

    inventory: HostInventory
    healthy: bool = True
    lease_expires_at: datetime | None = None
    holds: dict[str, Hold] = Field(default_factory=dict)
    """attempt key (``attempt_key``) -> what it holds."""
    version: int = 0
    draining: bool = False
    """Its agent said it takes no new work (its heartbeat's ``draining``); reset on registration."""
    drain_requested: bool = False
    """An operator asked it to drain: heartbeats answer a ``drain`` directive; survives registration."""
    admitted: Admission | None = None
    """What it may register at most (``admission_for``); None: a host stored before admissions were."""
    cached_datasets: tuple[CachedDataset, ...] = ()
    """What its agent last said its object cache holds (data locality; at most
    ``MAX_CACHED_DATASETS``)."""
    gpu_faults: dict[str, GpuFault] = Field(default_factory=dict)
    """GPU UUID -> its fatal fault (``berth.domain.gpu_health``): out of placement until an admin
    clears it; survives registration."""
    gpu_warnings: dict[str, GpuFault] = Field(default_factory=dict)
    """GPU UUID -> a warning its agent reports now (thermal slowdown, throttling): shown only."""
    cleared_faults: tuple[str, ...] = ()
    """Ids of the faults an admin cleared lately (``CLEARED_KEPT``): an agent still reporting one is
    told to forget it."""

    @property
    def host_id(self) -> str:
        return self.inventory.host_id

    @property
    def faulted_gpu_ids(self) -> set[str]:
        """The GPUs with a fatal fault: never placed on."""
        return {g for g, f in self.gpu_faults.items() if f.severity is Severity.FATAL}

    @property
    def degraded(self) -> bool:
        """One of its GPUs has a fatal fault (the host itself may still take work on the others)."""
        return bool(self.faulted_gpu_ids)

    @property
    def held_gpu_ids(self) -> set[str]:
        return {g for h in self.holds.values() for g in h.gpu_ids}

    @property
    def free_gpu_ids(self) -> tuple[str, ...]:
        """The GPUs no attempt holds and no fatal fault took out of placement."""
        out = self.held_gpu_ids | self.faulted_gpu_ids
        return tuple(g for g in self.inventory.gpu_ids if g not in out)

    @property
    def gpus(self) -> int:
        return len(self.inventory.gpu_ids)

    @property
    def free_gpus(self) -> int:
        return len(self.free_gpu_ids)

    @property
    def free_cpu(self) -> float:
        return max(0.0, self.inventory.cpu - sum(h.cpu for h in self.holds.values()))

    @property
    def free_memory_gib(self) -> float:
        return max(0.0, self.inventory.memory_gib - sum(h.memory_gib for h in self.holds.values()))

    def alive(self, now: datetime) -> bool:
        """Healthy and within its lease (a host that never heartbeated has no lease yet: alive)."""
        return self.healthy and (self.lease_expires_at is None or self.lease_expires_at > now)

    def schedulable(self, now: datetime) -> bool:
        """Alive and neither draining nor asked to drain: the scheduler may place new work here."""
        return self.alive(now) and not self.draining and not self.drain_requested

    def pick_free(self, gpus: int) -> tuple[str, ...] | None:
        """The first ``gpus`` free UUIDs, or None when fewer are free."""
        free = self.free_gpu_ids
        return free[:gpus] if len(free) >= gpus else None


class StoredDocument(_Frozen):
    """One version of an organisational document (the scheduling policy, the cloud offers)."""

    kind: str
    version: int
    """1, 2, ... for stored versions; 0 for the built-in default (nothing stored yet)."""
    document: Any
    updated_at: datetime | None = None
    updated_by: str | None = None
