"""DynamoDB store of job arrays (pynamodb): the parent, its parameter chunks and its sharded state
counters live in the Jobs table beside the tasks; the list of arrays with work left for the expander
is one item of the Tenants table. Layout: docs/workflow.md, "Job arrays"."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pynamodb.connection import Connection
from pynamodb.transactions import TransactWrite

from berth.dal.claims import configured_claims, read_claim
from berth.dal.errors import failed_conditions, translated
from berth.dal.models import (
    JobRow,
    array_chunk_model,
    array_counter_model,
    array_model,
    claim_model,
    event_model,
    job_model,
    pending_arrays_model,
    tenant_model,
)
from berth.dal.tenants import TENANT
from berth.domain.arrays import COUNTER_SHARDS, JobArray, counter_shard, counts_from_deltas, task_id
from berth.domain.errors import AlreadySubmitted, Conflict, QuotaExceeded
from berth.domain.idempotency import SubmitClaim
from berth.domain.job import Job, JobEvent, iso
from berth.domain.job_spec import JobSpec
from berth.domain.status import JobStatus

PENDING = "ARRAYS#PENDING"
#: One parameter chunk item stays well under DynamoDB's 400 KB item limit.
CHUNK_BYTES = 300_000
#: BatchGetItem's limit.
BATCH_GET = 100


def counter_key(array_id: str, shard: int) -> str:
    return f"{array_id}#c{shard}"


def chunk_key(array_id: str, k: int) -> str:
    return f"{array_id}#p{k}"


def counter_move(
    tx: TransactWrite, Counter: Any, array_id: str, index: int, frm: JobStatus, to: JobStatus
) -> None:
    """Add to ``tx`` the counter update of one task moving ``frm`` -> ``to``."""
    item = Counter(counter_key(array_id, counter_shard(index)))
    tx.update(item, actions=[getattr(Counter, str(frm)).add(-1), getattr(Counter, str(to)).add(1)])


def chunk_parameters(params: list[dict[str, Any]]) -> list[tuple[int, list[dict[str, Any]]]]:
    """``[(start index, entries)]``, each chunk at most ``CHUNK_BYTES`` of JSON."""
    chunks: list[tuple[int, list[dict[str, Any]]]] = []
    start, size = 0, 0
    cur: list[dict[str, Any]] = []
    for i, entry in enumerate(params):
        n = len(json.dumps(entry, separators=(",", ":"))) + 1
        if cur and size + n > CHUNK_BYTES:
            chunks.append((start, cur))
            start, cur, size = i, [], 0
        cur.append(entry)
        size += n
    if cur:
        chunks.append((start, cur))
    return chunks


class DynamoArrayRepository:
    def __init__(
        self, jobs_table: str, events_table: str, tenants_table: str, idempotency_table: str | None = None
    ) -> None:
        self._Array = array_model(jobs_table)
        self._Chunk = array_chunk_model(jobs_table)
        self._Counter = array_counter_model(jobs_table)
        self._Job = job_model(jobs_table)
        self._Event = event_model(events_table)
        self._Tenant = tenant_model(tenants_table)
        self._Pending = pending_arrays_model(tenants_table)
        self._Claim = None if idempotency_table is None else claim_model(idempotency_table)
        self._conn = Connection()

    # -- writes --------------------------------------------------------------------------------
    def create(
        self,
        array: JobArray,
        params: list[dict[str, Any]] | None,
        max_active: int,
        claim: SubmitClaim | None = None,
    ) -> None:
        """The parent, its parameter chunks, ``size`` more active jobs on the tenant's counter (all
        of them within ``max_active``, or QuotaExceeded and nothing stored), the array's entry in the
        expander's list and the idempotency claim, in one transaction."""
        chunks = chunk_parameters(params or [])
        counter = self._Tenant.active_jobs
        row = self._Array(
            array.id,
            kind="array",
            tenant=array.tenant,
            created_key=f"{iso(array.created_at)}#{array.id}",
            owner=array.owner,
            actor=array.actor,
            spec=array.spec.model_dump(mode="json", exclude_none=True),
            size=array.size,
            chunks=[start for start, _ in chunks],
            expanded=0,
            cancel_requested=False,
            canceled_upto=0,
            created_at=array.created_at,
            updated_at=array.updated_at,
        )
        try:
            with translated(f"create array {array.id}"), TransactWrite(connection=self._conn) as tx:
                tx.save(row, condition=self._Array.job_id.does_not_exist())
                for k, (start, entries) in enumerate(chunks):
                    tx.save(self._Chunk(chunk_key(array.id, k), start=start, params=entries))
                if claim is not None:
                    Claim = configured_claims(self._Claim)
                    tx.save(
                        Claim(
                            claim.key,
                            job_id=array.id,
                            fingerprint=claim.fingerprint,
                            expiration=int(claim.expires_at.timestamp()),
                        ),
                        condition=Claim.id.does_not_exist()
                        | (Claim.expiration < int(array.created_at.timestamp())),
                    )
                tx.update(
                    self._Tenant(TENANT + array.tenant),
                    actions=[counter.add(array.size)],
                    condition=counter.does_not_exist() | (counter <= max_active - array.size),
                )
                tx.update(self._Pending(PENDING), actions=[self._Pending.arrays.add({array.id})])
        except Conflict as exc:
            failed = failed_conditions(exc)
            # pynamodb sends puts before updates: parent, chunks..., [claim], tenant counter, pending.
            claim_at = 1 + len(chunks)
            if claim is not None and claim_at in failed:
                held = read_claim(self._Claim, claim.key)
                if held is not None:
                    raise AlreadySubmitted(held[0], held[1]) from exc
            if claim_at + (1 if claim is not None else 0) in failed:
                raise QuotaExceeded(
                    f"tenant {array.tenant!r} has no room for {array.size} more active jobs"
                ) from exc
            raise

    def put_tasks(self, tasks: Iterable[tuple[Job, JobEvent]], rows: Any) -> None:
        """Write task jobs and their first events (BatchWriteItem, 25 a call; unprocessed items are
        retried by pynamodb). Only for tasks that do not exist yet: puts are unconditional."""
        tasks = list(tasks)
        with translated("create array tasks"):
            with self._Job.batch_write() as batch:
                for job, _ in tasks:
                    batch.save(rows.row_of(job))
            with self._Event.batch_write() as batch:
                for job, event in tasks:
                    batch.save(rows.event_row_of(event, job))

    def existing(self, ids: list[str]) -> dict[str, tuple[str, int]]:
        """``{task id: (status, version)}`` of those of ``ids`` that exist."""
        out: dict[str, tuple[str, int]] = {}
        with translated("read array tasks"):
            for i in range(0, len(ids), BATCH_GET):
                rows = self._Job.batch_get(
                    ids[i : i + BATCH_GET],
                    consistent_read=True,
                    attributes_to_get=["job_id", "status", "version"],
                )
                for row in rows:
                    out[row.job_id] = (str(row.status), int(row.version))
        return out

    def advance(self, array: JobArray, expanded: int, canceled_at_creation: dict[int, int], now: Any) -> None:
        """Record tasks up to ``expanded`` as created, conditional on the parent still at
        ``array.expanded`` (so a resumed chunk is counted once); tasks created CANCELED (per counter
        shard) move their counts and give back their active-job counts in the same transaction."""
        A = self._Array
        released = sum(canceled_at_creation.values())
        with translated(f"advance array {array.id}"), TransactWrite(connection=self._conn) as tx:
            tx.update(
                A(array.id),
                actions=[A.expanded.set(expanded), A.updated_at.set(now)],
                condition=A.expanded == array.expanded,
            )
            for shard, n in canceled_at_creation.items():
                if n:
                    C = self._Counter
                    tx.update(C(counter_key(array.id, shard)), actions=[C.QUEUED.add(-n), C.CANCELED.add(n)])
            if released:
                tx.update(
                    self._Tenant(TENANT + array.tenant), actions=[self._Tenant.active_jobs.add(-released)]
                )

    def request_cancel(self, array: JobArray, reason: str, now: Any) -> None:
        A = self._Array
        with translated(f"cancel array {array.id}"), TransactWrite(connection=self._conn) as tx:
            tx.update(
                A(array.id),
                actions=[A.cancel_requested.set(True), A.cancel_reason.set(reason), A.updated_at.set(now)],
                condition=A.cancel_requested == False,  # noqa: E712 (a pynamodb condition)
            )
            tx.update(self._Pending(PENDING), actions=[self._Pending.arrays.add({array.id})])

    def advance_cancel(self, array: JobArray, upto: int) -> None:
        A = self._Array
        with translated(f"advance cancel of {array.id}"):
            A(array.id).update(
                actions=[A.canceled_upto.set(upto)], condition=A.canceled_upto == array.canceled_upto
            )

    def finish(self, array_id: str) -> None:
        """Take the array off the expander's list (it has nothing left to do)."""
        with translated(f"finish array {array_id}"):
            self._Pending(PENDING).update(actions=[self._Pending.arrays.delete({array_id})])

    # -- reads ---------------------------------------------------------------------------------
    def pending(self) -> list[str]:
        with translated("read the arrays with work left"):
            try:
                row = self._Pending.get(PENDING, consistent_read=True)
            except self._Pending.DoesNotExist:
                return []
        return sorted(row.arrays or [])

    def get(self, array_id: str) -> JobArray | None:
        found = self.get_many([array_id], consistent=True)
        return found[0] if found else None

    def get_many(self, array_ids: list[str], consistent: bool = False) -> list[JobArray]:
        """The arrays (with counts) among ``array_ids``: BatchGetItem of the parents, then of their
        counter shards (``COUNTER_SHARDS`` small items an array)."""
        if not array_ids:
            return []
        parents: dict[str, Any] = {}
        deltas: dict[str, dict[str, int]] = {a: {} for a in array_ids}
        counters = [counter_key(a, s) for a in array_ids for s in range(COUNTER_SHARDS)]
        with translated("read arrays"):
            for i in range(0, len(array_ids), BATCH_GET):
                for row in self._Array.batch_get(array_ids[i : i + BATCH_GET], consistent_read=consistent):
                    if row.kind == "array":
                        parents[row.job_id] = row
            counters = [c for c in counters if c.split("#", 1)[0] in parents]
            for i in range(0, len(counters), BATCH_GET):
                for c in self._Counter.batch_get(counters[i : i + BATCH_GET], consistent_read=consistent):
                    a = c.job_id.split("#", 1)[0]
                    for s in JobStatus:
                        v = getattr(c, str(s))
                        if v is not None:
                            deltas[a][str(s)] = deltas[a].get(str(s), 0) + int(v)
        return [self._array(parents[a], deltas[a]) for a in array_ids if a in parents]

    @staticmethod
    def _array(row: Any, deltas: dict[str, int]) -> JobArray:
        return JobArray(
            id=row.job_id,
            tenant=row.tenant,
            owner=row.owner,
            actor=row.actor,
            spec=JobSpec.model_validate(row.spec),
            size=int(row.size),
            created_at=row.created_at,
            updated_at=row.updated_at,
            expanded=int(row.expanded or 0),
            cancel_requested=bool(row.cancel_requested),
            cancel_reason=row.cancel_reason,
            canceled_upto=int(row.canceled_upto or 0),
            counts=counts_from_deltas(int(row.size), deltas),
            chunks=list(row.chunks or []),
        )

    def params(self, array: JobArray, start: int, stop: int) -> list[dict[str, Any]] | None:
        """The parameters of tasks ``start..stop-1`` (None: a ``size`` array)."""
        if not array.chunks:
            return None
        bounds = [*array.chunks[1:], array.size]
        ks = [k for k, s in enumerate(array.chunks) if s < stop and bounds[k] > start]
        out: dict[int, dict[str, Any]] = {}
        with translated(f"read parameters of {array.id}"):
            for row in self._Chunk.batch_get([chunk_key(array.id, k) for k in ks]):
                for j, entry in enumerate(row.params):
                    out[int(row.start) + j] = entry
        return [out[i] for i in range(start, stop)]

    def tasks(self, array_id: str, start: int, stop: int, job_of: Any) -> list[Job]:
        """Tasks ``start..stop-1`` that exist, in index order (BatchGetItem)."""
        ids = [task_id(array_id, i) for i in range(start, stop)]
        rows: dict[str, JobRow] = {}
        with translated(f"read tasks of {array_id}"):
            for i in range(0, len(ids), BATCH_GET):
                for row in self._Job.batch_get(ids[i : i + BATCH_GET], consistent_read=True):
                    rows[row.job_id] = row
        return [job_of(rows[i]) for i in ids if i in rows]


__all__ = ["Conflict", "DynamoArrayRepository", "counter_move"]
