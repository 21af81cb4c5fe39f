"""pynamodb table models. Table names are only known at run time, so each model is built per name."""

from __future__ import annotations

from functools import cache

from pynamodb.attributes import (
    BinaryAttribute,
    BooleanAttribute,
    JSONAttribute,
    MapAttribute,
    NumberAttribute,
    UnicodeAttribute,
    UnicodeSetAttribute,
    UTCDateTimeAttribute,
)
from pynamodb.indexes import AllProjection, GlobalSecondaryIndex, IncludeProjection, KeysOnlyProjection
from pynamodb.models import Model


class JobRow(Model):
    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    # An array task keeps its tenant in ``task_tenant`` instead, so it stays out of ``by_tenant``
    # (a tenant's listing shows its array as one row; docs/api.md).
    tenant = UnicodeAttribute(null=True)
    task_tenant = UnicodeAttribute(null=True)
    tenant_status = UnicodeAttribute()
    created_key = UnicodeAttribute()
    owner = UnicodeAttribute()
    actor = UnicodeAttribute(null=True)
    status = UnicodeAttribute()
    reason = UnicodeAttribute()
    spec = JSONAttribute()
    created_at = UTCDateTimeAttribute()
    updated_at = UTCDateTimeAttribute()
    site = UnicodeAttribute(null=True)
    placement = JSONAttribute(null=True)
    attempts = NumberAttribute(default=0)
    cost_usd = NumberAttribute(default=0)
    version = NumberAttribute()
    #: The workflow's run state (``berth.domain.workflow.RunState``): tokens, lease, ranks.
    run = JSONAttribute(null=True)
    #: Set only while QUEUED (the sparse ``by_queue`` index): ``<tenant>#<shard>``, the queue order,
    #: and the compact entry the pass reads (``berth.domain.queue``).
    queue_pk = UnicodeAttribute(null=True)
    queue_sk = UnicodeAttribute(null=True)
    queue_entry = JSONAttribute(null=True)
    #: Set only while the job holds capacity (STARTING, RUNNING, CANCELING): the sparse ``by_placed``.
    placed_status = UnicodeAttribute(null=True)


class ByTenant(GlobalSecondaryIndex["JobRow"]):
    """A tenant's jobs, newest first (``GET /v1/jobs``): keys only, the page is read with BatchGetItem,
    so no update of a job rewrites a copy here unless its key moves."""

    class Meta:
        index_name = "by_tenant"
        projection = KeysOnlyProjection()

    tenant = UnicodeAttribute(hash_key=True)
    created_key = UnicodeAttribute(range_key=True)


class ByTenantStatus(GlobalSecondaryIndex["JobRow"]):
    class Meta:
        index_name = "by_tenant_status"
        projection = KeysOnlyProjection()

    tenant_status = UnicodeAttribute(hash_key=True)
    created_key = UnicodeAttribute(range_key=True)


#: What ``by_queue`` projects besides the keys.
QUEUE_PROJECTION = ("version", "reason", "queue_entry")


class ByQueue(GlobalSecondaryIndex["JobRow"]):
    """The queue index: queued jobs only (sparse), per tenant and shard, in queue order, with the
    compact entry the scheduler core reads."""

    class Meta:
        index_name = "by_queue"
        projection = IncludeProjection(list(QUEUE_PROJECTION))

    queue_pk = UnicodeAttribute(hash_key=True)
    queue_sk = UnicodeAttribute(range_key=True)


class ByPlaced(GlobalSecondaryIndex["JobRow"]):
    """Jobs holding capacity (sparse), by status, oldest first: the pass's running set (whole items:
    the pass writes their cost and stop directives under their version)."""

    class Meta:
        index_name = "by_placed"
        projection = AllProjection()

    placed_status = UnicodeAttribute(hash_key=True)
    created_key = UnicodeAttribute(range_key=True)


class JobEventRow(Model):
    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    seq = NumberAttribute(range_key=True)
    at = UTCDateTimeAttribute()
    from_status = UnicodeAttribute(null=True)
    to_status = UnicodeAttribute()
    reason = UnicodeAttribute()
    #: The notification (``Job.notification``) the stream publishes to EventBridge: ids and states only.
    detail = JSONAttribute(null=True)
    #: A move to COMPLETED only: the run it teaches the predictor (``RunObservation.to_dict``), learnt by
    #: the stream's consumer; internal, never in ``detail``.
    run_observation = JSONAttribute(null=True)


class TenantRow(Model):
    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    tenant = UnicodeAttribute(null=True)
    role = UnicodeAttribute(null=True)
    #: PRINCIPAL# rows: the IAM unique id registered with the ARN.
    unique_id = UnicodeAttribute(null=True)
    quota = JSONAttribute(null=True)
    #: Jobs of this tenant not yet in a terminal state; kept in the same transactions as the jobs.
    active_jobs = NumberAttribute(null=True)
    #: TENANT# items: S3 prefixes granted besides the tenant's own (written alone, like ``quota``).
    grants = JSONAttribute(null=True)
    #: DATASET#<name> items: the registered dataset.
    dataset = JSONAttribute(null=True)
    #: TENANT# items: ``"T"``, the key of the sparse ``by_directory`` index (the tenants that have
    #: submitted; set once, so the index is written once per tenant).
    directory = UnicodeAttribute(null=True)


class ByDirectory(GlobalSecondaryIndex["TenantRow"]):
    class Meta:
        index_name = "by_directory"
        projection = KeysOnlyProjection()

    directory = UnicodeAttribute(hash_key=True)
    pk = UnicodeAttribute(range_key=True)


class DocumentRow(Model):
    """``DOC#<kind>#HEAD`` (the current version) and ``DOC#<kind>#<version:08d>`` (every version,
    kept) in the Tenants table: the scheduling policy and the cloud offers."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    kind = UnicodeAttribute(null=True)
    version = NumberAttribute(null=True)
    document = JSONAttribute(null=True)
    updated_at = UTCDateTimeAttribute(null=True)
    updated_by = UnicodeAttribute(null=True)


class HostRow(Model):
    """One on-prem host. ``free_gpu_ids`` is the set of its GPUs no attempt holds (absent when none is
    free: DynamoDB has no empty sets); ``holds`` maps an attempt key to ``{gpu_ids, cpu, memory_gib}``.
    A GPU moves between the two in one conditional UpdateItem."""

    class Meta:
        table_name = "unset"

    host_id = UnicodeAttribute(hash_key=True)
    pool = UnicodeAttribute(null=True)
    gpu_type = UnicodeAttribute(null=True)
    gpu_ids = JSONAttribute(null=True)
    cpu = NumberAttribute(null=True)
    memory_gib = NumberAttribute(null=True)
    labels = JSONAttribute(null=True)
    containment = UnicodeAttribute(null=True)
    healthy = BooleanAttribute(null=True)
    lease_expires_at = UTCDateTimeAttribute(null=True)
    free_gpu_ids = UnicodeSetAttribute(null=True)
    holds = MapAttribute(null=True)  # type: ignore[var-annotated]
    version = NumberAttribute(null=True)
    draining = BooleanAttribute(null=True)
    drain_requested = BooleanAttribute(null=True)
    admitted_gpu_type = UnicodeAttribute(null=True)
    admitted_gpus = NumberAttribute(null=True)
    cached_datasets = JSONAttribute(null=True)
    """``[{source, version, size_bytes}]``: what the host's object cache holds (data locality)."""
    #: GPU UUID -> fatal fault / current warning (``berth.domain.gpu_health.GpuFault`` as JSON).
    gpu_faults = JSONAttribute(null=True)
    gpu_warnings = JSONAttribute(null=True)
    #: Ids of faults an admin cleared lately (newest last).
    cleared_faults = JSONAttribute(null=True)


class RateRow(Model):
    """``RATE#<tenant>#<window>`` in the Tenants table: requests counted in one rate-limit window."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    hits = NumberAttribute(null=True)
    expires_at = NumberAttribute(null=True)  # the table's TTL attribute (epoch seconds)


class CircuitsRow(Model):
    """``CIRCUITS`` in the Tenants table: the cloud's recent failures and successes per (region,
    instance type or '*'), one small item read whole by every pass, written under its version."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    version = NumberAttribute()
    circuits = JSONAttribute()


class RuntimesRow(Model):
    """``RUNTIMES#<tenant>`` in the Tenants table: the run-time history of the tenant's finished jobs
    (the scheduler's predictor state), written under its version."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    version = NumberAttribute()
    history = JSONAttribute()


class QueueSummaryRow(Model):
    """``QUEUE#<tenant>`` in the Tenants table: the tenant's queue as the last pass saw it (positions
    and estimated starts of its first waiting jobs; ``berth.domain.queue_summary``)."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    summary = JSONAttribute()


@cache
def queue_summary_model(table_name: str) -> type[QueueSummaryRow]:
    return _bind(QueueSummaryRow, table_name)  # type: ignore[return-value]


class KeyRow(Model):
    """``KEY#<name>`` in the Tenants table: a signing key the API generated for itself."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    secret = BinaryAttribute(null=True, legacy_encoding=False)


class SubmitClaimRow(Model):
    """In the idempotency table, beside Powertools' records: the job an Idempotency-Key created."""

    class Meta:
        table_name = "unset"

    id = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute()
    fingerprint = UnicodeAttribute()
    expiration = NumberAttribute()  # the table's TTL attribute (epoch seconds), as Powertools uses


class UsageRow(Model):
    """The usage ledger: one item per job attempt, ``pk`` = ``<tenant>#<YYYY-MM>``, ``sk`` =
    ``<job_id>#<attempt:04d>`` (a month of a tenant is one Query)."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    sk = UnicodeAttribute(range_key=True)
    tenant = UnicodeAttribute()
    month = UnicodeAttribute()
    job_id = UnicodeAttribute()
    attempt = NumberAttribute()
    site = UnicodeAttribute()
    location = UnicodeAttribute()
    gpus = NumberAttribute()
    seconds = NumberAttribute()
    hourly_usd = NumberAttribute()
    final = BooleanAttribute(default=False)


#: HTTP connections each table model keeps (pynamodb's default is 10): the scheduler's apply pool
#: writes from ``berth.logic.scheduler_service.APPLY_WORKERS`` threads at once.
MAX_POOL_CONNECTIONS = 32


def _bind(base: type[Model], table_name: str, **attrs: object) -> type[Model]:
    meta = type("Meta", (), {"table_name": table_name, "max_pool_connections": MAX_POOL_CONNECTIONS})
    return type(f"{base.__name__}_{table_name}", (base,), {"Meta": meta, **attrs})


@cache
def job_model(table_name: str) -> type[JobRow]:
    # An index's Meta is bound to one model class, so each table gets its own index classes.
    indexes = {
        name: type(f"{base.__name__}_{table_name}", (base,), {"Meta": type("Meta", (base.Meta,), {})})()
        for name, base in (
            ("by_tenant", ByTenant),
            ("by_tenant_status", ByTenantStatus),
            ("by_queue", ByQueue),
            ("by_placed", ByPlaced),
        )
    }
    return _bind(JobRow, table_name, **indexes)  # type: ignore[return-value]


@cache
def event_model(table_name: str) -> type[JobEventRow]:
    return _bind(JobEventRow, table_name)  # type: ignore[return-value]


@cache
def tenant_model(table_name: str) -> type[TenantRow]:
    index = type(f"ByDirectory_{table_name}", (ByDirectory,), {"Meta": type("Meta", (ByDirectory.Meta,), {})})
    return _bind(TenantRow, table_name, by_directory=index())  # type: ignore[return-value]


@cache
def rate_model(table_name: str) -> type[RateRow]:
    return _bind(RateRow, table_name)  # type: ignore[return-value]


@cache
def key_model(table_name: str) -> type[KeyRow]:
    return _bind(KeyRow, table_name)  # type: ignore[return-value]


@cache
def claim_model(table_name: str) -> type[SubmitClaimRow]:
    return _bind(SubmitClaimRow, table_name)  # type: ignore[return-value]


@cache
def document_model(table_name: str) -> type[DocumentRow]:
    return _bind(DocumentRow, table_name)  # type: ignore[return-value]


@cache
def host_model(table_name: str) -> type[HostRow]:
    return _bind(HostRow, table_name)  # type: ignore[return-value]


class JobMetricRow(Model):
    """One usage sample of an attempt: ``sk`` = ``<attempt, 6 digits>#<epoch ms, 13 digits>#<host>``,
    so one attempt's samples are one key range, in time order; expires through the TTL."""

    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    sk = UnicodeAttribute(range_key=True)
    attempt = NumberAttribute()
    host_id = UnicodeAttribute()
    sample = JSONAttribute()
    expires_at = NumberAttribute()  # the table's TTL attribute (epoch seconds)


@cache
def metric_model(table_name: str) -> type[JobMetricRow]:
    return _bind(JobMetricRow, table_name)  # type: ignore[return-value]


@cache
def usage_model(table_name: str) -> type[UsageRow]:
    return _bind(UsageRow, table_name)  # type: ignore[return-value]


@cache
def circuits_model(table_name: str) -> type[CircuitsRow]:
    return _bind(CircuitsRow, table_name)  # type: ignore[return-value]


@cache
def runtimes_model(table_name: str) -> type[RuntimesRow]:
    return _bind(RuntimesRow, table_name)  # type: ignore[return-value]


# -- job arrays (dal/arrays.py): items of the Jobs table beside the jobs -----------------------------
class ArrayRow(Model):
    """An array's parent, keyed by its id. It has ``tenant`` and ``created_key`` (so ``by_tenant``
    lists it) but no ``status`` or ``tenant_status`` (so no scheduler index holds it)."""

    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    kind = UnicodeAttribute(null=True)  # "array" (a job row read through this model has none)
    tenant = UnicodeAttribute()
    created_key = UnicodeAttribute()
    owner = UnicodeAttribute()
    actor = UnicodeAttribute(null=True)
    spec = JSONAttribute()
    size = NumberAttribute()
    #: ``[start index of each parameter chunk]`` (empty: no parameters).
    chunks = JSONAttribute(null=True)
    expanded = NumberAttribute(default=0)
    cancel_requested = BooleanAttribute(default=False)
    cancel_reason = UnicodeAttribute(null=True)
    canceled_upto = NumberAttribute(default=0)
    created_at = UTCDateTimeAttribute()
    updated_at = UTCDateTimeAttribute()


class ArrayChunkRow(Model):
    """``<array id>#p<k>``: the parameters of tasks ``start..start+len-1``."""

    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    start = NumberAttribute()
    params = JSONAttribute()


class ArrayCounterRow(Model):
    """``<array id>#c<k>``: net moves into (+) and out of (-) each status of the array's tasks whose
    index is k modulo the shard count, written in the same transaction as each task's change."""

    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    QUEUED = NumberAttribute(null=True)
    STARTING = NumberAttribute(null=True)
    RUNNING = NumberAttribute(null=True)
    RETRYING = NumberAttribute(null=True)
    COMPLETED = NumberAttribute(null=True)
    FAILED = NumberAttribute(null=True)
    CANCELING = NumberAttribute(null=True)
    CANCELED = NumberAttribute(null=True)


class PendingArraysRow(Model):
    """``ARRAYS#PENDING`` in the Tenants table: the arrays the expander has work on (tasks to create
    or a bulk cancel to carry out)."""

    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    arrays = UnicodeSetAttribute(null=True)


@cache
def array_model(table_name: str) -> type[ArrayRow]:
    return _bind(ArrayRow, table_name)  # type: ignore[return-value]


@cache
def array_chunk_model(table_name: str) -> type[ArrayChunkRow]:
    return _bind(ArrayChunkRow, table_name)  # type: ignore[return-value]


@cache
def array_counter_model(table_name: str) -> type[ArrayCounterRow]:
    return _bind(ArrayCounterRow, table_name)  # type: ignore[return-value]


@cache
def pending_arrays_model(table_name: str) -> type[PendingArraysRow]:
    return _bind(PendingArraysRow, table_name)  # type: ignore[return-value]
