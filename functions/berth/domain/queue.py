"""The queue index entry of a queued job: only what the scheduler core reads of it, plus what the pass
needs to decide without the full item (its version, whether its execution parked a placement token,
its stored reason). Stored in the Jobs table's sparse ``by_queue`` index (docs/scheduling.md), keyed
``<tenant>#<shard>`` / ``<priority>#<created>#<job id>``, so the head of a tenant's queue is the first
items of each of its shards and no partition takes every tenant's writes. Pure.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from berth.domain.arrays import order_id
from berth.domain.job import Job, iso
from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy

#: Shards per tenant: each is its own index partition (about 1,000 writes/s each on DynamoDB), so a
#: tenant's burst spreads over this many; reading a tenant's head costs one Query per shard.
QUEUE_SHARDS = 4
#: Priority order in the sort key: high sorts first.
_PRIORITY_KEY = {Priority.HIGH: "0", Priority.NORMAL: "1", Priority.LOW: "2"}


def queue_shard(job_id: str, shards: int = QUEUE_SHARDS) -> int:
    return zlib.crc32(job_id.encode()) % shards


def queue_partition(tenant: str, shard: int) -> str:
    return f"{tenant}#{shard}"


def queue_sort_key(job: Job) -> str:
    """Higher priority first, then earlier submission, then the id with a task's index in its
    number order (the core's order within a tenant)."""
    return f"{_PRIORITY_KEY[job.spec.constraints.priority]}#{iso(job.created_at)}#{order_id(job.id)}"


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A queued job as the pass reads it from the queue index (``max_cost_usd`` is what is left of
    the job's limit after the attempts it already paid for)."""

    job_id: str
    tenant: str
    version: int
    created_at: datetime
    updated_at: datetime
    reason: str
    awaiting_execution: bool
    """No execution has parked a placement token for it yet (a lost start is repaired after a while)."""
    gpu_type: str
    gpus: int
    nodes: int
    cpu: float
    memory_gib: float
    placement: PlacementConstraint
    regions: tuple[str, ...]
    spot: SpotPolicy
    priority: Priority
    max_hourly_usd: float | None
    max_cost_usd: float | None
    expected_duration_s: float | None
    timeout_s: float
    family: str
    datasets: tuple[str, ...]
    avoid_hosts: tuple[str, ...]
    avoid_regions: tuple[str, ...]

    @property
    def sort_key(self) -> str:
        return f"{_PRIORITY_KEY[self.priority]}#{iso(self.created_at)}#{self.job_id}"


def queue_entry(job: Job) -> QueueEntry:
    spec = job.spec
    r, c = spec.resources, spec.constraints
    max_cost = c.max_cost_usd
    if max_cost is not None and job.cost_usd > 0:
        max_cost = max(0.0, max_cost - job.cost_usd)
    return QueueEntry(
        job_id=job.id,
        tenant=job.tenant,
        version=job.version,
        created_at=job.created_at,
        updated_at=job.updated_at,
        reason=job.reason,
        awaiting_execution=job.run.placement_token is None,
        gpu_type=r.gpu_type,
        gpus=r.gpus,
        nodes=r.nodes,
        cpu=r.cpu,
        memory_gib=r.memory_gib,
        placement=c.placement,
        regions=tuple(c.regions),
        spot=c.spot,
        priority=c.priority,
        max_hourly_usd=c.max_hourly_usd,
        max_cost_usd=max_cost,
        expected_duration_s=(
            spec.expected_duration_minutes * 60.0 if spec.expected_duration_minutes is not None else None
        ),
        timeout_s=spec.timeout_minutes * 60.0,
        family=spec.name,
        datasets=tuple(d.source for d in spec.data),
        avoid_hosts=tuple(job.run.excluded_hosts),
        avoid_regions=tuple(job.run.excluded_regions),
    )


# The stored form: short keys, defaults left out (an entry is read for every queued job every pass).
_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "pl": "auto",
    "rg": [],
    "sp": "allowed",
    "pr": "normal",
    "mh": None,
    "mc": None,
    "ed": None,
    "ds": [],
    "ah": [],
    "ar": [],
    "ax": False,
}


def entry_document(e: QueueEntry) -> dict[str, Any]:
    """The ``queue_entry`` attribute (the reason, the version and the tenant are attributes of their
    own, so they are not repeated here)."""
    doc: dict[str, Any] = {
        "c": iso(e.created_at),
        "u": iso(e.updated_at),
        "g": e.gpu_type,
        "k": e.gpus,
        "n": e.nodes,
        "cpu": e.cpu,
        "mem": e.memory_gib,
        "pl": str(e.placement),
        "rg": list(e.regions),
        "sp": str(e.spot),
        "pr": str(e.priority),
        "mh": e.max_hourly_usd,
        "mc": e.max_cost_usd,
        "ed": e.expected_duration_s,
        "to": e.timeout_s,
        "f": e.family,
        "ds": list(e.datasets),
        "ah": list(e.avoid_hosts),
        "ar": list(e.avoid_regions),
        "ax": e.awaiting_execution,
    }
    return {k: v for k, v in doc.items() if k not in _DEFAULTS or v != _DEFAULTS[k]}


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def entry_from_document(
    job_id: str, tenant: str, version: int, reason: str, doc: dict[str, Any]
) -> QueueEntry:
    d = {**_DEFAULTS, **doc}
    return QueueEntry(
        job_id=job_id,
        tenant=tenant,
        version=version,
        created_at=_ts(d["c"]),
        updated_at=_ts(d["u"]),
        reason=reason,
        awaiting_execution=bool(d["ax"]),
        gpu_type=d["g"],
        gpus=int(d["k"]),
        nodes=int(d["n"]),
        cpu=float(d["cpu"]),
        memory_gib=float(d["mem"]),
        placement=PlacementConstraint(d["pl"]),
        regions=tuple(d["rg"]),
        spot=SpotPolicy(d["sp"]),
        priority=Priority(d["pr"]),
        max_hourly_usd=None if d["mh"] is None else float(d["mh"]),
        max_cost_usd=None if d["mc"] is None else float(d["mc"]),
        expected_duration_s=None if d["ed"] is None else float(d["ed"]),
        timeout_s=float(d["to"]),
        family=d["f"],
        datasets=tuple(d["ds"]),
        avoid_hosts=tuple(d["ah"]),
        avoid_regions=tuple(d["ar"]),
    )
