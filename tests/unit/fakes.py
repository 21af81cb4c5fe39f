"""In-memory fakes of the repository ports, with the same item layout and write semantics as DynamoDB.

Both fakes share one ``FakeTenantTable`` as the DynamoDB repositories share the Tenants table: the
tenant record holds the quota (written by admins) and the ``active_jobs`` counter (moved by job
create and finish), so a writer that replaces the whole record drops the other writer's attribute
here too. ``tests/functional/contracts`` runs the same suites against these and the DynamoDB ones.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from berth.domain.agent_wire import CachedDataset
from berth.domain.cost import AttemptUsage
from berth.domain.errors import AlreadySubmitted, Conflict, InvalidRequest, NotFound, QuotaExceeded
from berth.domain.fleet import (
    Admission,
    Hold,
    HoldRelease,
    HostInventory,
    HostRecord,
    StoredDocument,
    admission_for,
    check_placement_group,
)
from berth.domain.gpu_health import CLEARED_KEPT, GpuFault
from berth.domain.idempotency import SubmitClaim
from berth.domain.job import Job, JobEvent
from berth.domain.log_pages import LOG_PAGE_BUDGET_BYTES, fit_page
from berth.domain.observability import LogEvent, LogPage, MetricSample, StoredSample
from berth.domain.ports import Member, Page, PlacementWrite, QueueHead, TenantRecord, UploadTicket
from berth.domain.queue import QueueEntry, queue_entry
from berth.domain.status import JobStatus
from berth.domain.storage import DataGrants, Dataset
from berth.domain.tenancy import Quota, Role, canonical_principal

PLACED = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELING})


class FakeTenantTable:
    """The Tenants table: ``PRINCIPAL#<arn>`` and ``TENANT#<name>`` items, each a dict of attributes."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.lock = threading.RLock()

    def tenant_item(self, tenant: str) -> dict[str, Any]:
        """The tenant's item, created empty as an UpdateItem would."""
        return self.items.setdefault("TENANT#" + tenant, {"tenant": tenant})


class FakeJobs:
    def __init__(self, table: FakeTenantTable | None = None) -> None:
        self.table = table if table is not None else FakeTenantTable()
        self.jobs: dict[str, Job] = {}
        self.history: dict[str, list[JobEvent]] = {}
        #: Called inside save() before the version check, to simulate a racing writer.
        self.before_save: Callable[[Job], None] | None = None
        self.claims: dict[str, tuple[str, SubmitClaim]] = {}
        #: Reads by kind (the scheduler's queue reads are counted, as calls would be on DynamoDB).
        self.reads: Counter[str] = Counter()
        #: Where ``save`` records an ended attempt's usage (as DynamoDB's does in its transaction).
        self.usage_ledger: Any = None
        #: Where ``save`` gives an ended attempt's GPU holds back (as DynamoDB's does in its transaction).
        self.hosts: Any = None

    def create(self, job: Job, event: JobEvent, max_active: int, claim: SubmitClaim | None = None) -> None:
        with self.table.lock:
            if claim is not None and claim.key in self.claims:
                job_id, held = self.claims[claim.key]
                if held.expires_at > job.created_at:
                    raise AlreadySubmitted(job_id, held.fingerprint)
            if job.id in self.jobs:
                raise Conflict("exists")
            item = self.table.tenant_item(job.tenant)
            if item.get("active_jobs", 0) >= max_active:
                raise QuotaExceeded(f"tenant {job.tenant!r} is at its max_active_jobs ({max_active})")
            item["active_jobs"] = item.get("active_jobs", 0) + 1
            item["directory"] = "T"
            self.jobs[job.id] = job
            self.history[job.id] = [event]
            if claim is not None:
                self.claims[claim.key] = (job.id, claim)
            if claim is not None:
                self.claims[claim.key] = (job.id, claim)

    def save(
        self,
        job: Job,
        event: JobEvent,
        usage: AttemptUsage | None = None,
        releases: tuple[HoldRelease, ...] = (),
    ) -> None:
        if self.before_save is not None:
            hook, self.before_save = self.before_save, None
            hook(job)
        if usage is not None and self.usage_ledger is None:
            raise ValueError("this job repository has no usage ledger to record the attempt's usage in")
        if releases and self.hosts is None:
            raise ValueError("this job repository has no hosts table to give the attempt's GPUs back to")
        with self.table.lock, self.hosts.lock if releases else contextlib.nullcontext():
            stored = self.jobs.get(job.id)
            if stored is None or stored.version != job.version - 1:
                raise Conflict("version moved")
            if usage is not None and self.usage_ledger is not None:
                self.usage_ledger.record(usage)  # its rule: a record of more run time stays
            for r in releases:  # a hold already released is left as it is
                self.hosts.release(r.host_id, r.attempt, r.gpu_ids)
            self.jobs[job.id] = job
            self.history[job.id].append(event)
            if event.from_ is not None and event.from_.is_active and job.status.is_terminal:
                item = self.table.tenant_item(job.tenant)
                item["active_jobs"] = item.get("active_jobs", 0) - 1

    def update(self, job: Job) -> None:
        with self.table.lock:
            stored = self.jobs.get(job.id)
            if stored is None or stored.version != job.version - 1:
                raise Conflict("version moved")
            self.jobs[job.id] = job

    def get(self, job_id: str) -> Job | None:
        self.reads["get"] += 1
        return self.jobs.get(job_id)

    def list_for_tenant(
        self,
        tenant: str,
        status: JobStatus | None,
        limit: int,
        next_token: str | None,
        since: datetime | None = None,
    ) -> Page:
        rows = sorted(
            (
                j
                for j in self.jobs.values()
                if j.tenant == tenant
                and (status is None or j.status == status)
                and (since is None or j.created_at >= since)
            ),
            key=lambda j: (j.created_at, j.id),
            reverse=True,
        )
        start = 0
        if next_token:
            # Tokens carry the query they belong to, as the DynamoDB repository's do.
            t, s, _, pos = [*next_token.split("|"), "", "", ""][:4]
            if t != tenant or s != str(status) or not pos.isdigit():
                raise InvalidRequest("next_token is not valid for this query; start again without it")
            start = int(pos)
        page = rows[start : start + limit]
        more = start + limit < len(rows)
        return Page(jobs=page, next_token=f"{tenant}|{status}||{start + limit}" if more else None)

    def list_all_tenants(
        self, status: JobStatus | None, limit: int, next_token: str | None, since: datetime | None = None
    ) -> Page:
        rows = sorted(
            (
                j
                for j in self.jobs.values()
                if (status is None or j.status == status) and (since is None or j.created_at >= since)
            ),
            key=lambda j: (j.created_at, j.id),
            reverse=True,
        )
        start = 0
        if next_token:
            a, s, pos = [*next_token.split("|"), "", ""][:3]
            if a != "*ALL*" or s != str(status) or not pos.isdigit():
                raise InvalidRequest("next_token is not valid for this query; start again without it")
            start = int(pos)
        more = start + limit < len(rows)
        return Page(
            jobs=rows[start : start + limit], next_token=f"*ALL*|{status}|{start + limit}" if more else None
        )

    def events(self, job_id: str) -> list[JobEvent]:
        return list(self.history.get(job_id, []))

    def count_active(self, tenant: str) -> int:
        with self.table.lock:
            item = self.table.items.get("TENANT#" + tenant, {})
            return int(item.get("active_jobs", 0))

    def list_placed(self, status: JobStatus) -> list[Job]:
        if status not in PLACED:
            raise ValueError(f"{status} jobs hold no capacity; by_placed does not index them")
        self.reads["list_placed"] += 1
        return sorted(
            (j for j in self.jobs.values() if j.status == status), key=lambda j: (j.created_at, j.id)
        )

    def queued_tenants(self) -> dict[str, int]:
        with self.table.lock:
            counts = {
                pk.removeprefix("TENANT#"): int(item.get("active_jobs", 0))
                for pk, item in self.table.items.items()
                if pk.startswith("TENANT#") and item.get("directory")
            }
        return {t: n for t, n in sorted(counts.items()) if n > 0}

    def queue_head(self, tenant: str, limit: int) -> QueueHead:
        """The first ``limit`` of the tenant's queued jobs in the index's order (one read per shard,
        as the DynamoDB repository's Queries)."""
        self.reads["queue_head"] += 1
        entries = sorted(
            (
                queue_entry(j)
                for j in self.jobs.values()
                if j.tenant == tenant and j.status is JobStatus.QUEUED
            ),
            key=lambda e: e.sort_key,
        )
        return QueueHead(entries=entries[:limit], more=len(entries) > limit)

    def get_many(self, job_ids: Iterable[str]) -> dict[str, Job]:
        ids = list(dict.fromkeys(job_ids))
        self.reads["get_many"] += (len(ids) + 99) // 100
        self.reads["get_many_keys"] += len(ids)
        return {i: self.jobs[i] for i in ids if i in self.jobs}

    def set_reason(self, entry: QueueEntry, reason: str) -> None:
        with self.table.lock:
            stored = self.jobs.get(entry.job_id)
            if stored is None or stored.version != entry.version or stored.status is not JobStatus.QUEUED:
                raise Conflict("version moved")
            self.jobs[entry.job_id] = stored.model_copy(update={"reason": reason})


class FakeHosts:
    """The Hosts table: a GPU UUID is free or in exactly one hold, moved under one lock (one UpdateItem)."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostRecord] = {}
        self.lock = threading.RLock()

    def register(self, inventory: HostInventory, lease_expires_at: datetime) -> HostRecord:
        with self.lock:
            current = self.hosts.get(inventory.host_id)
            admitted = admission_for(current, inventory)
            holds = {} if current is None else dict(current.holds)
            held = {g for h in holds.values() for g in h.gpu_ids}
            missing = held - set(inventory.gpu_ids)
            if missing:
                raise Conflict(f"re-registered without held GPUs {sorted(missing)}")
            record = HostRecord(
                inventory=inventory,
                healthy=True,
                lease_expires_at=lease_expires_at,
                holds=holds,
                version=(0 if current is None else current.version) + 1,
                drain_requested=current is not None and current.drain_requested,
                admitted=admitted,
                # a registration writes only its own attributes: faults stay until an admin clears them
                gpu_faults={} if current is None else dict(current.gpu_faults),
                gpu_warnings={} if current is None else dict(current.gpu_warnings),
                cleared_faults=() if current is None else current.cleared_faults,
            )
            self.hosts[inventory.host_id] = record
            return record

    def heartbeat(
        self,
        host_id: str,
        lease_expires_at: datetime,
        healthy: bool = True,
        draining: bool = False,
        cached_datasets: Sequence[CachedDataset] | None = None,
    ) -> None:
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            update: dict[str, Any] = {
                "lease_expires_at": lease_expires_at,
                "healthy": healthy,
                "draining": draining,
            }
            if cached_datasets is not None:
                update["cached_datasets"] = tuple(cached_datasets)
            self.hosts[host_id] = current.model_copy(update=update)

    def get(self, host_id: str) -> HostRecord | None:
        return self.hosts.get(host_id)

    def list_hosts(self) -> list[HostRecord]:
        return [self.hosts[k] for k in sorted(self.hosts)]

    def hold(
        self,
        host_id: str,
        attempt: str,
        gpu_ids: tuple[str, ...],
        cpu: float,
        memory_gib: float,
        at: datetime | None = None,
    ) -> None:
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            free = set(current.free_gpu_ids)
            if (
                not gpu_ids
                or len(set(gpu_ids)) != len(gpu_ids)
                or attempt in current.holds
                or not set(gpu_ids) <= free
            ):
                raise Conflict(f"GPUs {list(gpu_ids)} of {host_id!r} are not all free")
            holds = {**current.holds, attempt: Hold(gpu_ids=gpu_ids, cpu=cpu, memory_gib=memory_gib, at=at)}
            self.hosts[host_id] = current.model_copy(update={"holds": holds, "version": current.version + 1})

    def release(self, host_id: str, attempt: str, gpu_ids: tuple[str, ...] | None = None) -> bool:
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None or attempt not in current.holds:
                return False
            holds = {k: v for k, v in current.holds.items() if k != attempt}
            self.hosts[host_id] = current.model_copy(update={"holds": holds, "version": current.version + 1})
            return True

    def mark_lost(self, host_id: str, expired_before: datetime) -> bool:
        with self.lock:
            current = self.hosts.get(host_id)
            if (
                current is None
                or not current.healthy
                or current.lease_expires_at is None
                or current.lease_expires_at >= expired_before
            ):
                return False
            self.hosts[host_id] = current.model_copy(
                update={"healthy": False, "version": current.version + 1}
            )
            return True

    def admit(self, host_id: str, admission: Admission) -> None:
        self._update_existing(host_id, admitted=admission)

    def request_drain(self, host_id: str, drain: bool) -> None:
        self._update_existing(host_id, drain_requested=drain)

    def add_gpu_faults(self, host_id: str, faults: Mapping[str, GpuFault]) -> HostRecord:
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            new = {g: f for g, f in faults.items() if g not in current.gpu_faults}
            if new:
                self._update_existing(host_id, gpu_faults={**current.gpu_faults, **new})
            return self.hosts[host_id]

    def set_gpu_warnings(self, host_id: str, warnings: Mapping[str, GpuFault]) -> None:
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            self.hosts[host_id] = current.model_copy(update={"gpu_warnings": dict(warnings)})

    def clear_gpu_fault(self, host_id: str, gpu_id: str) -> GpuFault | None:
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            fault = current.gpu_faults.get(gpu_id)
            if fault is None:
                return None
            self._update_existing(
                host_id,
                gpu_faults={g: f for g, f in current.gpu_faults.items() if g != gpu_id},
                cleared_faults=(*current.cleared_faults, fault.fault_id)[-CLEARED_KEPT:],
            )
            return fault

    def _update_existing(self, host_id: str, **update: Any) -> None:
        """Change a registered host and bump its version (the adapter's ``_update_existing``)."""
        with self.lock:
            current = self.hosts.get(host_id)
            if current is None:
                raise NotFound(f"host {host_id!r} is not registered")
            self.hosts[host_id] = current.model_copy(update={**update, "version": current.version + 1})


class FakePlacements:
    """The placement transaction over a FakeJobs and a FakeHosts: every condition checked under both
    locks before anything is written, then all of it written (DynamoDB's all-or-nothing)."""

    def __init__(self, jobs: FakeJobs, hosts: FakeHosts) -> None:
        self.jobs = jobs
        self.hosts = hosts

    def place(self, job: Job, event: JobEvent, attempt: str, holds: Any) -> None:
        self.place_many([PlacementWrite(job, event, attempt, holds)])

    def place_many(self, writes: Sequence[PlacementWrite]) -> None:
        check_placement_group([w.holds for w in writes])
        if len({w.job.id for w in writes}) != len(writes):
            raise ValueError("a placement group names each job once")
        for w in writes:
            if self.jobs.before_save is not None:
                hook, self.jobs.before_save = self.jobs.before_save, None
                hook(w.job)
        with self.hosts.lock, self.jobs.table.lock:
            updated: dict[str, HostRecord] = {}
            for w in writes:
                stored = self.jobs.jobs.get(w.job.id)
                if stored is None or stored.version != w.job.version - 1:
                    raise Conflict("version moved")
                for h in w.holds:
                    current = updated.get(h.host_id) or self.hosts.hosts.get(h.host_id)
                    if current is None:
                        raise Conflict(f"host {h.host_id!r} is not registered")
                    if (
                        not h.gpu_ids
                        or len(set(h.gpu_ids)) != len(h.gpu_ids)
                        or w.attempt in current.holds
                        or not set(h.gpu_ids) <= set(current.free_gpu_ids)
                    ):
                        raise Conflict(f"GPUs {list(h.gpu_ids)} of {h.host_id!r} are not all free")
                    hold = Hold(gpu_ids=h.gpu_ids, cpu=h.cpu, memory_gib=h.memory_gib, at=h.at)
                    version = self.hosts.hosts[h.host_id].version + 1  # one update per host
                    updated[h.host_id] = current.model_copy(
                        update={"holds": {**current.holds, w.attempt: hold}, "version": version}
                    )
            self.hosts.hosts.update(updated)
            for w in writes:
                self.jobs.jobs[w.job.id] = w.job
                self.jobs.history[w.job.id].append(w.event)


class FakeDocuments:
    """Versioned documents; a put wins only against the version it read, as the DynamoDB one."""

    def __init__(self) -> None:
        self.versions: dict[str, list[StoredDocument]] = {}
        self.lock = threading.RLock()

    def current(self, kind: str) -> StoredDocument | None:
        found = self.versions.get(kind)
        return found[-1] if found else None

    def version(self, kind: str, version: int) -> StoredDocument | None:
        found = self.versions.get(kind, [])
        return found[version - 1] if 1 <= version <= len(found) else None

    def put(
        self, kind: str, document: object, expected_version: int, at: datetime, by: str
    ) -> StoredDocument:
        with self.lock:
            found = self.versions.setdefault(kind, [])
            if len(found) != expected_version:
                raise Conflict(f"the {kind} is no longer at version {expected_version}")
            doc = StoredDocument(
                kind=kind,
                version=expected_version + 1,
                document=copy.deepcopy(document),
                updated_at=at,
                updated_by=by,
            )
            found.append(doc)
            return doc


class FakeUsage:
    """The usage ledger: the DynamoDB one's write rules on a dict."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str, str, int], AttemptUsage] = {}
        self.lock = threading.RLock()

    def record(self, usage: AttemptUsage) -> bool:
        key = (usage.tenant, usage.month, usage.job_id, usage.attempt)
        with self.lock:
            old = self.records.get(key)
            if old is not None:
                if usage.final and old.final and old.seconds > usage.seconds:
                    return False
                if not usage.final and (old.final or old.seconds >= usage.seconds):
                    return False
            self.records[key] = usage
            return True

    def month(self, tenant: str, month: str) -> list[AttemptUsage]:
        with self.lock:
            return [u for (t, m, _, _), u in sorted(self.records.items()) if t == tenant and m == month]


class FakeTenants:
    def __init__(self, table: FakeTenantTable | None = None) -> None:
        self.table = table if table is not None else FakeTenantTable()
        #: Reads of the tenant record by method (each one GetItem on DynamoDB).
        self.reads: Counter[str] = Counter()

    def member(self, principal: str) -> Member | None:
        item = self.table.items.get("PRINCIPAL#" + principal)
        if item is None:
            return None
        return Member(principal, item["tenant"], Role(item["role"]), item.get("unique_id"))

    def put_member(self, principal: str, tenant: str, role: str, unique_id: str | None = None) -> None:
        principal = canonical_principal(principal)
        with self.table.lock:
            self.table.items["PRINCIPAL#" + principal] = {
                "tenant": tenant,
                "role": str(Role(role)),
                "unique_id": unique_id,
            }
            if Role(role) is not Role.HOST:
                self.table.items.setdefault("TENANT#" + tenant, {"tenant": tenant, "directory": "T"})

    def record(self, tenant: str) -> TenantRecord:
        self.reads["record"] += 1
        return TenantRecord(quota=self._quota(tenant), grants=self._grants(tenant))

    def quota(self, tenant: str) -> Quota | None:
        self.reads["quota"] += 1
        return self._quota(tenant)

    def _quota(self, tenant: str) -> Quota | None:
        item = self.table.items.get("TENANT#" + tenant)
        if item is None or item.get("quota") is None:
            return None
        return Quota.model_validate(copy.deepcopy(item["quota"]))

    def put_quota(self, tenant: str, quota: Quota) -> None:
        with self.table.lock:
            item = self.table.tenant_item(tenant)
            item["quota"] = quota.model_dump(mode="json")

    def tenant_exists(self, tenant: str) -> bool:
        return "TENANT#" + tenant in self.table.items

    def grants(self, tenant: str) -> DataGrants:
        self.reads["grants"] += 1
        return self._grants(tenant)

    def _grants(self, tenant: str) -> DataGrants:
        item = self.table.items.get("TENANT#" + tenant, {})
        return DataGrants.model_validate(item["grants"]) if item.get("grants") else DataGrants()

    def put_grants(self, tenant: str, grants: DataGrants) -> None:
        with self.table.lock:
            self.table.tenant_item(tenant)["grants"] = grants.model_dump(mode="json")

    def dataset(self, name: str) -> Dataset | None:
        item = self.table.items.get("DATASET#" + name)
        return None if item is None else Dataset.model_validate(item["dataset"])

    def put_dataset(self, name: str, dataset: Dataset) -> None:
        with self.table.lock:
            self.table.items.setdefault("DATASET#" + name, {})["dataset"] = dataset.model_dump(mode="json")


class FakeBundles:
    """Bundles as S3 would hold them: per tenant key, with the SHA-256 S3 verified at upload."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], bytes] = {}
        self.referenced: set[tuple[str, str]] = set()

    def exists(self, tenant: str, digest: str) -> bool:
        return (tenant, digest) in self.stored

    def upload_ticket(self, tenant: str, digest: str, size: int) -> UploadTicket:
        return UploadTicket(f"fake://{tenant}/{digest}", "PUT", {"Content-Length": str(size)}, 900)

    def mark_referenced(self, tenant: str, digest: str) -> None:
        self.referenced.add((tenant, digest))


class FakeCheckpointStore:
    """The data bucket's objects as a listing sees them: key -> (size, LastModified, whole seconds
    as S3 gives them); ``fail``: every read raises, as S3 unreachable does through the adapter."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[int, datetime]] = {}
        self.fail = False
        self.reads: list[str] = []

    def put(self, key: str, size: int, at: datetime | None = None) -> None:
        self.objects[key] = (size, (at or datetime.now(UTC)).replace(microsecond=0))

    def last_checkpoint(self, prefix: str) -> Any:
        from berth.domain.errors import StoreUnavailable
        from berth.domain.workflow import CheckpointInfo

        self.reads.append(prefix)
        if self.fail:
            raise StoreUnavailable("data store unavailable (EndpointConnectionError)")
        found = [v for k, v in self.objects.items() if k.startswith(prefix)]
        if not found:
            return None
        return CheckpointInfo(at=max(at for _, at in found), size_bytes=sum(size for size, _ in found))


class FakeSecrets:
    def __init__(self, names: set[str] | None = None) -> None:
        self.names = set(names or ())

    def exists(self, name: str) -> bool:
        return name in self.names


def fake_store() -> tuple[FakeJobs, FakeTenants]:
    """A job and a tenant repository over one tenant table, as the DynamoDB pair shares one."""
    table = FakeTenantTable()
    return FakeJobs(table), FakeTenants(table)


class FakeMetrics:
    """The JobMetrics table: one sample per (job, attempt, epoch ms, host), so a batch stored twice
    is kept once, as the DynamoDB sort key does."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, int, int, str], tuple[StoredSample, int]] = {}

    def put(
        self, job_id: str, attempt: int, host_id: str, samples: list[MetricSample], expires_at: int
    ) -> None:
        for s in samples:
            key = (job_id, attempt, int(s.at.timestamp() * 1000), host_id)
            self.items[key] = (StoredSample(attempt=attempt, host_id=host_id, sample=s), expires_at)

    def samples(self, job_id: str, attempt: int, limit: int) -> list[StoredSample]:
        keys = sorted(k for k in self.items if k[0] == job_id and k[1] == attempt)
        return [self.items[k][0] for k in keys[-limit:]] if limit > 0 else []


class FakeLogReader:
    """CloudWatch Logs streams in memory; tokens name their stream and position (not MAC'd: the real
    reader's MAC is tested against CloudWatch on moto)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], list[tuple[int, str]]] = {}

    def write(self, group: str, stream: str, at_ms: int, message: str) -> None:
        self.streams.setdefault((group, stream), []).append((at_ms, message))

    def read(
        self,
        group: str,
        stream: str,
        start_ms: int | None,
        next_token: str | None,
        limit: int,
        max_bytes: int = LOG_PAGE_BUDGET_BYTES,
    ) -> LogPage:
        start = 0
        if next_token is not None:
            g, s, since, pos = _parse_fake_token(next_token)
            if (g, s) != (group, stream):
                raise InvalidRequest("next_token belongs to another job or attempt")
            start_ms, start = since, pos
        events = self.streams.get((group, stream))
        if events is None:
            return LogPage(events=[], next_token=None)
        selected = sorted((e for e in events if start_ms is None or e[0] >= start_ms), key=lambda e: e[0])
        page = fit_page(
            [
                LogEvent(at=datetime.fromtimestamp(ms / 1000, UTC), message=m)
                for ms, m in selected[start : start + limit]
            ],
            max_bytes,
        )
        token = f"{group}|{stream}|{'' if start_ms is None else start_ms}|{start + len(page)}"
        return LogPage(events=page, next_token=token)


def _parse_fake_token(token: str) -> tuple[str, str, int | None, int]:
    try:
        g, s, since, pos = token.split("|")
        return g, s, int(since) if since else None, int(pos)
    except ValueError as exc:
        raise InvalidRequest("next_token is not valid") from exc


class FakeCircuits:
    """The circuits store: the same pure update (``record_circuit_event``) as the DynamoDB one."""

    def __init__(self) -> None:
        self.circuits: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def _record(self, region: str, instance_type: str, at: float, failed: bool) -> None:
        from berth.domain.cloud import record_circuit_event

        new = record_circuit_event(self.circuits, region, instance_type, at, failed)
        if new is not None:
            self.circuits = new
            self.writes += 1

    def record_failure(self, region: str, instance_type: str, at: float) -> None:
        self._record(region, instance_type, at, True)

    def record_success(self, region: str, instance_type: str, at: float) -> None:
        self._record(region, instance_type, at, False)

    def reset(self, region: str, instance_type: str | None) -> list[tuple[str, str]]:
        from berth.domain.cloud import reset_circuit_records

        kept, gone = reset_circuit_records(self.circuits, region, instance_type)
        found = [(self.circuits[k]["region"], self.circuits[k]["instance_type"]) for k in gone]
        if gone:
            self.circuits = kept
            self.writes += 1
        return found

    def list(self) -> list[Any]:
        from berth.domain.ports import CircuitEntry

        return [
            CircuitEntry(
                region=v["region"],
                instance_type=v["instance_type"],
                failures=tuple(v["failures"]),
                last_success_at=v["last_success_at"],
            )
            for _, v in sorted(self.circuits.items())
        ]


class FakeRuntimeHistory:
    """Run-time histories per tenant: the same read-change-write as the DynamoDB one, versioned."""

    def __init__(self) -> None:
        self.documents: dict[str, tuple[int, dict[str, Any]]] = {}
        self.fail_writes = False

    def update(self, tenant: str, change: Any) -> None:
        from berth.domain.errors import StoreUnavailable

        if self.fail_writes:
            raise StoreUnavailable("run-time history unavailable")
        version, current = self.documents.get(tenant, (0, None))
        new = change(None if current is None else copy.deepcopy(current))
        # A writer that got in between (``change`` may write): apply again on what it wrote.
        if self.documents.get(tenant, (0, None))[0] != version:
            self.update(tenant, change)
            return
        self.documents[tenant] = (version + 1, copy.deepcopy(new))

    def read(self, tenants: Any) -> dict[str, dict[str, Any]]:
        return {t: copy.deepcopy(self.documents[t][1]) for t in set(tenants) if t in self.documents}


class FakeBatch:
    """AWS Batch as the gateway sees it: jobs by id, names, statuses; faults on demand."""

    def __init__(self) -> None:
        from berth.domain.cloud import BatchJob, BatchSubmission

        self.jobs: dict[str, BatchJob] = {}
        self.queues: dict[str, str] = {}  # job id -> queue
        self.submitted: list[BatchSubmission] = []
        self.terminated: list[tuple[str, str]] = []
        self.throttle_next = 0
        self.down: set[str] = set()
        self.lookups = 0
        self.describes: list[tuple[str, tuple[str, ...]]] = []  # (region, ids) of each DescribeJobs

    def _check(self, region: str) -> None:
        from berth.domain.cloud import CloudThrottled, CloudUnavailable

        if region in self.down:
            raise CloudUnavailable(f"Batch in {region}: ServiceUnavailable", region)
        if self.throttle_next > 0:
            self.throttle_next -= 1
            raise CloudThrottled(f"Batch in {region}: TooManyRequestsException", region)

    def submit(self, request: Any) -> str:
        from berth.domain.cloud import BatchJob, BatchStatus

        self._check(request.region)
        job_id = f"batch-{len(self.submitted) + 1}"
        self.submitted.append(request)
        self.jobs[job_id] = BatchJob(job_id, request.name, BatchStatus.SUBMITTED)
        self.queues[job_id] = request.queue
        for k in range(request.array_size):  # an array job's children: ``<parent>:<k>``, its name
            self.jobs[f"{job_id}:{k}"] = BatchJob(f"{job_id}:{k}", request.name, BatchStatus.SUBMITTED)
            self.queues[f"{job_id}:{k}"] = request.queue
        return job_id

    def find(self, region: str, queue: str, name: str) -> list[Any]:
        self._check(region)
        self.lookups += 1
        # As ListJobs without arrayJobId: an array job, never its children
        return [
            j for i, j in self.jobs.items() if j.name == name and self.queues.get(i) == queue and ":" not in i
        ]

    def describe(self, region: str, batch_job_ids: list[str]) -> list[Any]:
        self._check(region)
        self.describes.append((region, tuple(batch_job_ids)))
        return [self.jobs[i] for i in batch_job_ids if i in self.jobs]

    def terminate(self, region: str, batch_job_id: str, reason: str, tenant: str) -> None:
        from berth.domain.cloud import BatchStatus

        self._check(region)
        self.terminated.append((batch_job_id, reason))
        job = self.jobs.get(batch_job_id)
        if job is not None and not job.status.is_terminal:
            self.set(batch_job_id, BatchStatus.FAILED, reason=reason)

    def set(
        self,
        batch_job_id: str,
        status: Any,
        reason: str = "",
        exit_code: int | None = None,
        log_stream: str | None = None,
        started_at: Any = None,
        stopped_at: Any = None,
    ) -> None:
        """A state change; ``log_stream`` (container.logStreamName) once given stays, as on Batch;
        so do ``started_at`` and ``stopped_at`` (startedAt, stoppedAt) once given."""
        import dataclasses

        old = self.jobs[batch_job_id]
        self.jobs[batch_job_id] = dataclasses.replace(
            old,
            status=status,
            status_reason=reason,
            exit_code=exit_code,
            log_stream=log_stream or old.log_stream,
            started_at=started_at or old.started_at,
            stopped_at=stopped_at or old.stopped_at,
        )


class FakeSubmitQueue:
    """A FIFO queue with SQS's deduplication: a request with a dedup id already sent is dropped."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.seen: set[str] = set()
        #: The dedup ids of the requests sent ``first`` (the dispatch's own sends).
        self.firsts: set[str] = set()

    def send(self, request: Any, first: bool = False) -> None:
        if request.dedup_id in self.seen:
            return
        self.seen.add(request.dedup_id)
        self.messages.append(request)
        if first:
            self.firsts.add(request.dedup_id)

    def take(self) -> list[Any]:
        out, self.messages = self.messages, []
        return out


class FakeQueueSummaries:
    """Queue summaries per tenant, as the DynamoDB one keeps them (through its item form)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.fail_writes = False

    def put(self, summary: Any) -> None:
        from berth.domain.errors import StoreUnavailable

        if self.fail_writes:
            raise StoreUnavailable("queue summaries unavailable")
        self.writes += 1
        self.items[summary.tenant] = copy.deepcopy(summary.to_item())

    def get(self, tenant: str) -> Any:
        from berth.domain.queue_summary import QueueSummary

        item = self.items.get(tenant)
        return None if item is None else QueueSummary.from_item(tenant, item)
