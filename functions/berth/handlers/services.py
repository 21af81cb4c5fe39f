"""The API's services wired to AWS, each built once per Lambda sandbox, and the verified caller.

Every router module (``berth.handlers.routes``) reaches the use cases through these factories, so
one request builds each service at most once and a test resets them all with ``cache_clear``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, cast

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent

from berth.dal.observability import CloudWatchLogReader
from berth.dal.outputs import S3OutputStore
from berth.dal.page_tokens import DynamoSigningKey, PageTokenCodec
from berth.dal.ratelimit import DynamoRateCounter
from berth.dal.storage import S3BundleStore, SecretsManagerCatalog
from berth.dal.tenants import DynamoTenantRepository
from berth.domain.errors import NotFound
from berth.domain.identity import Identity
from berth.domain.storage import StorageLayout
from berth.domain.tenancy import Caller
from berth.handlers import runtime
from berth.handlers.settings import settings
from berth.logic.arrays import ArrayService
from berth.logic.circuits import CircuitService
from berth.logic.fleet import FleetService
from berth.logic.jobs import JobService
from berth.logic.kept_answers import KeptAnswers
from berth.logic.observability import ObservabilityService
from berth.logic.outputs import OutputService
from berth.logic.plan import PlanService
from berth.logic.ratelimit import RateLimiter
from berth.logic.storage import StorageService
from berth.logic.team_queue import TeamQueueService
from berth.logic.tenants import TenantService
from berth.logic.usage import UsageService
from berth.logic.workflow import WorkflowHooks


def now() -> datetime:
    return datetime.now(UTC)


@cache
def jobs() -> JobService:
    cfg = settings()
    return JobService(
        jobs=runtime.job_repository(),  # the one job repository, shared with the workflow's services
        tenants=DynamoTenantRepository(cfg.tenants_table),
        clock=now,
        feasibility=fleet().check,
        access=storage().check_spec,
        idempotency_ttl=timedelta(seconds=cfg.idempotency_ttl_s),
        on_submitted=hooks().submitted,
        on_canceled=hooks().canceled,
    )


@cache
def tenants() -> TenantService:
    return TenantService(DynamoTenantRepository(settings().tenants_table))


@cache
def team_queues() -> TeamQueueService:
    repository = runtime.job_repository()
    return TeamQueueService(
        get_many=lambda ids: repository.get_many(ids, consistent=False),  # a view: eventual is enough
        summaries=runtime.queue_summaries(),
        tenants=DynamoTenantRepository(settings().tenants_table),
    )


@cache
def hooks() -> WorkflowHooks:
    return WorkflowHooks(
        tokens=runtime.task_tokens(),
        executions=runtime.executions(),
        settings=runtime.workflow_settings(),
        trigger=runtime.pass_trigger() if settings().scheduler_queue_url else None,
    )


@cache
def arrays() -> ArrayService:
    cfg = settings()
    return ArrayService(
        arrays=runtime.array_repository(),
        tenants=DynamoTenantRepository(cfg.tenants_table),
        clock=now,
        jobs=jobs(),
        trigger=runtime.pass_trigger() if cfg.scheduler_queue_url else None,
        idempotency_ttl=timedelta(seconds=cfg.idempotency_ttl_s),
    )


@cache
def fleet() -> FleetService:
    return FleetService(runtime.snapshot_source(), cache_s=settings().feasibility_cache_s)


def circuits() -> CircuitService:
    return CircuitService(runtime.snapshot_source())


@cache
def storage() -> StorageService:
    cfg = settings()
    return StorageService(
        layout=StorageLayout(artifacts_bucket=cfg.artifacts_bucket, data_bucket=cfg.data_bucket),
        bundles=S3BundleStore(cfg.artifacts_bucket),
        secrets=SecretsManagerCatalog(),
        tenants=DynamoTenantRepository(cfg.tenants_table),
    )


@cache
def plans() -> PlanService:
    return PlanService(
        source=runtime.snapshot_source(), clock=now, feasibility=fleet().check, access=storage().check_spec
    )


@cache
def outputs() -> OutputService:
    return OutputService(S3OutputStore(settings().data_bucket))


@cache
def observability() -> ObservabilityService:
    cfg = settings()
    tokens = PageTokenCodec(DynamoSigningKey(cfg.tenants_table), ttl_s=cfg.page_token_ttl_s)
    return ObservabilityService(
        jobs=jobs(),
        log_reader=CloudWatchLogReader(tokens),
        metric_store=runtime.metric_store(),
        log_group_prefix=cfg.job_log_group_prefix,
    )


@cache
def usage() -> UsageService:
    return UsageService(DynamoTenantRepository(settings().tenants_table), runtime.usage_ledger(), now)


@cache
def rate_limiter() -> RateLimiter:
    cfg = settings()
    return RateLimiter(
        DynamoRateCounter(cfg.tenants_table), cfg.rate_limit_requests, cfg.rate_limit_window_s, now
    )


@cache
def members() -> KeptAnswers[Identity, Caller]:
    """Verified members kept per sandbox for ``identity_cache_s`` (refusals never kept; by ARN and
    unique id): a member's removal or change of role takes effect within it."""
    return KeptAnswers(settings().identity_cache_s)


def caller(event: BaseProxyEvent) -> Caller:
    """The verified caller (ARN and unique id from the gateway), within its tenant's rate limit.
    ``event`` is a router's ``current_event``: the REST resolver's API Gateway proxy event."""
    identity = cast(APIGatewayProxyEvent, event).request_context.identity
    verified = members().get(Identity(arn=identity.user_arn, unique_id=identity.user), tenants().caller)
    rate_limiter().check(verified.tenant)
    return verified


def job_or_array(caller: Caller, job_id: str) -> Any:
    """The job, else the array of that id (an array's parent is not a job); 404 for neither."""
    try:
        return jobs().get(caller, job_id)
    except NotFound:
        array = arrays().find(caller, job_id) if ":" not in job_id else None
        if array is None:
            raise
        return array
