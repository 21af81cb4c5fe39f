"""The public HTTP API Lambda (API Gateway REST, AWS_IAM). Thin: parse, call one service, map.

Routes are declared with Powertools' REST resolver with validation on; the OpenAPI document in
``docs/openapi.json`` is generated from them (``python -m berth.handlers.openapi``).
"""

import json
import re
import warnings
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Annotated, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from berth.dal.observability import CloudWatchLogReader
from berth.dal.outputs import S3OutputStore
from berth.dal.page_tokens import DynamoSigningKey, PageTokenCodec
from berth.dal.ratelimit import DynamoRateCounter
from berth.dal.storage import S3BundleStore, SecretsManagerCatalog
from berth.dal.tenants import DynamoTenantRepository
from berth.domain.arrays import ARRAY_ID_RE, JobArray
from berth.domain.errors import (
    DomainError,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    RequestInProgress,
)
from berth.domain.fleet import HOST_ID_RE
from berth.domain.identity import Identity
from berth.domain.job_filter import NAME_FILTER_RE, JobFilter
from berth.domain.job_spec import FIELD_CHOICES, FIELD_FORMS, JobSpec, defaults_applied
from berth.domain.observability import parse_since
from berth.domain.placement import Site
from berth.domain.queue_summary import no_queue_view
from berth.domain.status import JobStatus
from berth.domain.storage import DATASET_NAME_RE, DataGrants, Dataset, StorageLayout
from berth.domain.tenancy import TENANT_RE, Caller, Quota, Role
from berth.handlers import runtime, schemas, telemetry
from berth.handlers.errors import BodyModel, error_response, from_domain, from_validation
from berth.handlers.request_guard import body_problem, with_canonical_content_type
from berth.handlers.settings import settings
from berth.logic.arrays import ArrayService
from berth.logic.circuits import INSTANCE_TYPE_RE, REGION_RE, CircuitService
from berth.logic.fleet import FleetService, document_out
from berth.logic.gpu_faults import clear_gpu_fault
from berth.logic.jobs import JobService
from berth.logic.observability import ObservabilityService
from berth.logic.outputs import OutputService
from berth.logic.plan import PlanService
from berth.logic.queue_view import with_queue
from berth.logic.ratelimit import RateLimiter
from berth.logic.snapshot import OFFERS, POLICY
from berth.logic.storage import StorageService
from berth.logic.tenants import TenantService
from berth.logic.usage import MONTH_RE, UsageService
from berth.logic.workflow import WorkflowHooks

logger = Logger()
tracer = Tracer()
metrics = Metrics(namespace="Berth")
app = APIGatewayRestResolver(enable_validation=True)
app.configure_openapi(
    title="Berth API",
    version="1.0.0",
    summary="Hybrid-cloud GPU allocation for ML training jobs",
    description="Every route is signed with AWS SigV4 (service `execute-api`). Errors are "
    '`{"error": {"code", "message", "details"}}`.',
)

IDEMPOTENCY_KEY_MAX = 128
# Reads publish no business metrics; that is expected, not worth a warning per request.
warnings.filterwarnings("ignore", "No application metrics to publish", UserWarning)


def _now() -> datetime:
    return datetime.now(UTC)


@cache
def _services() -> tuple[JobService, TenantService]:
    cfg = settings()
    tenants = DynamoTenantRepository(cfg.tenants_table)
    jobs = JobService(
        jobs=_job_repository(),
        tenants=tenants,
        clock=_now,
        feasibility=_fleet().check,
        access=_storage().check_spec,
        idempotency_ttl=timedelta(seconds=cfg.idempotency_ttl_s),
        on_submitted=_hooks().submitted,
        on_canceled=_hooks().canceled,
    )
    return jobs, TenantService(tenants)


@cache
def _hooks() -> WorkflowHooks:
    return WorkflowHooks(
        tokens=runtime.task_tokens(),
        executions=runtime.executions(),
        settings=runtime.workflow_settings(),
        trigger=runtime.pass_trigger() if settings().scheduler_queue_url else None,
    )


#: The one job repository of this configuration (shared with the workflow's services).
_job_repository = runtime.job_repository


@cache
def _fleet() -> FleetService:
    return FleetService(runtime.snapshot_source(), cache_s=settings().feasibility_cache_s)


@cache
def _storage() -> StorageService:
    cfg = settings()
    return StorageService(
        layout=StorageLayout(artifacts_bucket=cfg.artifacts_bucket, data_bucket=cfg.data_bucket),
        bundles=S3BundleStore(cfg.artifacts_bucket),
        secrets=SecretsManagerCatalog(),
        tenants=DynamoTenantRepository(cfg.tenants_table),
    )


@cache
def _rate_limiter() -> RateLimiter:
    cfg = settings()
    return RateLimiter(
        DynamoRateCounter(cfg.tenants_table), cfg.rate_limit_requests, cfg.rate_limit_window_s, _now
    )


#: The job (or array) ``submit_once`` created or found in this request: the answer, without reading
#: it again. Unset when Powertools answered from its record (a replay), which reads it afresh.
_submitted: ContextVar[Any] = ContextVar("submitted", default=None)


@cache
def _idempotent_submit() -> Any:
    cfg = settings()
    config = IdempotencyConfig(
        event_key_jmespath="[tenant, key]",
        payload_validation_jmespath="spec",
        expires_after_seconds=cfg.idempotency_ttl_s,
        raise_on_no_idempotency_key=True,
    )
    store = DynamoDBPersistenceLayer(table_name=cfg.idempotency_table)

    @idempotent_function(data_keyword_argument="request", persistence_store=store, config=config)
    def submit_once(request: dict[str, Any]) -> dict[str, Any]:
        caller = Caller(
            principal=request["principal"],
            tenant=request["tenant"],
            role=Role(request["role"]),
            actor=request["actor"],
        )
        spec = JobSpec.model_validate(request["spec"])
        if spec.array is not None:
            created: Any = _arrays().submit(caller, spec, request["key"])
        else:
            created = _services()[0].submit(caller, spec, request["key"])
        _submitted.set(created)
        return {"job_id": created.id}

    return submit_once, config


def _caller() -> Caller:
    """The verified caller (ARN and unique id from the gateway), within its tenant's rate limit."""
    identity = app.current_event.request_context.identity
    caller = _services()[1].caller(Identity(arn=identity.user_arn, unique_id=identity.user))
    _rate_limiter().check(caller.tenant)
    return caller


def _json(status: int, body: Any) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


# -- jobs -----------------------------------------------------------------------------------------
@app.post(
    "/v1/jobs",
    summary="Submit a training job or a job array",
    description="Optional `Idempotency-Key` header: the same key and body return the same job; "
    "the same key with another body answers 409. A spec with `array` is stored whole (or refused "
    "whole) and answered at once with the array; its tasks `<array id>:<i>` are created in the "
    "background.",
    responses={
        201: {
            "description": "Job accepted",
            "content": {"application/json": {"model": schemas.SubmittedJobOut}},
        },
        **schemas.error_responses(400, 403, 409, 415, 422, 429),
    },
    tags=["jobs"],
)
@tracer.capture_method(capture_response=False)  # the job holds the spec, env included
def submit_job(spec: Annotated[JobSpec, Body(embed=False)]) -> Response[Any]:
    caller = _caller()
    jobs, _ = _services()
    key = app.current_event.headers.get("Idempotency-Key")
    if spec.array_task is not None:
        raise InvalidRequest("array_task is set by Berth on an array's tasks; submit an 'array' instead")
    if key is None:
        job = _arrays().submit(caller, spec) if spec.array is not None else jobs.submit(caller, spec)
    else:
        if not key or len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
            raise InvalidRequest(f"Idempotency-Key must be 1..{IDEMPOTENCY_KEY_MAX} printable characters")
        submit_once, _config = _idempotent_submit()
        request = {
            "tenant": caller.tenant,
            "key": key,
            "principal": caller.principal,
            "role": str(caller.role),
            "actor": caller.actor,
            "spec": spec.model_dump(mode="json"),
        }
        _submitted.set(None)
        try:
            job_id = submit_once(request=request)["job_id"]
        except IdempotencyValidationError as exc:
            raise IdempotencyMismatch(
                "this Idempotency-Key was already used with a different job spec; use a new key"
            ) from exc
        except IdempotencyAlreadyInProgressError as exc:
            raise RequestInProgress(
                "a request with this Idempotency-Key is still in progress; retry shortly"
            ) from exc
        created = _submitted.get()
        _submitted.set(None)
        job = created if created is not None and created.id == job_id else _job_or_array(caller, job_id)
    metrics.add_metric(name="JobsSubmitted", unit=MetricUnit.Count, value=1)
    if spec.array is not None:
        metrics.add_metric(name="ArrayTasksSubmitted", unit=MetricUnit.Count, value=spec.array.count)
    logger.info("job submitted", extra={"job_id": job.id, "tenant": job.tenant})
    # Not ranked by a pass yet: the queue fields are there, empty (no read on the submit path).
    return _json(201, {**job.public(), **no_queue_view(), "defaults_applied": defaults_applied(spec)})


@app.get(
    "/v1/jobs",
    summary="List a tenant's jobs, newest first (your own; admins: any tenant's with `tenant`, "
    "every tenant's with `all_tenants`)",
    description="`since` is applied in the query (pages stay full); `name` and `site` are applied to "
    "each page read, so a page may hold fewer than `limit` jobs while `next_token` says there is more.",
    responses={
        200: {"description": "A page of jobs", "content": {"application/json": {"model": schemas.JobList}}},
        **schemas.error_responses(400, 403, 422, 429),
    },
    tags=["jobs"],
)
def list_jobs(
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status")] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 50,
    next_token: Annotated[str | None, Query(max_length=2048, description="From the previous page")] = None,
    tenant: Annotated[
        str | None,
        Query(
            pattern=TENANT_RE, description="Whose jobs (default: the caller's tenant; others: admins only)"
        ),
    ] = None,
    all_tenants: Annotated[
        bool, Query(description="Every tenant's jobs, newest first (admins only; not with `tenant`)")
    ] = False,
    since: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Only jobs created at or after this time: epoch ms or ISO 8601 with a zone "
            "(else 400)",
        ),
    ] = None,
    name: Annotated[
        str | None,
        Query(
            pattern=NAME_FILTER_RE,
            description="Only jobs whose name contains this, or matches it as a glob when it has `*`, "
            "`?` or `[` (`resnet-*`)",
        ),
    ] = None,
    site: Annotated[Site | None, Query(description="Only jobs placed at this site")] = None,
    array: Annotated[
        str | None,
        Query(
            pattern=ARRAY_ID_RE,
            description="List this array's created tasks in index order instead (`status`, `tenant` and "
            "the other filters do not apply; `next_token` is the next index)",
        ),
    ] = None,
) -> Response[Any]:
    if array is not None:
        if status is not None or tenant is not None or all_tenants or since or name or site:
            raise InvalidRequest(
                "array cannot be combined with status, tenant, all_tenants, since, name or site"
            )
        tasks, token = _arrays().tasks(_caller(), array, limit, next_token)
        return _json(200, {"jobs": _with_queue(tasks), "next_token": token})
    after = None if since is None else datetime.fromtimestamp(parse_since(since) / 1000, UTC)
    filters = JobFilter(since=after, name=name, site=site)
    page = _services()[0].list_jobs(
        _caller(), status, limit, next_token, tenant=tenant, filters=filters, all_tenants=all_tenants
    )
    return _json(200, {"jobs": _with_queue(page.jobs), "next_token": page.next_token})


def _with_queue(items: Any) -> list[dict[str, Any]]:
    """Jobs (or arrays) as the API returns them, a queued job with its place in its team's queue
    (one read of the team's queue summary per answer; ``berth.logic.queue_view``)."""
    return with_queue((i.public() for i in items), runtime.queue_summaries())


JobId = Annotated[
    str, Path(pattern=r"^j-[0-9a-z]{26}(:[0-9]{1,5})?$", description="Job, array or array task id")
]


@cache
def _arrays() -> ArrayService:
    cfg = settings()
    return ArrayService(
        arrays=runtime.array_repository(),
        tenants=DynamoTenantRepository(cfg.tenants_table),
        clock=_now,
        jobs=_services()[0],
        trigger=runtime.pass_trigger() if cfg.scheduler_queue_url else None,
        idempotency_ttl=timedelta(seconds=cfg.idempotency_ttl_s),
    )


def _job_or_array(caller: Caller, job_id: str) -> Any:
    """The job, else the array of that id (an array's parent is not a job); 404 for neither."""
    try:
        return _services()[0].get(caller, job_id)
    except NotFound:
        array = _arrays().find(caller, job_id) if ":" not in job_id else None
        if array is None:
            raise
        return array


@app.get(
    "/v1/jobs/<job_id>",
    summary="Get a job, an array (with `array: {size, counts, created}`) or an array task",
    responses={
        200: {"description": "The job", "content": {"application/json": {"model": schemas.JobOut}}},
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["jobs"],
)
def get_job(job_id: JobId) -> Response[Any]:
    return _json(200, _with_queue([_job_or_array(_caller(), job_id)])[0])


@app.post(
    "/v1/jobs/<job_id>/cancel",
    summary="Cancel a job or a whole array",
    description="Queued jobs become CANCELED at once; placed ones CANCELING until the executor stops "
    "them. Repeating a cancel is harmless. An array's id cancels every task not yet ended, created or "
    "not: the answer is the array, and its counts move as the expander reaches each task.",
    responses={
        202: {"description": "Cancel accepted", "content": {"application/json": {"model": schemas.JobOut}}},
        **schemas.error_responses(403, 404, 409, 422, 429),
    },
    tags=["jobs"],
)
def cancel_job(job_id: JobId) -> Response[Any]:
    caller = _caller()
    try:
        return _json(202, _with_queue([_services()[0].cancel(caller, job_id)])[0])
    except NotFound:
        if ":" in job_id:
            raise
    # An array: every task not yet ended is canceled, created or not (in the background).
    return _json(202, _with_queue([_arrays().cancel(caller, job_id)])[0])


@app.get(
    "/v1/jobs/<job_id>/events",
    summary="A job's state history, oldest first",
    responses={
        200: {"description": "State changes", "content": {"application/json": {"model": schemas.EventList}}},
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["jobs"],
)
def job_events(job_id: JobId) -> Response[Any]:
    events = _services()[0].events(_caller(), job_id)
    return _json(200, {"events": [e.public() for e in events]})


@app.get(
    "/v1/jobs/<job_id>/explain",
    summary="Why a job is pending, or where it was placed",
    description="For a queued job: the scheduler core's outcome for it in a pass over the store now "
    "(the rule ids in order, every candidate site and the rule that kept the job off it, its "
    "fair-share rank). The same tenant check as `GET /v1/jobs/{id}`.",
    responses={
        200: {
            "description": "The explanation",
            "content": {"application/json": {"model": schemas.ExplainOut}},
        },
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["jobs"],
)
def explain(job_id: JobId) -> Response[Any]:
    caller = _caller()
    return _json(200, _fleet().explain(_services()[0], caller, job_id))


@cache
def _plans() -> PlanService:
    return PlanService(
        source=runtime.snapshot_source(),
        clock=_now,
        feasibility=_fleet().check,
        access=_storage().check_spec,
    )


@app.post(
    "/v1/jobs/plan",
    summary="Dry run: validate a job spec and show where the scheduler would run it now",
    description="The same checks and 4xx answers as `POST /v1/jobs`; then the scheduler core's "
    "outcome for the spec in a pass over the store now (as one more queued job of the caller's "
    "tenant): where it would run, or why it would wait, the hourly price and the cost limits. "
    "Nothing is stored: no job, no event, no quota use.",
    responses={
        200: {"description": "The plan", "content": {"application/json": {"model": schemas.PlanOut}}},
        **schemas.error_responses(400, 403, 415, 422, 429),
    },
    tags=["jobs"],
)
def plan_job(spec: Annotated[JobSpec, Body(embed=False)]) -> Response[Any]:
    return _json(200, _plans().plan(_caller(), spec))


@cache
def _outputs() -> OutputService:
    return OutputService(S3OutputStore(settings().data_bucket))


@app.get(
    "/v1/jobs/<job_id>/outputs",
    summary="Where a job's outputs and checkpoints are, with a presigned GET for each object",
    description="Lists `<tenant>/jobs/<job>/` in the data bucket (`outputs/` and `checkpoints/`, "
    "written by the job's executor), key order, each object with a GET URL valid for "
    "`url_expires_in_s`. An array's id lists every task's. The same tenant check as "
    "`GET /v1/jobs/{id}`.",
    responses={
        200: {
            "description": "A page of objects",
            "content": {"application/json": {"model": schemas.OutputsOut}},
        },
        **schemas.error_responses(400, 403, 404, 422, 429),
    },
    tags=["jobs"],
)
def job_outputs(
    job_id: JobId,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size")] = 1000,
    next_token: Annotated[str | None, Query(max_length=1024, description="From the previous page")] = None,
) -> Response[Any]:
    found = _job_or_array(_caller(), job_id)
    is_array = isinstance(found, JobArray)
    return _json(200, _outputs().list(found.tenant, found.id, is_array, limit, next_token))


@cache
def _observability() -> ObservabilityService:
    cfg = settings()
    tokens = PageTokenCodec(DynamoSigningKey(cfg.tenants_table), ttl_s=cfg.page_token_ttl_s)
    return ObservabilityService(
        jobs=_services()[0],
        log_reader=CloudWatchLogReader(tokens),
        metric_store=runtime.metric_store(),
        log_group_prefix=cfg.job_log_group_prefix,
    )


Attempt = Annotated[int | None, Query(ge=1, le=1000, description="Which attempt (default: the latest)")]


@app.get(
    "/v1/jobs/<job_id>/logs",
    summary="A job's output (stdout and stderr), oldest first, one attempt at a time",
    description="Reads the attempt's CloudWatch Logs stream in `/berth/jobs/<tenant>`: "
    "`<job_id>/<attempt>` on-prem, the stream AWS Batch named (`batch/default/<task id>`) in the "
    "cloud; until Batch has named it the page is empty and `reason` says why. `since` is epoch "
    "milliseconds or an ISO 8601 time with a zone. Pass "
    "`next_token` (with the same `attempt`) to continue; it is returned even at the end of what is "
    "there now, so a follower polls with it until `status` is terminal and a page comes back empty. "
    "A page holds at most `limit` events and about 2 MiB of their JSON, whichever comes first; a "
    "line longer than that is cut, ending with `[... N more characters of this line not shown: "
    "longer than one page of logs]`. "
    "`rank` reads one node of a gang (`resources.nodes` > 1): in the cloud each node of the AWS Batch "
    "multi-node job has its own stream (default: rank 0, the main node); on-prem every rank writes "
    "the attempt's one stream. A rank outside the gang is 422. "
    "The same tenant check as `GET /v1/jobs/{id}`.",
    responses={
        200: {"description": "A page of output", "content": {"application/json": {"model": schemas.LogsOut}}},
        **schemas.error_responses(400, 403, 404, 422, 429),
    },
    tags=["jobs"],
)
def job_logs(
    job_id: JobId,
    attempt: Attempt = None,
    since: Annotated[
        str | None, Query(min_length=1, max_length=40, description="Epoch ms or ISO 8601 time")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Most events in the page")] = 200,
    next_token: Annotated[str | None, Query(max_length=4096, description="From the previous page")] = None,
    rank: Annotated[
        int | None, Query(ge=0, le=1000, description="A gang's node (default: 0, the main node)")
    ] = None,
) -> Response[Any]:
    caller = _caller()
    since_ms = None if since is None else parse_since(since)
    page = _observability().logs(caller, job_id, attempt, since_ms, limit, next_token, rank)
    return _json(200, page)


@app.get(
    "/v1/jobs/<job_id>/metrics",
    summary="A job's GPU, CPU and memory samples for one attempt, with a summary",
    description="Samples the agent took (NVML for GPUs, `/proc` for the job's processes), oldest "
    "first: the latest `limit` of them; the summary covers all of the attempt's samples. The same "
    "tenant check as `GET /v1/jobs/{id}`.",
    responses={
        200: {"description": "Samples", "content": {"application/json": {"model": schemas.MetricsOut}}},
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["jobs"],
)
def job_metrics(
    job_id: JobId,
    attempt: Attempt = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Most samples returned")] = 1000,
) -> Response[Any]:
    caller = _caller()
    return _json(200, _observability().metrics(caller, job_id, attempt, limit))


# -- fleet and policy -----------------------------------------------------------------------------
@app.get(
    "/v1/capacity",
    summary="The fleet now: pools, hosts, free and used GPUs; cloud regions and circuit state",
    responses={
        200: {"description": "Capacity", "content": {"application/json": {"model": schemas.CapacityOut}}},
        **schemas.error_responses(403, 429),
    },
    tags=["fleet and policy"],
)
def capacity() -> Response[Any]:
    return _json(200, _fleet().capacity(_caller()))


Version = Annotated[
    int | None, Query(ge=0, le=100_000_000, description="A stored version (default: the current one)")
]
IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        pattern=r"^\d{1,9}$",
        description="The version this replaces; 409 if another was stored since",
    ),
]


def _get_document(kind: str, version: int | None) -> Response[Any]:
    return _json(200, document_out(_fleet().get_document(_caller(), kind, version)))


def _put_document(kind: str, document: dict[str, Any], if_match: str | None) -> Response[Any]:
    caller = _caller()
    expected = None if if_match is None else int(if_match)
    return _json(200, document_out(_fleet().put_document(caller, kind, document, expected)))


def _doc_response(description: str) -> OpenAPIResponse:
    return {"description": description, "content": {"application/json": {"model": schemas.DocumentOut}}}


@app.get(
    "/v1/policy",
    summary="The organisation's scheduling policy (the current version, or an older one)",
    responses={
        200: _doc_response("The policy"),
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["fleet and policy"],
)
def get_policy(version: Version = None) -> Response[Any]:
    return _get_document(POLICY, version)


@app.put(
    "/v1/policy",
    summary="Replace the scheduling policy (admins only); stored as a new version, the old one kept",
    responses={
        200: _doc_response("The new version"),
        **schemas.error_responses(400, 403, 409, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_policy(
    document: Annotated[dict[str, Any], Body(embed=False)], if_match: IfMatch = None
) -> Response[Any]:
    return _put_document(POLICY, document, if_match)


@app.get(
    "/v1/offers",
    summary="The cloud offers the scheduler may buy (the current version, or an older one)",
    responses={
        200: _doc_response("The offers"),
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["fleet and policy"],
)
def get_offers(version: Version = None) -> Response[Any]:
    return _get_document(OFFERS, version)


@app.put(
    "/v1/offers",
    summary="Replace the cloud offers (admins only); stored as a new version, the old one kept",
    responses={
        200: _doc_response("The new version"),
        **schemas.error_responses(400, 403, 409, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_offers(
    document: Annotated[dict[str, Any], Body(embed=False)], if_match: IfMatch = None
) -> Response[Any]:
    return _put_document(OFFERS, document, if_match)


# -- tenants --------------------------------------------------------------------------------------
Tenant = Annotated[str, Path(pattern=TENANT_RE, description="Tenant (team) name")]


@app.get(
    "/v1/tenants/<tenant>/quota",
    summary="A tenant's quota (admins: any tenant; members: their own)",
    responses={
        200: {"description": "The quota", "content": {"application/json": {"model": Quota}}},
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["tenants"],
)
def get_quota(tenant: Tenant) -> Response[Any]:
    return _json(200, _services()[1].get_quota(_caller(), tenant).model_dump(mode="json"))


@app.put(
    "/v1/tenants/<tenant>/quota",
    summary="Set a tenant's quota (admins only)",
    responses={
        200: {"description": "The new quota", "content": {"application/json": {"model": Quota}}},
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["tenants"],
)
def put_quota(tenant: Tenant, quota: Annotated[Quota, Body(embed=False)]) -> Response[Any]:
    return _json(200, _services()[1].put_quota(_caller(), tenant, quota).model_dump(mode="json"))


# -- code and data --------------------------------------------------------------------------------
@app.post(
    "/v1/bundles",
    summary="Ask to upload a code bundle (content-addressed, per tenant)",
    description="Answers 200 `{present: true}` when the tenant already stored this digest, else 201 "
    "with a presigned upload that S3 accepts only for content of this size and SHA-256, once.",
    responses={
        200: {"description": "Already stored", "content": {"application/json": {"model": schemas.BundleOut}}},
        201: {"description": "Upload it", "content": {"application/json": {"model": schemas.BundleOut}}},
        **schemas.error_responses(400, 403, 415, 422, 429),
    },
    tags=["code and data"],
)
def request_bundle_upload(request: Annotated[schemas.BundleIn, Body(embed=False)]) -> Response[Any]:
    caller = _caller()
    ticket = _storage().request_upload(caller, request.digest, request.size)
    if ticket is None:
        return _json(200, {"digest": request.digest, "present": True, "upload": None})
    upload = {
        "url": ticket.url,
        "method": ticket.method,
        "headers": ticket.headers,
        "expires_in_s": ticket.expires_in_s,
    }
    return _json(201, {"digest": request.digest, "present": False, "upload": upload})


DatasetName = Annotated[str, Path(pattern=DATASET_NAME_RE, description="Dataset name")]


@app.get(
    "/v1/datasets/<name>",
    summary="A registered on-prem dataset (admins; members: datasets their tenant may read)",
    responses={
        200: {"description": "The dataset", "content": {"application/json": {"model": Dataset}}},
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["code and data"],
)
def get_dataset(name: DatasetName) -> Response[Any]:
    return _json(200, _storage().get_dataset(_caller(), name).model_dump(mode="json"))


@app.put(
    "/v1/datasets/<name>",
    summary="Register or replace an on-prem dataset (admins only)",
    responses={
        200: {"description": "The dataset", "content": {"application/json": {"model": Dataset}}},
        **schemas.error_responses(400, 403, 415, 422, 429),
    },
    tags=["code and data"],
)
def put_dataset(name: DatasetName, dataset: Annotated[Dataset, Body(embed=False)]) -> Response[Any]:
    return _json(200, _storage().put_dataset(_caller(), name, dataset).model_dump(mode="json"))


@app.get(
    "/v1/tenants/<tenant>/grants",
    summary="S3 prefixes a tenant may read besides its own (admins; members: their own)",
    responses={
        200: {"description": "The grants", "content": {"application/json": {"model": DataGrants}}},
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["code and data"],
)
def get_grants(tenant: Tenant) -> Response[Any]:
    return _json(200, _storage().get_grants(_caller(), tenant).model_dump(mode="json"))


@app.put(
    "/v1/tenants/<tenant>/grants",
    summary="Grant a tenant read access to S3 prefixes (admins only)",
    responses={
        200: {"description": "The grants", "content": {"application/json": {"model": DataGrants}}},
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["code and data"],
)
def put_grants(tenant: Tenant, grants: Annotated[DataGrants, Body(embed=False)]) -> Response[Any]:
    return _json(200, _storage().put_grants(_caller(), tenant, grants).model_dump(mode="json"))


# -- usage ----------------------------------------------------------------------------------------
@cache
def _usage() -> UsageService:
    return UsageService(DynamoTenantRepository(settings().tenants_table), runtime.usage_ledger(), _now)


Month = Annotated[
    str | None,
    Query(pattern=MONTH_RE.pattern, description="YYYY-MM (UTC); default: the current month"),
]


@app.get(
    "/v1/tenants/<tenant>/usage",
    summary="A tenant's GPU-hours and cost in a month, per site, and its cloud budget left "
    "(admins: any tenant; members: their own)",
    responses={
        200: {
            "description": "The month's usage",
            "content": {"application/json": {"model": schemas.UsageOut}},
        },
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["tenants"],
)
def get_usage(tenant: Tenant, month: Month = None) -> Response[Any]:
    return _json(200, _usage().month(_caller(), tenant, month))


@app.get(
    "/v1/usage",
    summary="The caller's own tenant's GPU-hours and cost in a month (as /v1/tenants/{tenant}/usage)",
    responses={
        200: {
            "description": "The month's usage",
            "content": {"application/json": {"model": schemas.UsageOut}},
        },
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["tenants"],
)
def get_own_usage(month: Month = None) -> Response[Any]:
    caller = _caller()
    return _json(200, _usage().month(caller, caller.tenant, month))


HostId = Annotated[str, Path(pattern=HOST_ID_RE, description="On-prem host id")]


@app.put(
    "/v1/hosts/<host>/drain",
    summary="Drain an on-prem host, or lift its drain (admins only): nothing more is placed there and "
    "its agent stops taking work while its running jobs finish",
    responses={
        200: {
            "description": "The host's drain request",
            "content": {"application/json": {"model": schemas.DrainOut}},
        },
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_host_drain(
    host: HostId,
    body: Annotated[
        dict[str, Any],
        Body(embed=False, description='{"drain": true} or {"drain": false}', examples=[{"drain": True}]),
    ],
) -> Response[Any]:
    return _json(200, _fleet().drain(_caller(), host, body))


GpuRef = Annotated[
    str,
    Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,95}$", description="A GPU's UUID or its index on the host"),
]


@app.post(
    "/v1/hosts/<host>/gpus/<gpu>/clear",
    summary="Clear a GPU's fault (admins only): the GPU is placed on again (docs/agent.md, GPU health)",
    responses={
        200: {
            "description": "The fault cleared",
            "content": {"application/json": {"model": schemas.GpuClearOut}},
        },
        **schemas.error_responses(403, 404, 409, 422, 429),
    },
    tags=["fleet and policy"],
)
def post_gpu_clear(host: HostId, gpu: GpuRef) -> Response[Any]:
    fleet = _fleet()
    answer = clear_gpu_fault(_caller(), fleet.source.hosts, host, gpu)
    fleet.clear_cache()
    return _json(200, answer)


@app.put(
    "/v1/hosts/<host>/admission",
    summary="Admit what an on-prem host may register at most (admins only): its GPU type and count. "
    "Its first registration fixes them; more, or another type, is refused until an admin admits it",
    responses={
        200: {
            "description": "The host's admission",
            "content": {"application/json": {"model": schemas.AdmitOut}},
        },
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_host_admission(
    host: HostId,
    body: Annotated[
        dict[str, Any],
        Body(
            embed=False,
            description='{"gpu_type": "H200", "gpus": 8}',
            examples=[{"gpu_type": "H200", "gpus": 8}],
        ),
    ],
) -> Response[Any]:
    return _json(200, _fleet().admit(_caller(), host, body))


def _circuits() -> CircuitService:
    return CircuitService(runtime.snapshot_source())


@app.get(
    "/v1/circuits",
    summary="The cloud's circuits (admins only): each (region, instance type or `*`) with a record, "
    "its state, recent failures and last success",
    responses={
        200: {"description": "The circuits", "content": {"application/json": {"model": schemas.CircuitsOut}}},
        **schemas.error_responses(403, 429),
    },
    tags=["fleet and policy"],
)
def get_circuits() -> Response[Any]:
    return _json(200, _circuits().show(_caller()))


Region = Annotated[str, Path(pattern=REGION_RE.pattern, description="An AWS region, e.g. us-east-1")]


@app.delete(
    "/v1/circuits/<region>",
    summary="Reset (close) a region's circuits, or one of them with `instance_type` (admins only): "
    "their failures are forgotten and the next pass places there again",
    responses={
        200: {
            "description": "The circuits reset",
            "content": {"application/json": {"model": schemas.CircuitResetOut}},
        },
        **schemas.error_responses(403, 404, 422, 429),
    },
    tags=["fleet and policy"],
)
def delete_circuits(
    region: Region,
    instance_type: Annotated[
        str | None,
        Query(
            pattern=INSTANCE_TYPE_RE.pattern,
            description="Only this instance type's circuit (`*`: the region's API circuit); default: all",
        ),
    ] = None,
) -> Response[Any]:
    return _json(200, _circuits().reset(_caller(), region, instance_type))


# -- errors ---------------------------------------------------------------------------------------
@app.exception_handler(DomainError)
def _domain_error(exc: DomainError) -> Response[Any]:
    if not isinstance(exc, (InvalidRequest,)):
        logger.info("request refused", extra={"code": exc.code, "error": exc.message})
    return from_domain(exc)


#: Bodies whose validation errors are told in their model's words, by method and path.
_BODIES: list[tuple[str, re.Pattern[str], BodyModel]] = [
    ("POST", re.compile(r"^/v1/jobs/?$"), (JobSpec, FIELD_FORMS, FIELD_CHOICES)),
    ("PUT", re.compile(r"^/v1/tenants/[^/]+/quota/?$"), (Quota, {}, {})),
    ("PUT", re.compile(r"^/v1/datasets/[^/]+/?$"), (Dataset, {}, {})),
    ("PUT", re.compile(r"^/v1/tenants/[^/]+/grants/?$"), (DataGrants, {}, {})),
]


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response[Any]:
    event = app.current_event
    body = next((b for m, path, b in _BODIES if m == event.http_method and path.match(event.path)), None)
    return from_validation(exc, body)


@app.not_found
def _not_found(_exc: Exception) -> Response[Any]:
    return error_response(
        404, "NotFound", f"no route {app.current_event.http_method} {app.current_event.path}"
    )


# -- entry point ----------------------------------------------------------------------------------
def _plain(resp: Response[Any]) -> dict[str, Any]:
    return {
        "statusCode": resp.status_code,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps(resp.body),
        "isBase64Encoded": False,
    }


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)  # responses carry job specs, env included
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        problem = body_problem(event, settings().max_body_bytes)
        if problem is not None:
            response = _plain(from_domain(problem))
        else:
            _idempotent_submit()[1].register_lambda_context(context)
            response = app.resolve(with_canonical_content_type(event), context)
    except Exception:
        telemetry.api_request(event, 500)  # unhandled: API Gateway answers 502
        raise
    telemetry.api_request(event, int(response.get("statusCode") or 500))
    return response
