"""Scheduler inputs built from the store, in one place: the submit-time feasibility check, ``explain``,
``capacity`` and the scheduler service (issue 8, item 2) all read the fleet, the policy and the
offers through ``SnapshotSource``, so they see the same facts the same way.

The policy is the stored one (``DocumentRepository`` kind ``policy``; the shipped default until an
admin stores one) plus the registered datasets' residency (``with_dataset_residency``); the offers
are the stored ones (kind ``offers``; the pricing catalog until an admin stores others), limited to
the instance types the deployed Batch compute environments hold (``CloudCapacity``): the default
document is the catalog filtered to them, and a stored document is intersected with them when read
(``FleetService`` also refuses to store an offer outside them), so the scheduler never places a job on
an offer nothing can run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from berth.domain.batch_queues import CloudCapacity, batch_queue_name
from berth.domain.cost import cloud_spend, month_of
from berth.domain.fleet import HostRecord, StoredDocument
from berth.domain.job import Job
from berth.domain.placement import CloudPlacement, OnPremPlacement, Site
from berth.domain.ports import (
    CircuitRepository,
    DocumentRepository,
    HostRepository,
    JobRepository,
    RuntimeHistory,
    TenantRepository,
    UsageLedger,
)
from berth.domain.queue import QueueEntry
from berth.domain.status import JobStatus
from berth.domain.storage import Dataset, dataset_names
from berth.domain.tenancy import Quota
from berth.logic.runtimes import predictor_for
from berth.pricing.catalog import load_offers
from berth.scheduler.adapter import pending_from_spec, with_dataset_residency
from berth.scheduler.defaults import default_policy
from berth.scheduler.policy import SchedulingPolicy, load_policy
from berth.scheduler.snapshot import (
    CircuitRecord,
    CloudOffer,
    Host,
    PendingJob,
    RunningJob,
    Snapshot,
    TenantState,
)

POLICY = "policy"
OFFERS = "offers"
#: Statuses holding capacity (running). The scheduler places QUEUED jobs (a RETRYING job waits out
#: its backoff first), read from the queue index (``QueueLimits``); every running job is read.
RUNNING_STATUSES = (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELING)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How much of the queue index one pass reads (docs/scheduling.md, "What a pass reads").

    Each tenant with active jobs gets its first ``min_head`` entries read, then what is left of
    ``read_budget`` is shared equally among the deeper queues; when the tenants are more than
    ``read_budget // min_head``, or reading takes longer than ``read_deadline_s``, the pass reads the
    heads of as many as fit, round-robin from where the previous pass stopped."""

    read_budget: int = 20_000
    min_head: int = 40
    read_deadline_s: float = 10.0


@dataclass
class QueueCursor:
    """Where the next round-robin read starts (the first tenant after ``after``, by name). Kept by the
    scheduler's process (one pass at a time); a cold start begins at the first tenant."""

    after: str = ""


@dataclass(frozen=True, slots=True)
class QueueRead:
    """What a pass read of the queue: the entries, and per tenant how many of its active jobs it did
    not read (counted from the tenant's active-job counter; only for tenants it read in part or not
    at all), with the tenants it did not reach this pass."""

    entries: list[QueueEntry]
    unread: dict[str, int]
    skipped_tenants: tuple[str, ...] = ()


def read_queue(
    jobs: JobRepository,
    limits: QueueLimits,
    cursor: QueueCursor,
    placed_by_tenant: dict[str, int],
    monotonic: Callable[[], float] = time.monotonic,
) -> QueueRead:
    """The heads of the tenants' queues, within ``limits`` (``placed_by_tenant``: each tenant's jobs
    holding capacity, so what its active-job count leaves unread is known)."""
    active = jobs.queued_tenants()
    tenants = sorted(active)
    if not tenants:
        return QueueRead([], {})
    fit = max(1, limits.read_budget // max(1, limits.min_head))
    start = next((i for i, t in enumerate(tenants) if t > cursor.after), 0)
    order = tenants[start:] + tenants[:start]
    chosen = order[:fit]
    deadline = monotonic() + limits.read_deadline_s
    heads: dict[str, list[QueueEntry]] = {}
    deep: list[str] = []
    # First every chosen tenant's head (``min_head``), then what is left of the budget shared among
    # the deeper queues: a deep backlog is read after every other tenant's head, never before.
    for tenant in chosen:
        if heads and monotonic() > deadline:
            break
        head = jobs.queue_head(tenant, limits.min_head)
        heads[tenant] = head.entries
        if head.more:
            deep.append(tenant)
    left = limits.read_budget - sum(len(v) for v in heads.values())
    if deep and left >= len(deep) and monotonic() <= deadline:
        more = limits.min_head + left // len(deep)
        for tenant in list(deep):
            if monotonic() > deadline:
                break
            head = jobs.queue_head(tenant, more)
            heads[tenant] = head.entries
            if not head.more:
                deep.remove(tenant)
    skipped = tuple(t for t in order if t not in heads)
    if skipped:
        cursor.after = next(reversed(heads))
    unread: dict[str, int] = {}
    for tenant in (*deep, *skipped):
        n = active[tenant] - placed_by_tenant.get(tenant, 0) - len(heads.get(tenant, ()))
        if n > 0:
            unread[tenant] = n
    return QueueRead([e for v in heads.values() for e in v], dict(sorted(unread.items())), skipped)


class OfferModel(BaseModel):
    """One cloud offer as an admin stores it (the scheduler's ``CloudOffer``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: Annotated[str, Field(min_length=1, max_length=32)]
    zone: Annotated[str, Field(min_length=1, max_length=32)]
    instance_type: Annotated[str, Field(min_length=1, max_length=64)]
    gpu_type: Annotated[str, Field(min_length=1, max_length=32)]
    gpus: Annotated[int, Field(ge=1, le=64)]
    vcpus: Annotated[float, Field(gt=0)]
    memory_gib: Annotated[float, Field(gt=0)]
    on_demand_usd_h: Annotated[float, Field(ge=0)]
    spot_usd_h: Annotated[float | None, Field(ge=0)] = None
    available: Annotated[int | None, Field(ge=0)] = None
    queue: Annotated[str, Field(max_length=128)] = ""

    def offer(self) -> CloudOffer:
        return CloudOffer(**self.model_dump())


class OffersDocument(BaseModel):
    """The cloud offers document: what the cloud may sell, region by region."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    offers: Annotated[list[OfferModel], Field(max_length=2000)]


def deployed(offer: CloudOffer, capacity: CloudCapacity | None) -> bool:
    """Whether a deployed compute environment can run ``offer`` (None: no restriction known). An
    offer's own ``queue`` must then be one of its instance type's queues in its region."""
    if capacity is None:
        return True
    if not capacity.has(offer.region, offer.instance_type):
        return False
    return not offer.queue or offer.queue in (
        batch_queue_name(offer.region, offer.instance_type, False),
        batch_queue_name(offer.region, offer.instance_type, True),
    )


def undeployed(offers: Iterable[CloudOffer], capacity: CloudCapacity | None) -> list[str]:
    """``region instance_type`` of each offer no deployed compute environment runs (sorted, unique)."""
    return sorted({f"{o.region} {o.instance_type}" for o in offers if not deployed(o, capacity)})


def default_offers_document(capacity: CloudCapacity | None = None) -> dict[str, Any]:
    """The shipped pricing catalog (``berth/pricing``) as an offers document; with ``capacity``, only
    the instance types a deployed compute environment holds."""
    return {
        "offers": [
            OfferModel(
                region=o.region,
                zone=o.zone,
                instance_type=o.instance_type,
                gpu_type=o.gpu_type,
                gpus=o.gpus,
                vcpus=o.vcpus,
                memory_gib=o.memory_gib,
                on_demand_usd_h=o.on_demand_usd_h,
                spot_usd_h=o.spot_usd_h,
            ).model_dump(mode="json")
            for o in load_offers()
            if deployed(o, capacity)
        ]
    }


def default_document(kind: str, capacity: CloudCapacity | None = None) -> StoredDocument:
    """Version 0 of a document: what the service uses until an admin stores one."""
    if kind == POLICY:
        return StoredDocument(kind=kind, version=0, document=default_policy().model_dump(mode="json"))
    return StoredDocument(kind=kind, version=0, document=default_offers_document(capacity))


def tenant_state(name: str, quota: Quota | None, cloud_spend_month_usd: float = 0.0) -> TenantState:
    """A tenant's quota as the scheduler's tenant state (models not listed: no limit), with what its
    cloud use cost this month (the monthly budget's rule reads it)."""
    q = quota or Quota()
    return TenantState(
        name=name,
        weight=q.weight,
        guaranteed_gpus={m: g.guaranteed for m, g in q.gpus.items()},
        borrow_limit_gpus={m: g.borrow_limit for m, g in q.gpus.items()},
        monthly_budget_usd=q.monthly_cloud_budget_usd,
        cloud_spend_month_usd=cloud_spend_month_usd,
    )


def scheduler_host(record: HostRecord, now: datetime) -> Host:
    """A stored host as the scheduler sees it: healthy only while alive (healthy, lease valid) and not
    draining (its agent takes no new work, or an operator asked it to drain). Its GPUs with a fatal
    fault are never free (``HostRecord.free_gpu_ids``) but still count in its size: the submit-time
    check asks whether a host could *ever* run a job, and an admin clears a repaired GPU."""
    inv = record.inventory
    return Host(
        host_id=inv.host_id,
        pool=inv.pool,
        gpu_type=inv.gpu_type,
        gpus=record.gpus,
        free_gpus=record.free_gpus,
        cpu=inv.cpu,
        free_cpu=record.free_cpu,
        memory_gib=inv.memory_gib,
        free_memory_gib=record.free_memory_gib,
        healthy=record.schedulable(now),
        labels=dict(inv.labels),
        cached_datasets=frozenset(c.source for c in record.cached_datasets),
    )


def pending_job(job: Job) -> PendingJob:
    """A queued job as the scheduler sees it; its ``max_cost_usd`` is what is left of it after the
    attempts it already paid for."""
    pending = pending_from_spec(
        job.id,
        job.tenant,
        job.spec,
        job.created_at.timestamp(),
        avoid_hosts=job.run.excluded_hosts,
        avoid_regions=job.run.excluded_regions,
    )
    if pending.max_cost_usd is not None and job.cost_usd > 0:
        pending = replace(pending, max_cost_usd=max(0.0, pending.max_cost_usd - job.cost_usd))
    return pending


def pending_entry(entry: QueueEntry) -> PendingJob:
    """A queue index entry as the scheduler sees it (the same as ``pending_job`` of its full job)."""
    return PendingJob(
        job_id=entry.job_id,
        tenant=entry.tenant,
        gpu_type=entry.gpu_type,
        gpus=entry.gpus,
        submitted_at=entry.created_at.timestamp(),
        nodes=entry.nodes,
        cpu=entry.cpu,
        memory_gib=entry.memory_gib,
        placement=entry.placement,
        regions=entry.regions,
        spot=entry.spot,
        priority=entry.priority,
        max_hourly_usd=entry.max_hourly_usd,
        max_cost_usd=entry.max_cost_usd,
        expected_duration_s=entry.expected_duration_s,
        family=entry.family,
        timeout_s=entry.timeout_s,
        datasets=entry.datasets,
        avoid_hosts=entry.avoid_hosts,
        avoid_regions=entry.avoid_regions,
    )


def running_job(job: Job) -> RunningJob | None:
    """A placed job as capacity it holds (None: not placed)."""
    p = job.placement
    r = job.spec.resources
    common: dict[str, Any] = {
        "job_id": job.id,
        "tenant": job.tenant,
        "gpus": r.gpus,
        "started_at": job.updated_at.timestamp(),
        "nodes": r.nodes,
        "cpu": r.cpu,
        "memory_gib": r.memory_gib,
        "priority": job.spec.constraints.priority,
        "placement": job.spec.constraints.placement,
        "datasets": tuple(d.source for d in job.spec.data),
        "family": job.spec.name,
        "timeout_s": job.spec.timeout_minutes * 60.0,
        "expected_duration_s": (
            None if job.spec.expected_duration_minutes is None else job.spec.expected_duration_minutes * 60.0
        ),
    }
    if isinstance(p, OnPremPlacement):
        return RunningJob(
            **common,
            gpu_type=p.gpu_type,
            site=Site.ONPREM,
            hosts=tuple((h.host_id, h.gpus) for h in p.hosts),
        )
    if isinstance(p, CloudPlacement):
        return RunningJob(
            **common,
            gpu_type=p.gpu_type,
            site=Site.CLOUD,
            region=p.region,
            instance_type=p.instance_type,
            spot=p.spot,
            hourly_usd=p.hourly_usd,
        )
    return None


@dataclass(frozen=True, slots=True)
class Fleet:
    """What feasibility and capacity read: the effective policy, the hosts, the offers."""

    policy: SchedulingPolicy
    policy_version: int
    hosts: tuple[Host, ...]
    records: tuple[HostRecord, ...]
    offers: tuple[CloudOffer, ...]
    offers_version: int
    circuits: tuple[CircuitRecord, ...] = ()
    """Cloud capacity and API failures per (region, instance type or '*'), recorded by the cloud branch
    (``CircuitRepository``); the core's ``CircuitBoard`` decides what they mean."""


@dataclass(frozen=True)
class SnapshotSource:
    """Reads the store into scheduler inputs. The one place that does it."""

    jobs: JobRepository
    tenants: TenantRepository
    hosts: HostRepository
    documents: DocumentRepository
    clock: Callable[[], datetime]
    cloud_enabled: bool = True
    """False until a cloud dispatcher is deployed (the cloud-bursting issue): no offers are read, so
    nothing is ever placed in the cloud and feasibility, explain and capacity say so."""
    usage: UsageLedger | None = None
    """The usage ledger: each tenant's cloud spend this month (None: counted as nothing)."""
    circuits: CircuitRepository | None = None
    """The cloud's health signal (None: no cloud branch deployed, every circuit closed)."""
    runtimes: RuntimeHistory | None = None
    """The finished jobs' run-time history (``berth.logic.runtimes``; None: no predictor, the core
    falls back to the user's estimate, else the timeout)."""
    capacity: CloudCapacity | None = None
    """The instance types the deployed Batch compute environments hold (None: no restriction); offers
    of anything else are dropped, from the default document and from a stored one alike."""
    queue: QueueLimits = field(default_factory=QueueLimits)
    cursor: QueueCursor = field(default_factory=QueueCursor)
    monotonic: Callable[[], float] = time.monotonic

    def cloud_spend(self, tenant: str) -> float:
        """What the tenant's cloud attempts cost this month (UTC), running ones so far included."""
        if self.usage is None:
            return 0.0
        return cloud_spend(self.usage.month(tenant, month_of(self.clock())))

    def circuit_records(self) -> tuple[CircuitRecord, ...]:
        if self.circuits is None or not self.cloud_enabled:
            return ()
        return tuple(
            CircuitRecord(
                region=e.region,
                instance_type=e.instance_type,
                failures=e.failures,
                last_success_at=e.last_success_at,
            )
            for e in self.circuits.list()
        )

    def document(self, kind: str) -> StoredDocument:
        return self.documents.current(kind) or default_document(kind, self.capacity)

    def policy(self, datasets: Iterable[str] = ()) -> tuple[SchedulingPolicy, int]:
        """The stored policy (or the default) with the residency of the named registered datasets."""
        doc = self.document(POLICY)
        policy = load_policy(doc.document)
        registered: dict[str, Dataset] = {}
        for name in sorted(set(datasets)):
            ds = self.tenants.dataset(name)
            if ds is not None:
                registered[name] = ds
        return with_dataset_residency(policy, registered), doc.version

    def offers(self) -> tuple[tuple[CloudOffer, ...], int]:
        if not self.cloud_enabled:
            return (), 0
        doc = self.document(OFFERS)
        parsed = OffersDocument.model_validate(doc.document)
        offers = (o.offer() for o in parsed.offers)
        return tuple(o for o in offers if deployed(o, self.capacity)), doc.version

    def fleet(self, datasets: Iterable[str] = (), circuits: bool = True) -> Fleet:
        """``circuits=False``: no circuit records read (the submit-time feasibility check: an open
        circuit never makes a job infeasible, so it does not read them)."""
        now = self.clock()
        policy, pv = self.policy(datasets)
        offers, ov = self.offers()
        records = tuple(self.hosts.list_hosts())
        return Fleet(
            policy=policy,
            policy_version=pv,
            hosts=tuple(scheduler_host(r, now) for r in records),
            records=records,
            offers=offers,
            offers_version=ov,
            circuits=self.circuit_records() if circuits else (),
        )

    def snapshot(self) -> tuple[Snapshot, Fleet, list[QueueEntry]]:
        """The queue (as a pass reads it) and fleet as the scheduler sees it now, with the entries."""
        inputs = self.pass_inputs()
        return inputs.snapshot, inputs.fleet, inputs.pending

    def hydrate(self, job_ids: Iterable[str]) -> dict[str, Job]:
        """The full items of the jobs about to be placed (BatchGetItem), read only for them."""
        return self.jobs.get_many(job_ids)

    def tenant_state(self, tenant: str) -> TenantState:
        """The tenant as the scheduler sees it; the ledger is read only when it has a cloud budget."""
        quota = self.tenants.quota(tenant)
        budgeted = quota is not None and quota.monthly_cloud_budget_usd is not None
        return tenant_state(tenant, quota, self.cloud_spend(tenant) if budgeted else 0.0)

    def pass_inputs(self) -> PassInputs:
        """Everything a scheduling pass reads: every running job (whole), the heads of the tenants'
        queues (compact entries, ``read_queue``), the fleet and the tenants."""
        running_jobs = [j for s in RUNNING_STATUSES for j in self.jobs.list_placed(s)]
        placed: dict[str, int] = {}
        for j in running_jobs:
            placed[j.tenant] = placed.get(j.tenant, 0) + 1
        queue = read_queue(self.jobs, self.queue, self.cursor, placed, self.monotonic)
        pending = queue.entries
        names = {n for e in pending for n in dataset_names_of(e.datasets)} | {
            n for j in running_jobs for n in dataset_names(j.spec)
        }
        fleet = self.fleet(names)
        tenants = {e.tenant for e in pending} | {j.tenant for j in running_jobs}
        running = tuple(r for r in (running_job(j) for j in running_jobs) if r is not None)
        snapshot = Snapshot(
            pending=tuple(pending_entry(e) for e in pending),
            running=running,
            hosts=fleet.hosts,
            offers=fleet.offers,
            tenants={t: self.tenant_state(t) for t in sorted(tenants)},
            circuits=fleet.circuits,
            runtimes=None if self.runtimes is None else predictor_for(self.runtimes, tenants),
            unread=queue.unread,
        )
        return PassInputs(snapshot, fleet, pending, running_jobs, queue)


def dataset_names_of(sources: Iterable[str]) -> set[str]:
    """The registered datasets (``dataset://NAME/...``) among data sources."""
    return {s.removeprefix("dataset://").split("/", 1)[0] for s in sources if s.startswith("dataset://")}


@dataclass(frozen=True, slots=True)
class PassInputs:
    snapshot: Snapshot
    fleet: Fleet
    pending: list[QueueEntry]
    running_jobs: list[Job]
    queue: QueueRead
