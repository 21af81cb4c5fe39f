"""What the domain needs from the outside world, as protocols. Adapters implement them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from berth.domain.agent_wire import CachedDataset
from berth.domain.cloud import BatchJob, BatchSubmission, SubmitRequest
from berth.domain.cost import AttemptUsage
from berth.domain.fleet import (
    Admission,
    HoldRelease,
    HoldRequest,
    HostInventory,
    HostRecord,
    StoredDocument,
)
from berth.domain.gpu_health import GpuFault
from berth.domain.idempotency import SubmitClaim
from berth.domain.job import Job, JobEvent
from berth.domain.log_pages import LOG_PAGE_BUDGET_BYTES
from berth.domain.observability import LogPage, MetricSample, StoredSample
from berth.domain.queue import QueueEntry
from berth.domain.queue_summary import QueueSummary
from berth.domain.status import JobStatus
from berth.domain.storage import DataGrants, Dataset
from berth.domain.tenancy import Quota, Role
from berth.domain.workflow import CheckpointInfo


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[Job]
    next_token: str | None


@dataclass(frozen=True, slots=True)
class Member:
    principal: str
    tenant: str
    role: Role
    #: The IAM unique id (AIDA.../AROA...) registered with the ARN; a recreated role or user with the
    #: same name has another one and is refused until re-registered (None: recorded before unique ids
    #: were; refused too, until re-registered).
    unique_id: str | None = None


@dataclass(frozen=True, slots=True)
class QueueHead:
    """The first ``limit`` entries of a tenant's queue (over all its shards, in queue order), and
    whether more are queued behind them."""

    entries: list[QueueEntry]
    more: bool


class JobRepository(Protocol):
    def create(self, job: Job, event: JobEvent, max_active: int, claim: SubmitClaim | None = None) -> None:
        """Store a new job and its first event atomically, counting it against the tenant's active
        jobs; Conflict if the id exists, QuotaExceeded if the tenant already has ``max_active``.
        With a ``claim``, the claim is stored in the same transaction; AlreadySubmitted (with the
        stored job id and fingerprint) if an unexpired claim with that key exists."""

    def get(self, job_id: str) -> Job | None: ...

    def save(
        self,
        job: Job,
        event: JobEvent,
        usage: AttemptUsage | None = None,
        releases: tuple[HoldRelease, ...] = (),
    ) -> None:
        """Store ``job`` (version n) only if the stored one is still version n-1, with its event,
        atomically (releasing its active-job count when it ends); Conflict if another writer got
        there first. ``usage``: the ended attempt's usage record, stored in the same write under
        ``UsageLedger.record``'s rule (a stored record of more run time stays, and the job is saved
        all the same); a repository without a usage ledger refuses it (ValueError). ``releases``:
        the ended attempt's GPU holds, given back in the same write; a hold already released is
        left as it is and the job saved all the same; a repository without the hosts refuses them
        (ValueError)."""

    def update(self, job: Job) -> None:
        """Store ``job`` (version n) if the stored version is n-1, without an event; else Conflict."""
        ...

    def list_for_tenant(
        self,
        tenant: str,
        status: JobStatus | None,
        limit: int,
        next_token: str | None,
        since: datetime | None = None,
    ) -> Page:
        """A page of the tenant's jobs (and arrays), newest first; ``since``: created at or after."""
        ...

    def list_all_tenants(
        self, status: JobStatus | None, limit: int, next_token: str | None, since: datetime | None = None
    ) -> Page:
        """The same over every tenant (operators), newest first."""
        ...

    def events(self, job_id: str) -> list[JobEvent]: ...

    def count_active(self, tenant: str) -> int:
        """The tenant's jobs not yet in a terminal state."""

    def list_placed(self, status: JobStatus) -> list[Job]:
        """Every tenant's jobs in ``status`` (STARTING, RUNNING or CANCELING: a placed job holds
        capacity), oldest first, all of them (paginated to the end: usage is never under-counted)."""

    def queued_tenants(self) -> dict[str, int]:
        """Each tenant that may have queued jobs, with its active-job count (queued, retrying and
        placed jobs; from the counters kept in the jobs' transactions)."""

    def queue_head(self, tenant: str, limit: int) -> QueueHead:
        """The first ``limit`` entries of the tenant's queue index (priority, then submit time)."""

    def get_many(self, job_ids: Iterable[str]) -> dict[str, Job]:
        """The full jobs of these ids (absent ids are left out); StoreUnavailable if the store keeps
        refusing part of the batch."""

    def set_reason(self, entry: QueueEntry, reason: str) -> None:
        """Store a queued job's reason alone (no new version, no event), conditional on the job still
        being queued at the entry's version; Conflict otherwise."""


@dataclass(frozen=True, slots=True)
class PlacementWrite:
    """One placement as the writer stores it: the placed job (version n), its event, the attempt's
    key and the GPUs it holds on each host."""

    job: Job
    event: JobEvent
    attempt: str
    holds: Sequence[HoldRequest]


class PlacementWriter(Protocol):
    """Applies scheduling decisions atomically (one DynamoDB transaction each call)."""

    def place(self, job: Job, event: JobEvent, attempt: str, holds: Sequence[HoldRequest]) -> None:
        """All or nothing: hold exactly these GPUs for ``attempt`` on each host (every UUID free there,
        the attempt holding nothing there yet) and store ``job`` (version n, if the stored one is
        n-1) with its event. Conflict (nothing written) if any of that does not hold: a GPU taken, the
        job moved, a host unknown. StoreUnavailable if the store failed; the write may then have
        happened or not (the next pass sees which). ValueError for holds that name a host twice."""

    def place_many(self, writes: Sequence[PlacementWrite]) -> None:
        """``place`` of several jobs as one all-or-nothing write (the holds of one host merged into
        one update of it): Conflict, and nothing written, if any one of them would fail. ValueError
        when they do not fit one transaction (``fleet.check_placement_group``) or name a job twice."""


class HostRepository(Protocol):
    """The on-prem fleet. Every write is conditional: a GPU is free or held by exactly one attempt."""

    def register(self, inventory: HostInventory, lease_expires_at: datetime) -> HostRecord:
        """Create the host or replace its inventory (keeping the holds of running attempts and only
        its own attributes); healthy, with this lease. Conflict if a held GPU would disappear;
        ``InventoryRefused`` beyond its admission (``berth.domain.fleet.admission_for``, which the
        first registration fixes)."""

    def admit(self, host_id: str, admission: Admission) -> None:
        """Set what the host may register at most (an admin's decision); NotFound for an unknown
        host. Its current inventory is left as it is (the next registration is checked against it)."""

    def heartbeat(
        self,
        host_id: str,
        lease_expires_at: datetime,
        healthy: bool = True,
        draining: bool = False,
        cached_datasets: Sequence[CachedDataset] | None = None,
    ) -> None:
        """Extend the host's lease and set its health and whether it is draining; NotFound for an
        unknown host. ``cached_datasets``: what its cache holds now (None: leave it as stored)."""

    def get(self, host_id: str) -> HostRecord | None: ...

    def list_hosts(self) -> list[HostRecord]: ...

    def hold(
        self,
        host_id: str,
        attempt: str,
        gpu_ids: tuple[str, ...],
        cpu: float,
        memory_gib: float,
        at: datetime | None = None,
    ) -> None:
        """Give exactly these GPUs to ``attempt`` in one conditional write; Conflict if any of them
        is not free (held by another attempt, or not the host's), or the attempt already holds
        GPUs here; NotFound for an unknown host."""

    def release(self, host_id: str, attempt: str, gpu_ids: tuple[str, ...] | None = None) -> bool:
        """Return the attempt's GPUs to the free set; False (and nothing written) if it held none.
        ``gpu_ids``: the GPUs the attempt's placement holds there (a hold is written with exactly
        those and never changes): released without reading the host first."""
        ...

    def mark_lost(self, host_id: str, expired_before: datetime) -> bool:
        """Mark a host whose lease expired before ``expired_before`` unhealthy; False if it renewed meanwhile
        (conditional on the lease still being expired) or was already marked."""

    def request_drain(self, host_id: str, drain: bool) -> None:
        """Ask the host to drain (or stop asking); NotFound for an unknown host."""

    def add_gpu_faults(self, host_id: str, faults: Mapping[str, GpuFault]) -> HostRecord:
        """Keep these fatal faults (GPU UUID -> fault) for the GPUs that have none yet (a GPU keeps its
        first), conditionally on the record read; the record stored. NotFound for an unknown host."""
        ...

    def set_gpu_warnings(self, host_id: str, warnings: Mapping[str, GpuFault]) -> None:
        """Replace the host's current GPU warnings; NotFound for an unknown host."""

    def clear_gpu_fault(self, host_id: str, gpu_id: str) -> GpuFault | None:
        """Remove the GPU's fatal fault and remember its id among the cleared ones (``CLEARED_KEPT``);
        the fault removed, None when it had none. NotFound for an unknown host."""


class DocumentRepository(Protocol):
    """Versioned organisational documents (``policy``, ``offers``): every version kept."""

    def current(self, kind: str) -> StoredDocument | None: ...

    def version(self, kind: str, version: int) -> StoredDocument | None: ...

    def put(
        self, kind: str, document: object, expected_version: int, at: datetime, by: str
    ) -> StoredDocument:
        """Store version ``expected_version + 1`` if the current version is still ``expected_version``
        (0: none stored); Conflict otherwise. Older versions stay readable."""


class RateCounter(Protocol):
    def take(self, tenant: str, window: int, limit: int, expires_at: int) -> bool:
        """Count one request of ``tenant`` in fixed window number ``window`` unless it already holds
        ``limit``; False when the window is full. ``expires_at`` (epoch s): when the count may go."""


@dataclass(frozen=True, slots=True)
class TenantRecord:
    """What a submit needs of its tenant's record (``TENANT#<name>``): read once per request, in one
    strongly consistent read, and handed to the quota, access and feasibility checks."""

    quota: Quota | None = None
    grants: DataGrants = field(default_factory=DataGrants)


class TenantRepository(Protocol):
    def member(self, principal: str) -> Member | None: ...

    def record(self, tenant: str) -> TenantRecord:
        """The tenant's quota (None: none set) and grants, in one strongly consistent read."""

    def put_member(self, principal: str, tenant: str, role: str, unique_id: str | None = None) -> None: ...

    def quota(self, tenant: str) -> Quota | None: ...

    def put_quota(self, tenant: str, quota: Quota) -> None: ...

    def tenant_exists(self, tenant: str) -> bool: ...

    def grants(self, tenant: str) -> DataGrants:
        """The S3 prefixes an admin granted the tenant besides its own (empty if none)."""

    def put_grants(self, tenant: str, grants: DataGrants) -> None:
        """Replace the tenant's grants, and nothing else of its record."""

    def dataset(self, name: str) -> Dataset | None: ...

    def put_dataset(self, name: str, dataset: Dataset) -> None: ...


@dataclass(frozen=True, slots=True)
class UploadTicket:
    """A presigned upload: send the bundle with exactly this method, URL and headers."""

    url: str
    method: str
    headers: dict[str, str]
    expires_in_s: int


class BundleStore(Protocol):
    def exists(self, tenant: str, digest: str) -> bool:
        """Stored for this tenant, and S3's recorded SHA-256 of the content is ``digest``."""

    def upload_ticket(self, tenant: str, digest: str, size: int) -> UploadTicket:
        """A presigned PUT that S3 accepts only for content of this size and SHA-256, and only if
        no object is there yet (bundles are immutable)."""

    def mark_referenced(self, tenant: str, digest: str) -> None:
        """Record that a job uses the bundle (the lifecycle rule expires unreferenced ones)."""


class SecretCatalog(Protocol):
    def exists(self, name: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class JobCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: datetime


class CredentialVendor(Protocol):
    def assume(
        self, session_name: str, policy_json: str, seconds: int, source_identity: str
    ) -> JobCredentials:
        """Credentials of the job role narrowed by ``policy_json``; StoreUnavailable on STS failure."""


class TaskTokens(Protocol):
    """Step Functions callbacks: complete, fail or keep alive a task waiting on a token."""

    def succeed(self, token: str, output: dict[str, Any]) -> bool:
        """False when the token is no longer valid (its execution ended or the task timed out)."""
        ...

    def fail(self, token: str, error: str, cause: str) -> bool: ...

    def heartbeat(self, token: str) -> bool: ...


class WorkQueues(Protocol):
    """One queue per on-prem host: work messages reach exactly the host the scheduler chose."""

    def ensure(self, host_id: str) -> str:
        """The host's queue URL, creating the queue the first time."""
        ...

    def send(self, host_id: str, body: str) -> None: ...


class PassTrigger(Protocol):
    """Asks for a scheduling pass (batched: many requests close together cost one pass)."""

    def request(self, reason: str, delay_s: int = 0) -> None: ...


class Executions(Protocol):
    """Starts the job's workflow execution, named after the job (a second start is harmless)."""

    def start(self, job_id: str, payload: dict[str, Any]) -> None: ...


class EventPublisher(Protocol):
    def publish(self, details: list[dict[str, Any]]) -> None:
        """Put ``Berth Job State Change`` events (all or raise)."""
        ...


class MetricsRepository(Protocol):
    """Attempts' usage samples (``berth.domain.observability``), kept per job, attempt and time."""

    def put(
        self, job_id: str, attempt: int, host_id: str, samples: list[MetricSample], expires_at: int
    ) -> None:
        """Store the samples (``expires_at``, epoch s: when they may go). Storing a sample with the
        same (attempt, host, time) again replaces it: a batch the agent sends twice is kept once."""

    def samples(self, job_id: str, attempt: int, limit: int) -> list[StoredSample]:
        """The attempt's latest ``limit`` samples (of every host of the attempt), oldest first."""
        ...


class LogReader(Protocol):
    """Job output in CloudWatch Logs, one stream per attempt."""

    def read(
        self,
        group: str,
        stream: str,
        start_ms: int | None,
        next_token: str | None,
        limit: int,
        max_bytes: int = LOG_PAGE_BUDGET_BYTES,
    ) -> LogPage:
        """Up to ``limit`` events of one stream, oldest first, from ``start_ms`` (epoch ms) or where
        ``next_token`` (from an earlier page of this very stream) left off, no more than fit
        ``max_bytes`` of JSON (``berth.domain.log_pages.fit_page``: the next page starts after the
        last event kept; a first event over the budget is cut with a marker). A stream or group that
        does not exist (yet) is an empty page with no token; a token of another stream, or one this
        API did not issue, InvalidRequest; the service failing, StoreUnavailable."""


class UsageLedger(Protocol):
    """Usage per tenant and month, one record per job attempt (``berth.domain.cost``)."""

    def record(self, usage: AttemptUsage) -> bool:
        """Store the attempt's usage unless a record of at least as much run time is stored (so a
        retried or late write never counts twice nor goes back); True when stored."""
        ...

    def month(self, tenant: str, month: str) -> list[AttemptUsage]:
        """Every attempt of the tenant recorded for ``month`` (``YYYY-MM``)."""
        ...


@dataclass(frozen=True, slots=True)
class CircuitEntry:
    """Recent failures and the last success of one (region, instance type or '*')."""

    region: str
    instance_type: str
    failures: tuple[float, ...] = ()
    last_success_at: float | None = None


class CircuitRepository(Protocol):
    """The cloud's live health signal (capacity, API errors, spot interruptions), per (region,
    instance type or ``'*'`` for the region's API), read by every pass into the core's circuits."""

    def record_failure(self, region: str, instance_type: str, at: float) -> None:
        """Add a failure (epoch seconds); old failures are pruned (only recent ones decide)."""

    def record_success(self, region: str, instance_type: str, at: float) -> None: ...

    def reset(self, region: str, instance_type: str | None) -> list[tuple[str, str]]:
        """Forget the failures of one circuit (``instance_type``: a type or ``'*'``) or, with None,
        of every circuit of the region (an admin closing them); the ``(region, instance type)`` of
        each circuit reset, none when there was nothing to reset."""
        ...

    def list(self) -> list[CircuitEntry]: ...


class RuntimeHistory(Protocol):
    """Per tenant, what its finished jobs ran for: the document the scheduler's run-time predictor
    learns from (``berth.logic.runtimes``), opaque to the store. Advisory: a lost update costs one
    observation, never a job."""

    def update(self, tenant: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> None:
        """Apply ``change`` to the tenant's document (None: none stored yet) and store the result,
        conditionally: a concurrent writer makes it re-read and apply ``change`` again."""

    def read(self, tenants: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The stored documents of these tenants (tenants without one are left out)."""
        ...


class QueueSummaries(Protocol):
    """Per tenant, its queue as the last scheduling pass saw it (``berth.domain.queue_summary``):
    advisory, rewritten by the pass when it changed, read by the job API."""

    def put(self, summary: QueueSummary) -> None:
        """Store the tenant's summary (replacing the last). Raises ``StoreUnavailable``."""

    def get(self, tenant: str) -> QueueSummary | None: ...


class BatchGateway(Protocol):
    """AWS Batch in one region at a time, acting for one tenant. Raises ``CloudThrottled``,
    ``CloudUnavailable`` or ``CloudRejected`` (``berth.domain.cloud``)."""

    def submit(self, request: BatchSubmission) -> str:
        """Submit the job (registering the image's job definition the first time); its Batch id."""
        ...

    def find(self, region: str, queue: str, name: str) -> list[BatchJob]:
        """Batch jobs of this name in this queue, in any status (a submit that may have happened); an
        array job itself, never its children (which share its name)."""
        ...

    def describe(self, region: str, batch_job_ids: list[str]) -> list[BatchJob]:
        """What Batch says about these jobs now (unknown ids are simply absent)."""
        ...

    def terminate(self, region: str, batch_job_id: str, reason: str, tenant: str) -> None:
        """Stop the Batch job (acting for its tenant: only that tenant's jobs may be terminated)."""


class SubmitQueue(Protocol):
    """The queue of Batch submit requests (throttled by its consumer, never dropped)."""

    def send(self, request: SubmitRequest, first: bool = False) -> None:
        """Queue ``request``. ``first``: the dispatch's own send of the attempt's request, the only one
        whose first delivery may skip looking the Batch job up by name (``CloudDispatchService.submit``);
        the sweep's resends are never first."""
        ...


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object under a job's output prefix, with a presigned GET for it."""

    key: str
    size: int
    last_modified: datetime
    url: str


@dataclass(frozen=True, slots=True)
class ObjectPage:
    objects: list[StoredObject]
    last_key: str | None
    """The last key of this page when more follow (None: this is the last page)."""


class OutputStore(Protocol):
    """A job's outputs and checkpoints in the data bucket (``<tenant>/jobs/<job>/``)."""

    bucket: str

    def list_presigned(
        self, prefix: str, start_after: str | None, limit: int, expires_in_s: int
    ) -> ObjectPage:
        """Up to ``limit`` objects under ``prefix`` after the key ``start_after``, key order, each
        with a GET URL valid for ``expires_in_s``."""
        ...


class CheckpointStore(Protocol):
    """A job's checkpoints in the data bucket (``<tenant>/jobs/<job>/checkpoints/``), as its
    attempts synced them: the cloud branch reads them once when a cloud attempt ends."""

    def last_checkpoint(self, prefix: str) -> CheckpointInfo | None:
        """The checkpoint under ``prefix``: the newest object's time and the objects' total size,
        from one (paginated) listing; None when nothing is there. Raises ``StoreUnavailable``."""
        ...
