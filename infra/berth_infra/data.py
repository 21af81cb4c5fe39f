"""DynamoDB tables. Key schemas are a contract with ``berth.dal`` (pynamodb models): change both together."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as ddb
from constructs import Construct

_S = ddb.AttributeType.STRING
_N = ddb.AttributeType.NUMBER


def _table(
    scope: Construct,
    construct_id: str,
    *,
    partition_key: str,
    sort_key: tuple[str, ddb.AttributeType] | None = None,
    ttl_attribute: str | None = None,
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    stream: ddb.StreamViewType | None = None,
) -> ddb.Table:
    """A table with Berth's baseline: on-demand, PITR, AWS-managed KMS encryption, retained on delete."""
    return ddb.Table(
        scope,
        construct_id,
        partition_key=ddb.Attribute(name=partition_key, type=_S),
        sort_key=ddb.Attribute(name=sort_key[0], type=sort_key[1]) if sort_key else None,
        billing_mode=ddb.BillingMode.PAY_PER_REQUEST,
        point_in_time_recovery_specification=ddb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        encryption=ddb.TableEncryption.AWS_MANAGED,
        time_to_live_attribute=ttl_attribute,
        removal_policy=removal_policy,
        stream=stream,
    )


class DataTables(Construct):
    """The control plane's state: jobs, their event history, tenants and quotas, idempotency records."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)

        # Jobs: one item per job. GSIs serve `GET /v1/jobs` per tenant, optionally filtered by status
        # (`tenant_status` = "<tenant>#<STATUS>"; keys only, the page is read with BatchGetItem), the
        # scheduler's queue (`by_queue`: sparse, only QUEUED jobs carry `queue_pk` = "<tenant>#<shard>",
        # ordered by `queue_sk` = "<priority>#<created>#<id>", projecting the compact entry the core
        # reads) and the jobs holding capacity (`by_placed`: sparse, `placed_status`). `created_key`
        # sorts newest/oldest and is unique. docs/scheduling.md, "The queue index".
        self.jobs = _table(self, "JobsTable", partition_key="job_id")
        self.jobs_index_names = ("by_tenant", "by_tenant_status", "by_queue", "by_placed")
        for index_name, partition in (("by_tenant", "tenant"), ("by_tenant_status", "tenant_status")):
            self.jobs.add_global_secondary_index(
                index_name=index_name,
                partition_key=ddb.Attribute(name=partition, type=_S),
                sort_key=ddb.Attribute(name="created_key", type=_S),
                projection_type=ddb.ProjectionType.KEYS_ONLY,
            )
        self.jobs.add_global_secondary_index(
            index_name="by_queue",
            partition_key=ddb.Attribute(name="queue_pk", type=_S),
            sort_key=ddb.Attribute(name="queue_sk", type=_S),
            projection_type=ddb.ProjectionType.INCLUDE,
            non_key_attributes=["version", "reason", "queue_entry"],
        )
        self.jobs.add_global_secondary_index(
            index_name="by_placed",
            partition_key=ddb.Attribute(name="placed_status", type=_S),
            sort_key=ddb.Attribute(name="created_key", type=_S),
            projection_type=ddb.ProjectionType.ALL,
        )

        # Job events: the state history of a job, ordered by a per-job sequence number.
        # Its stream is the notifications' outbox: the notifier publishes each new event row.
        self.job_events = _table(
            self,
            "JobEventsTable",
            partition_key="job_id",
            sort_key=("seq", _N),
            stream=ddb.StreamViewType.NEW_IMAGE,
        )

        # Tenants: tenant records, quotas and principal mappings (single-table style, generic `pk`), and
        # the per-tenant rate-limit windows (RATE#...), which expire through TTL.
        self.tenants = _table(self, "TenantsTable", partition_key="pk", ttl_attribute="expires_at")
        # `by_directory` (sparse, keys only): every TENANT# item carries `directory` = "T", set once, so
        # the scheduler lists the tenants in one Query without scanning the table's other items.
        self.tenants.add_global_secondary_index(
            index_name="by_directory",
            partition_key=ddb.Attribute(name="directory", type=_S),
            sort_key=ddb.Attribute(name="pk", type=_S),
            projection_type=ddb.ProjectionType.KEYS_ONLY,
        )
        self.tenants_index_names = ("by_directory",)

        # Hosts: the on-prem fleet, one item per host (inventory, health, lease, the set of free GPU
        # UUIDs and each running attempt's hold; a GPU moves between them in one conditional write).
        self.hosts = _table(self, "HostsTable", partition_key="host_id")

        # Idempotency: Powertools' default persistence schema (`id` key, `expiration` TTL). The records
        # are disposable (they expire), so this table is destroyed with the stack.
        self.idempotency = _table(
            self,
            "IdempotencyTable",
            partition_key="id",
            ttl_attribute="expiration",
            removal_policy=RemovalPolicy.DESTROY,
        )

        # Job metrics: attempts' usage samples (``sk`` = "<attempt>#<epoch ms>#<host>"), sent by the
        # agents through the agent API, read by GET /v1/jobs/{id}/metrics; they expire (TTL), so the
        # table is destroyed with the stack.
        self.job_metrics = _table(
            self,
            "JobMetricsTable",
            partition_key="job_id",
            sort_key=("sk", _S),
            ttl_attribute="expires_at",
            removal_policy=RemovalPolicy.DESTROY,
        )

        # Usage: the ledger, one item per job attempt (GPU-hours, cost), keyed "<tenant>#<YYYY-MM>" /
        # "<job_id>#<attempt>", so a tenant's month is one Query.
        self.usage = _table(self, "UsageTable", partition_key="pk", sort_key=("sk", _S))

    @property
    def all_tables(self) -> list[ddb.Table]:
        return [
            self.jobs,
            self.job_events,
            self.tenants,
            self.hosts,
            self.idempotency,
            self.job_metrics,
            self.usage,
        ]
