"""The workflow's services wired to AWS, built once per Lambda sandbox (shared by the API, the
workflow tasks, the scheduler, the agent API and the notifier)."""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime
from functools import cache

from berth.dal.arrays import DynamoArrayRepository
from berth.dal.batch import BotoBatchGateway, RateLimiter, SqsSubmitQueue
from berth.dal.checkpoints import S3CheckpointStore
from berth.dal.circuits import DynamoCircuitRepository
from berth.dal.credentials import StsCredentialVendor
from berth.dal.documents import DynamoDocumentRepository
from berth.dal.hosts import DynamoHostRepository
from berth.dal.jobs import DynamoJobRepository
from berth.dal.observability import DynamoMetricsRepository
from berth.dal.page_tokens import DynamoSigningKey, PageTokenCodec
from berth.dal.placements import DynamoPlacementWriter
from berth.dal.queue_summaries import DynamoQueueSummaries
from berth.dal.runtimes import DynamoRuntimeHistory
from berth.dal.tenants import DynamoTenantRepository
from berth.dal.usage import DynamoUsageLedger
from berth.dal.workflow import (
    EventBridgePublisher,
    SfnExecutions,
    SfnTaskTokens,
    SqsPassTrigger,
    SqsWorkQueues,
)
from berth.domain.batch_queues import CloudCapacity
from berth.domain.cloud import CloudSettings
from berth.domain.job_access import AccountScope
from berth.domain.storage import StorageLayout
from berth.domain.workflow import Backoff
from berth.handlers.settings import settings
from berth.handlers.telemetry import CountedCircuits
from berth.logic.agent import AgentService
from berth.logic.arrays import ArrayExpander
from berth.logic.cloud_dispatch import CloudDispatchService
from berth.logic.cloud_sweep import CloudSweep
from berth.logic.credentials import CredentialService
from berth.logic.host_identities import HostIdentities
from berth.logic.jobs import JobService
from berth.logic.scheduler_service import SchedulerService
from berth.logic.snapshot import QueueLimits, SnapshotSource
from berth.logic.tenants import TenantService
from berth.logic.workflow import WorkflowHooks, WorkflowService, WorkflowSettings


def now() -> datetime:
    return datetime.now(UTC)


@cache
def job_repository() -> DynamoJobRepository:
    cfg = settings()
    tokens = PageTokenCodec(DynamoSigningKey(cfg.tenants_table), ttl_s=cfg.page_token_ttl_s)
    return DynamoJobRepository(
        cfg.jobs_table,
        cfg.job_events_table,
        cfg.tenants_table,
        cfg.idempotency_table,
        tokens,
        arrays=array_repository(),
        usage=usage_ledger(),  # an ended attempt's usage record goes with the job's write
        hosts_table=cfg.hosts_table,  # and its GPU holds go back in it
    )


@cache
def array_repository() -> DynamoArrayRepository:
    cfg = settings()
    return DynamoArrayRepository(
        cfg.jobs_table, cfg.job_events_table, cfg.tenants_table, cfg.idempotency_table
    )


@cache
def array_expander() -> ArrayExpander:
    """The expander the scheduler's Lambda runs before each pass (logic/arrays.py)."""
    hooks = WorkflowHooks(
        tokens=task_tokens(),
        executions=executions(),
        settings=workflow_settings(),
        trigger=pass_trigger() if settings().scheduler_queue_url else None,
    )
    jobs = JobService(
        jobs=job_repository(), tenants=tenant_repository(), clock=now, on_canceled=hooks.canceled
    )
    return ArrayExpander(
        arrays=array_repository(),
        jobs=jobs,
        executions=executions(),
        clock=now,
        workflow_input=workflow_settings().execution_input,
        budget_s=settings().array_budget_s,
    )


@cache
def host_repository() -> DynamoHostRepository:
    return DynamoHostRepository(settings().hosts_table)


@cache
def tenant_repository() -> DynamoTenantRepository:
    return DynamoTenantRepository(settings().tenants_table)


@cache
def host_identities() -> HostIdentities:
    """The agent API's verified host identities, kept per sandbox (``identity_cache_s``)."""
    return HostIdentities(TenantService(tenant_repository()).host, ttl_s=settings().identity_cache_s)


@cache
def usage_ledger() -> DynamoUsageLedger | None:
    table = settings().usage_table
    return DynamoUsageLedger(table) if table else None


@cache
def runtime_history() -> DynamoRuntimeHistory:
    """The tenants' run-time histories: read by each pass (the snapshot's predictor), learnt by the
    job-events stream's consumer (the notifier) from the completed runs it reads."""
    return DynamoRuntimeHistory(settings().tenants_table)


@cache
def workflow_settings() -> WorkflowSettings:
    cfg = settings()
    return WorkflowSettings(
        heartbeat_s=cfg.heartbeat_s,
        lease_s=cfg.lease_s,
        outage_tolerance_s=cfg.outage_tolerance_s,
        fence_margin_s=cfg.fence_margin_s,
        claim_s=cfg.claim_s,
        backoff=Backoff(base_s=cfg.backoff_base_s, cap_s=cfg.backoff_cap_s),
        orphan_grace_s=cfg.orphan_grace_s,
    )


@cache
def snapshot_source() -> SnapshotSource:
    cfg = settings()
    return SnapshotSource(
        jobs=job_repository(),
        tenants=tenant_repository(),
        hosts=host_repository(),
        documents=DynamoDocumentRepository(cfg.tenants_table),
        clock=now,
        cloud_enabled=cfg.cloud_enabled,
        usage=usage_ledger(),
        circuits=DynamoCircuitRepository(cfg.tenants_table),
        runtimes=runtime_history(),
        capacity=CloudCapacity.from_json(cfg.cloud_capacity) if cfg.cloud_capacity else None,
        queue=QueueLimits(
            read_budget=cfg.queue_read_budget,
            min_head=cfg.queue_min_head,
            read_deadline_s=cfg.queue_read_deadline_s,
        ),
    )


@cache
def task_tokens() -> SfnTaskTokens:
    return SfnTaskTokens()


@cache
def work_queues() -> SqsWorkQueues:
    return SqsWorkQueues(settings().host_queue_prefix)


@cache
def pass_trigger() -> SqsPassTrigger:
    return SqsPassTrigger(settings().scheduler_queue_url)


@cache
def executions() -> SfnExecutions | None:
    arn = settings().state_machine_arn
    return SfnExecutions(arn) if arn else None


@cache
def event_publisher() -> EventBridgePublisher:
    return EventBridgePublisher(settings().event_bus_name)


@cache
def workflow_service() -> WorkflowService:
    return WorkflowService(
        jobs=job_repository(),
        hosts=host_repository(),
        tokens=task_tokens(),
        queues=work_queues(),
        clock=now,
        settings=workflow_settings(),
        usage=usage_ledger(),
    )


@cache
def scheduler_service() -> SchedulerService:
    cloud = cloud_dispatch_service()
    return SchedulerService(
        source=snapshot_source(),
        jobs=job_repository(),
        hosts=host_repository(),
        placements=DynamoPlacementWriter(job_repository(), host_repository()),
        tokens=task_tokens(),
        trigger=pass_trigger(),
        clock=now,
        new_token=lambda: secrets.token_urlsafe(18),
        settings=workflow_settings(),
        executions=executions(),
        execution_repair_s=settings().execution_repair_s,
        usage=usage_ledger(),
        cloud=None if cloud is None else CloudSweep(cloud),
        queue_summaries=queue_summaries(),
    )


@cache
def queue_summaries() -> DynamoQueueSummaries:
    return DynamoQueueSummaries(settings().tenants_table)


@cache
def credential_service() -> CredentialService | None:
    """Attempts' scoped credentials from the job role (its ARN names the partition and account)."""
    cfg = settings()
    if not cfg.job_role_arn:
        return None
    partition, account = cfg.job_role_arn.split(":")[1], cfg.job_role_arn.split(":")[4]
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return CredentialService(
        layout=StorageLayout(artifacts_bucket=cfg.artifacts_bucket, data_bucket=cfg.data_bucket),
        scope=AccountScope(partition=partition, region=region, account=account),
        tenants=tenant_repository(),
        vendor=StsCredentialVendor(cfg.job_role_arn),
        grants_cache_s=cfg.credential_grants_cache_s,
    )


@cache
def agent_service() -> AgentService:
    return AgentService(
        jobs=job_repository(),
        hosts=host_repository(),
        tokens=task_tokens(),
        queues=work_queues(),
        trigger=pass_trigger(),
        clock=now,
        settings=workflow_settings(),
        vendor=credential_service(),
        metric_store=metric_store(),
        usage=usage_ledger(),  # the last rank's report completes the job with its final record
    )


@cache
def metric_store() -> DynamoMetricsRepository | None:
    table = settings().job_metrics_table
    return DynamoMetricsRepository(table) if table else None


@cache
def cloud_dispatch_service() -> CloudDispatchService | None:
    """The cloud branch (AWS Batch); None where no submit queue is deployed."""
    cfg = settings()
    if not cfg.batch_submit_queue_url:
        return None
    share = cfg.batch_submit_rate / max(1, cfg.batch_submit_concurrency)
    return CloudDispatchService(
        jobs=job_repository(),
        tokens=task_tokens(),
        batch=BotoBatchGateway(cfg.batch_submit_role_arn, RateLimiter(share)),
        submits=SqsSubmitQueue(cfg.batch_submit_queue_url),
        circuits=CountedCircuits(DynamoCircuitRepository(cfg.tenants_table)),
        clock=now,
        settings=CloudSettings(
            base_image=cfg.batch_base_image,
            artifacts_bucket=cfg.artifacts_bucket,
            data_bucket=cfg.data_bucket,
            runnable_timeout_s=cfg.runnable_timeout_s,
            submit_grace_s=cfg.batch_submit_grace_s,
            event_grace_s=cfg.batch_event_grace_s,
            account=cfg.account_id,
            partition=cfg.partition,
            endpoint_url=cfg.batch_endpoint_url or None,
            # the tenants' secrets live in the control plane's region (Lambda sets AWS_REGION)
            home_region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "",
        ),
        # read by the Batch events function only (on an attempt's end), the one granted the listing
        checkpoints=S3CheckpointStore(cfg.data_bucket) if cfg.data_bucket else None,
    )
