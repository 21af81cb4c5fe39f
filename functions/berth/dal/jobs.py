"""DynamoDB job repository (pynamodb). Every write is conditional on the stored version."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Protocol

from pynamodb.connection import Connection
from pynamodb.transactions import TransactWrite

from berth.dal.arrays import counter_move
from berth.dal.claims import configured_claims, read_claim
from berth.dal.errors import failed_conditions, translated
from berth.dal.models import (
    QUEUE_PROJECTION,
    JobEventRow,
    JobRow,
    array_counter_model,
    claim_model,
    event_model,
    host_model,
    job_model,
    tenant_model,
)
from berth.dal.page_tokens import DynamoSigningKey, PageTokenCodec
from berth.dal.tenants import DIRECTORY, TENANT
from berth.dal.usage import DynamoUsageLedger
from berth.domain.cost import AttemptUsage
from berth.domain.errors import AlreadySubmitted, Conflict, InvalidRequest, QuotaExceeded, StoreUnavailable
from berth.domain.fleet import HoldRelease
from berth.domain.idempotency import SubmitClaim
from berth.domain.job import Job, JobEvent, iso
from berth.domain.job_spec import JobSpec
from berth.domain.placement import Site
from berth.domain.ports import Page, QueueHead
from berth.domain.queue import (
    QUEUE_SHARDS,
    QueueEntry,
    entry_document,
    entry_from_document,
    queue_entry,
    queue_partition,
    queue_shard,
    queue_sort_key,
)
from berth.domain.run_observation import observation_of
from berth.domain.status import JobStatus
from berth.domain.workflow import RunState


class ArrayReader(Protocol):
    def get_many(self, array_ids: list[str]) -> list[Any]: ...


_CREATED_KEY = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z#j-[0-9a-z]{26}")


def _tenant_status(tenant: str, status: JobStatus) -> str:
    return f"{tenant}#{status}"


def _created_key(job: Job) -> str:
    return f"{iso(job.created_at)}#{job.id}"


#: Statuses in which a job holds capacity (the sparse ``by_placed`` index).
PLACED = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELING})
#: Where ``save``'s usage record sits in its transaction (pynamodb sends puts first: job, event, usage).
USAGE_ITEM = 2
#: BatchGetItem takes at most this many keys per call.
BATCH_GET_KEYS = 100
#: Rounds of BatchGetItem for the keys DynamoDB left unprocessed (throttled) before giving up.
BATCH_GET_ROUNDS = 8


class DynamoJobRepository:
    def __init__(
        self,
        jobs_table: str,
        events_table: str,
        tenants_table: str,
        idempotency_table: str | None = None,
        tokens: PageTokenCodec | None = None,
        arrays: ArrayReader | None = None,
        shards: int = QUEUE_SHARDS,
        sleep: Callable[[float], None] = time.sleep,
        usage: DynamoUsageLedger | None = None,
        hosts_table: str | None = None,
    ) -> None:
        self._arrays = arrays
        self._usage = usage
        #: The hosts, whose ended attempts' holds ``save`` gives back in the job's own transaction.
        self._Host = None if hosts_table is None else host_model(hosts_table)
        self._shards = shards
        self._sleep = sleep
        self._jobs_table = jobs_table
        self._Job = job_model(jobs_table)
        self._Event = event_model(events_table)
        self._Tenant = tenant_model(tenants_table)
        self._Counter = array_counter_model(jobs_table)
        self._Claim = None if idempotency_table is None else claim_model(idempotency_table)
        self._tokens = tokens or PageTokenCodec(DynamoSigningKey(tenants_table))
        self._conn = Connection()

    # -- mapping -------------------------------------------------------------------------------
    def _row(self, job: Job) -> JobRow:
        return self._Job(
            job_id=job.id,
            tenant=None if job.spec.array_task else job.tenant,
            task_tenant=job.tenant if job.spec.array_task else None,
            tenant_status=_tenant_status(job.tenant, job.status),
            created_key=_created_key(job),
            owner=job.owner,
            actor=job.actor,
            status=str(job.status),
            reason=job.reason,
            spec=job.spec.model_dump(mode="json", exclude_none=True),
            created_at=job.created_at,
            updated_at=job.updated_at,
            site=None if job.site is None else str(job.site),
            placement=None if job.placement is None else job.placement.model_dump(mode="json"),
            attempts=job.attempts,
            cost_usd=job.cost_usd,
            version=job.version,
            run=job.run.model_dump(mode="json", exclude_defaults=True) or None,
            **self._index_keys(job),
        )

    def job_of(self, row: JobRow) -> Job:
        return self._job(row)

    def row_of(self, job: Job) -> JobRow:
        return self._row(job)

    def event_row_of(self, event: JobEvent, job: Job) -> JobEventRow:
        return self._event_row(event, job)

    def _index_keys(self, job: Job) -> dict[str, Any]:
        """The sparse indexes' attributes: the queue entry while QUEUED, the placed status while the
        job holds capacity; absent otherwise (so the item leaves the index in the same write)."""
        if job.status is JobStatus.QUEUED:
            entry = queue_entry(job)
            return {
                "queue_pk": queue_partition(job.tenant, queue_shard(job.id, self._shards)),
                "queue_sk": queue_sort_key(job),
                "queue_entry": entry_document(entry),
            }
        if job.status in PLACED:
            return {"placed_status": str(job.status)}
        return {}

    @staticmethod
    def _job(row: JobRow) -> Job:
        return Job(
            id=row.job_id,
            tenant=row.tenant or row.task_tenant,
            owner=row.owner,
            actor=row.actor,
            status=JobStatus(row.status),
            reason=row.reason,
            spec=JobSpec.model_validate(row.spec),
            created_at=row.created_at,
            updated_at=row.updated_at,
            site=None if row.site is None else Site(row.site),
            placement=row.placement,  # validated into the typed record by Job
            attempts=int(row.attempts),
            cost_usd=float(row.cost_usd),
            version=int(row.version),
            run=RunState.model_validate(row.run or {}),
        )

    def _event_row(self, event: JobEvent, job: Job) -> JobEventRow:
        run = observation_of(job, event)  # COMPLETED rows only: the stream's consumer learns it
        return self._Event(
            job_id=event.job_id,
            seq=event.seq,
            at=event.at,
            from_status=None if event.from_ is None else str(event.from_),
            to_status=str(event.to),
            reason=event.reason,
            detail=job.notification(event),
            run_observation=None if run is None else run.to_dict(),
        )

    # -- writes --------------------------------------------------------------------------------
    def create(self, job: Job, event: JobEvent, max_active: int, claim: SubmitClaim | None = None) -> None:
        """The job, its first event, the tenant's active-job counter and the idempotency claim (if
        any) move together; the counter's condition makes the quota hold under concurrent submits,
        the claim's makes a retried keyed submit find its job instead of creating another."""
        counter = self._Tenant.active_jobs
        try:
            with translated(f"create job {job.id}"), TransactWrite(connection=self._conn) as tx:
                tx.save(self._row(job), condition=self._Job.job_id.does_not_exist())
                tx.save(self._event_row(event, job), condition=self._Event.job_id.does_not_exist())
                tx.update(
                    self._Tenant(TENANT + job.tenant),
                    # the directory key is set once per tenant (the same value after that: no index write)
                    actions=[counter.add(1), self._Tenant.directory.set(DIRECTORY)],
                    condition=counter.does_not_exist() | (counter < max_active),
                )
                if claim is not None:
                    Claim = configured_claims(self._Claim)
                    expires = int(claim.expires_at.timestamp())
                    now = int(job.created_at.timestamp())
                    tx.save(
                        Claim(claim.key, job_id=job.id, fingerprint=claim.fingerprint, expiration=expires),
                        # An expired claim (TTL deletion lags) may be taken over.
                        condition=Claim.id.does_not_exist() | (Claim.expiration < now),
                    )
        except Conflict as exc:
            # pynamodb sends puts before updates: job, event, [claim], counter.
            failed = failed_conditions(exc)
            if claim is not None and 2 in failed:
                held = read_claim(self._Claim, claim.key)
                if held is not None:
                    raise AlreadySubmitted(held[0], held[1]) from exc
            if (3 if claim is not None else 2) in failed:
                raise QuotaExceeded(
                    f"tenant {job.tenant!r} is at its max_active_jobs ({max_active})"
                ) from exc
            raise

    def save(
        self,
        job: Job,
        event: JobEvent,
        usage: AttemptUsage | None = None,
        releases: tuple[HoldRelease, ...] = (),
    ) -> None:
        if usage is not None and self._usage is None:
            raise ValueError("this job repository has no usage ledger to record the attempt's usage in")
        if releases and self._Host is None:
            raise ValueError("this job repository has no hosts table to give the attempt's GPUs back to")
        # Items whose own condition may fail without the job's write failing: a usage record of more
        # run time already stored (the ledger's rule keeps it), a hold already released. Each such
        # try drops what failed and writes the rest; the job's own condition failing is a Conflict.
        for _ in range(2 + len(releases)):
            try:
                with translated(f"update job {job.id}"), TransactWrite(connection=self._conn) as tx:
                    self.add_save(tx, job, event)  # puts first: the job (0), its event (1)
                    if usage is not None and self._usage is not None:
                        self._usage.add_record(tx, usage)  # (2)
                    first = _items_in(tx)  # the releases are the last updates
                    for r in releases:
                        self._add_release(tx, r)
                return
            except Conflict as exc:
                failed = failed_conditions(exc)
                gone = {releases[i - first] for i in failed if first <= i < first + len(releases)}
                usage_kept = usage is not None and USAGE_ITEM in failed
                if not gone and not usage_kept:
                    raise
                releases = tuple(r for r in releases if r not in gone)
                usage = None if usage_kept else usage
        raise Conflict(f"job {job.id}: its write kept failing")

    def _add_release(self, tx: TransactWrite, release: HoldRelease) -> None:
        """The hold's GPUs back to the host's free set, the hold gone: only while it is still there."""
        R = self._Host
        assert R is not None
        tx.update(
            R(release.host_id),
            actions=[
                R.free_gpu_ids.add(set(release.gpu_ids)),
                R.holds[release.attempt].remove(),
                R.version.add(1),
            ],
            condition=R.holds[release.attempt].exists(),
        )

    def add_save(self, tx: TransactWrite, job: Job, event: JobEvent) -> None:
        """``save``'s items (the job under its version, its event, the tenant's counter when it ends)
        added to the transaction ``tx``."""
        tx.save(self._row(job), condition=self._Job.version == job.version - 1)
        tx.save(self._event_row(event, job), condition=self._Event.job_id.does_not_exist())
        if event.from_ is not None and event.from_.is_active and job.status.is_terminal:
            tx.update(self._Tenant(TENANT + job.tenant), actions=[self._Tenant.active_jobs.add(-1)])
        task = job.spec.array_task
        if task is not None and event.from_ is not None and event.from_ is not job.status:
            # The array's counts move with the task, in the same transaction (dal/arrays.py).
            counter_move(tx, self._Counter, task.array_id, task.index, event.from_, job.status)

    def update(self, job: Job) -> None:
        """Store a new version of the job without a status change (no event), conditional on the
        stored version being the one before."""
        with translated(f"update job {job.id}"):
            self._row(job).save(condition=self._Job.version == job.version - 1)

    # -- reads ---------------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with translated(f"read job {job_id}"):
            try:
                row = self._Job.get(job_id, consistent_read=True)
            except self._Job.DoesNotExist:
                return None
        # An array's parent shares the table and has no status (dal/arrays.py reads it).
        return None if row.status is None else self._job(row)

    def events(self, job_id: str) -> list[JobEvent]:
        with translated(f"read events of {job_id}"):
            return [
                JobEvent(
                    job_id=r.job_id,
                    seq=int(r.seq),
                    at=r.at,
                    from_=None if r.from_status is None else JobStatus(r.from_status),
                    to=JobStatus(r.to_status),
                    reason=r.reason,
                )
                for r in self._Event.query(job_id, consistent_read=True, scan_index_forward=True)
            ]

    def list_for_tenant(
        self,
        tenant: str,
        status: JobStatus | None,
        limit: int,
        next_token: str | None,
        since: datetime | None = None,
    ) -> Page:
        start = self._decode_token(next_token, tenant, status) if next_token else None
        index, partition = self._listing_index(tenant, status)
        # ``since`` is a key condition: the sort key starts with the creation time.
        floor = None if since is None else self._Job.created_key >= iso(since)
        with translated(f"list jobs of {tenant}"):
            result = index.query(
                partition,
                range_key_condition=floor,
                scan_index_forward=False,
                limit=limit,
                last_evaluated_key=start,
            )
            ids = [r.job_id for r in result]
            last = result.last_evaluated_key
        jobs = self._listed(ids, status, tenant)
        return Page(jobs=jobs, next_token=self._encode_token(last, tenant, status) if last else None)

    def list_all_tenants(
        self, status: JobStatus | None, limit: int, next_token: str | None, since: datetime | None = None
    ) -> Page:
        """Every tenant's jobs, newest first: the first ``limit`` keys of each tenant's index (one
        Query per tenant in the directory), merged. The token is the last key shown; the next page
        asks each tenant for keys older than it (the keys are unique: nothing shown twice or missed)."""
        before = _check_all_token(self._tokens.decode(next_token), status) if next_token else None
        low = None if since is None else iso(since)
        heads: list[tuple[str, str]] = []
        more = False
        with translated("list jobs of every tenant"):
            tenants = [r.pk.removeprefix(TENANT) for r in self._Tenant.by_directory.query(DIRECTORY)]  # type: ignore[attr-defined]
            for tenant in tenants:
                index, partition = self._listing_index(tenant, status)
                key = self._Job.created_key
                cond: Any
                if before is not None:
                    cond = key.between(low, before) if low is not None else key <= before
                else:
                    cond = None if low is None else key >= low
                result = index.query(
                    partition, range_key_condition=cond, scan_index_forward=False, limit=limit + 1
                )
                rows = [(r.created_key, r.job_id) for r in result if r.created_key != before]
                more = more or len(rows) > limit or result.last_evaluated_key is not None
                heads.extend(rows[:limit])
        heads.sort(reverse=True)
        page, more = heads[:limit], more or len(heads) > limit
        token = None
        if more and page:
            token = self._tokens.encode(
                {"a": 1, "s": None if status is None else str(status), "b": page[-1][0]}
            )
        return Page(jobs=self._listed([i for _, i in page], status, None), next_token=token)

    def _listing_index(self, tenant: str, status: JobStatus | None) -> tuple[Any, str]:
        if status is None:
            return self._Job.by_tenant, tenant  # type: ignore[attr-defined]
        return self._Job.by_tenant_status, _tenant_status(tenant, status)  # type: ignore[attr-defined]

    def _listed(self, ids: list[str], status: JobStatus | None, tenant: str | None) -> list[Any]:
        """The jobs (and arrays) of a listing's keys, in their order (``tenant`` None: any tenant's).

        The indexes hold keys only: the page's items in one BatchGetItem (a job that ended or moved
        meanwhile shows as it is now; one deleted meanwhile is left out). Strongly consistent: an item
        the index already lists is never missed by an eventually consistent read that lags it."""
        found = self.get_many(ids)
        # An array is one row of its tenant's listing (its parent has no status, so get_many leaves
        # it out; its tasks are not in by_tenant); its counts come with it.
        parents = [i for i in ids if i not in found] if status is None else []
        arrays = {a.id: a for a in self._arrays.get_many(parents)} if parents and self._arrays else {}
        jobs: list[Any] = []
        for i in ids:
            if i in found and tenant in (None, found[i].tenant):
                if status is None or found[i].status is status:
                    jobs.append(found[i])
            elif i in arrays and tenant in (None, arrays[i].tenant):
                jobs.append(arrays[i])
        return jobs

    def list_placed(self, status: JobStatus) -> list[Job]:
        if status not in PLACED:
            raise ValueError(f"{status} jobs hold no capacity; by_placed does not index them")
        with translated(f"list {status} jobs"):
            # pynamodb follows LastEvaluatedKey to the end: every placed job, no cap.
            result = self._Job.by_placed.query(str(status), scan_index_forward=True)  # type: ignore[attr-defined]
            return [self._job(r) for r in result]

    def queued_tenants(self) -> dict[str, int]:
        Tenant = self._Tenant
        with translated("list tenants"):
            keys = [r.pk for r in Tenant.by_directory.query(DIRECTORY)]  # type: ignore[attr-defined]
            counts: dict[str, int] = {}
            for row in Tenant.batch_get(keys, attributes_to_get=["pk", "active_jobs"]):
                active = int(row.active_jobs or 0)
                if active > 0:
                    counts[row.pk.removeprefix(TENANT)] = active
        return dict(sorted(counts.items()))

    def queue_head(self, tenant: str, limit: int) -> QueueHead:
        """One Query per shard for its first ``limit`` entries; the tenant's first ``limit`` are among
        them, merged in queue order."""
        entries: list[QueueEntry] = []
        more = False
        with translated(f"read the queue of {tenant}"):
            for shard in range(self._shards):
                result = self._Job.by_queue.query(  # type: ignore[attr-defined]
                    queue_partition(tenant, shard),
                    scan_index_forward=True,
                    limit=limit,
                    attributes_to_get=["job_id", "queue_pk", "queue_sk", *QUEUE_PROJECTION],
                )
                rows = list(result)
                more = more or result.last_evaluated_key is not None
                entries.extend(
                    entry_from_document(r.job_id, tenant, int(r.version), r.reason, r.queue_entry)
                    for r in rows
                )
        entries.sort(key=lambda e: e.sort_key)
        return QueueHead(entries=entries[:limit], more=more or len(entries) > limit)

    def get_many(self, job_ids: Iterable[str], consistent: bool = True) -> dict[str, Job]:
        """BatchGetItem, 100 keys a call; keys DynamoDB leaves unprocessed (throttling) are asked for
        again with a growing pause, at most ``BATCH_GET_ROUNDS`` times, then StoreUnavailable."""
        ids = list(dict.fromkeys(job_ids))
        found: dict[str, Job] = {}
        conn = self._Job._get_connection()
        for i in range(0, len(ids), BATCH_GET_KEYS):
            pending: list[str] = ids[i : i + BATCH_GET_KEYS]
            for attempt in range(BATCH_GET_ROUNDS):
                with translated("read jobs"):
                    # pynamodb's typing says str; its connection takes {attribute: value} maps
                    keys: list[Any] = [{"job_id": k} for k in pending]
                    data = conn.batch_get_item(keys, consistent_read=consistent)
                for raw in data.get("Responses", {}).get(self._jobs_table, []):
                    row = self._Job.from_raw_data(raw)
                    if row.status is None:
                        continue  # an array's parent (dal/arrays.py reads it)
                    job = self._job(row)
                    found[job.id] = job
                left = data.get("UnprocessedKeys", {}).get(self._jobs_table, {}).get("Keys", [])
                pending = [k["job_id"]["S"] for k in left]
                if not pending:
                    break
                self._sleep(min(1.0, 0.05 * 2**attempt))
            else:
                raise StoreUnavailable(f"read jobs: {len(pending)} keys left unprocessed (throttled)")
        return found

    def set_reason(self, entry: QueueEntry, reason: str) -> None:
        """One UpdateItem of ``reason`` only: the version stays (no other writer's state is at stake;
        a concurrent status change wins), and no index but ``by_queue`` (a small entry) is written."""
        Job = self._Job
        with translated(f"update reason of {entry.job_id}"):
            Job(entry.job_id).update(
                actions=[Job.reason.set(reason)],
                condition=(Job.version == entry.version) & (Job.status == str(JobStatus.QUEUED)),
            )

    def count_active(self, tenant: str) -> int:
        with translated(f"count active jobs of {tenant}"):
            try:
                row = self._Tenant.get(TENANT + tenant, consistent_read=True)
            except self._Tenant.DoesNotExist:
                return 0
        return int(row.active_jobs or 0)

    # Pagination tokens are signed and expire (PageTokenCodec), and are bound to the tenant and filter
    # that produced them, so a token can never be replayed to read another tenant's index partition.
    def _encode_token(self, key: dict[str, Any], tenant: str, status: JobStatus | None) -> str:
        return self._tokens.encode({"t": tenant, "s": None if status is None else str(status), "k": key})

    def _decode_token(self, token: str, tenant: str, status: JobStatus | None) -> dict[str, Any]:
        return _check_token(self._tokens.decode(token), tenant, status)


def _items_in(tx: TransactWrite) -> int:
    """How many items ``tx`` holds so far. pynamodb sends them as condition checks, deletes, puts,
    then updates, each in the order added, so an update added now has this index in the request
    (and in a cancellation's reasons)."""
    return sum(
        len(items) for items in (tx._condition_check_items, tx._delete_items, tx._put_items, tx._update_items)
    )


def _check_all_token(data: dict[str, Any], status: JobStatus | None) -> str:
    """The last key an all-tenants page showed, from its token (bound to that query and status)."""
    boundary = data.get("b")
    if (
        data.get("a") != 1
        or data.get("s") != (None if status is None else str(status))
        or not isinstance(boundary, str)
        or not _CREATED_KEY.fullmatch(boundary)
    ):
        raise InvalidRequest("next_token is not valid for this query; start again without it")
    return boundary


def _check_token(data: dict[str, Any], tenant: str, status: JobStatus | None) -> dict[str, Any]:
    bad = InvalidRequest("next_token is not valid for this query; start again without it")
    if data.get("t") != tenant:
        raise bad
    if data.get("s") != (None if status is None else str(status)):
        raise bad
    key = data.get("k")
    if not isinstance(key, dict) or not all(
        isinstance(v, dict) and set(v) == {"S"} and isinstance(v["S"], str) and v["S"] for v in key.values()
    ):
        raise bad
    expected_hash = "tenant" if status is None else "tenant_status"
    expected_hash_val = tenant if status is None else _tenant_status(tenant, status)
    if set(key) != {"job_id", "created_key", expected_hash} or key[expected_hash]["S"] != expected_hash_val:
        raise bad
    if not _CREATED_KEY.fullmatch(key["created_key"]["S"]) or not key["created_key"]["S"].endswith(
        "#" + key["job_id"]["S"]
    ):
        raise bad
    return key
