"""DynamoDB placement writer: a scheduling decision (or several, ``place_many``) applied as one
TransactWriteItems.

The items: one hold per host (``DynamoHostRepository.add_hold``: the named GPU UUIDs all free, the
attempt holding nothing there yet), the job under its version and its event
(``DynamoJobRepository.add_save``). DynamoDB applies all of them or none, so a placement never leaves a
hold without its job nor a job without its hold, and a lost race (a GPU taken, the job moved, a host
gone, another transaction on one of the items) cancels the whole transaction: ``Conflict``. The
client request token makes the SDK's own retry of a transaction whose answer was lost idempotent
(DynamoDB answers the first outcome again for ten minutes).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence

from pynamodb.connection import Connection
from pynamodb.transactions import TransactWrite

from berth.dal.errors import translated
from berth.dal.hosts import DynamoHostRepository
from berth.dal.jobs import DynamoJobRepository
from berth.dal.models import MAX_POOL_CONNECTIONS
from berth.domain.fleet import HoldRequest, check_hold_requests, check_placement_group
from berth.domain.job import Job, JobEvent
from berth.domain.ports import PlacementWrite


def request_token(job: Job) -> str:
    """The transaction's idempotency token (at most 36 characters): one per (job, version, fencing
    token), so a retry of the same write is recognised and nothing else is."""
    seed = f"{job.id}#{job.version}#{job.run.attempt.fencing_token}".encode()
    return hashlib.sha256(seed).hexdigest()[:36]


def _counted(job: Job) -> bool:
    """Whether placing the job also moves its array's counter (``add_save``: one more item)."""
    return job.spec.array_task is not None


def _counter(job: Job) -> str:
    task = job.spec.array_task
    return "" if task is None else task.array_id


class DynamoPlacementWriter:
    def __init__(self, jobs: DynamoJobRepository, hosts: DynamoHostRepository) -> None:
        self._jobs = jobs
        self._hosts = hosts
        self._conn = Connection(max_pool_connections=MAX_POOL_CONNECTIONS)
        self._client_lock = threading.Lock()
        self._client_ready = False

    def _connection(self) -> Connection:
        """The connection, its SDK client created once: pynamodb creates it on first use without a
        lock, in a botocore session per thread, so the scheduler's apply pool starting at once built
        one per thread (each loading the SDK's endpoint and service models)."""
        if not self._client_ready:
            with self._client_lock:
                if not self._client_ready:
                    _ = self._conn.client
                    self._client_ready = True
        return self._conn

    def place(self, job: Job, event: JobEvent, attempt: str, holds: Sequence[HoldRequest]) -> None:
        check_hold_requests(holds)
        with (
            translated(f"place job {job.id}"),
            TransactWrite(connection=self._connection(), client_request_token=request_token(job)) as tx,
        ):
            for h in holds:
                self._hosts.add_hold(tx, h.host_id, attempt, h.gpu_ids, h.cpu, h.memory_gib, h.at)
            self._jobs.add_save(tx, job, event)

    def place_many(self, writes: Sequence[PlacementWrite]) -> None:
        """Several placements as one transaction: each host updated once with every hold it gets."""
        check_placement_group([w.holds for w in writes], array_tasks=sum(_counted(w.job) for w in writes))
        if len({w.job.id for w in writes}) != len(writes):
            raise ValueError("a placement group names each job once")
        counters = [_counter(w.job) for w in writes if _counted(w.job)]
        if len(set(counters)) != len(counters):
            raise ValueError("a placement group moves each array counter once (one task per array)")
        per_host: dict[str, list[tuple[str, HoldRequest]]] = {}
        for w in writes:
            for h in w.holds:
                per_host.setdefault(h.host_id, []).append((w.attempt, h))
        token = hashlib.sha256("|".join(request_token(w.job) for w in writes).encode()).hexdigest()[:36]
        with (
            translated(f"place jobs {', '.join(w.job.id for w in writes)}"),
            TransactWrite(connection=self._connection(), client_request_token=token) as tx,
        ):
            for host_id, holds in per_host.items():
                self._hosts.add_holds(tx, host_id, holds)
            for w in writes:
                self._jobs.add_save(tx, w.job, w.event)
