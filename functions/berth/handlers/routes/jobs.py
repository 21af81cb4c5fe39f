"""Jobs and job arrays: submit, list, get, cancel, their state history, explain, and the dry run."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.metrics import MetricUnit

from berth.domain.arrays import ARRAY_ID_RE, JobArray
from berth.domain.errors import InvalidRequest, NotFound
from berth.domain.job import Job
from berth.domain.job_filter import NAME_FILTER_RE, JobFilter
from berth.domain.job_spec import JobSpec, defaults_applied
from berth.domain.observability import parse_since
from berth.domain.placement import Site
from berth.domain.queue_summary import no_queue_view
from berth.domain.status import JobStatus
from berth.domain.tenancy import TENANT_RE
from berth.handlers import idempotent_submit, runtime, schemas, services
from berth.logic.queue_view import with_queue

router = Router()
logger = Logger()
tracer = Tracer()
metrics = Metrics(namespace="Berth")

JobId = Annotated[
    str, Path(pattern=r"^j-[0-9a-z]{26}(:[0-9]{1,5})?$", description="Job, array or array task id")
]


def _answers(items: Sequence[Job | JobArray]) -> list[schemas.AnyJobOut]:
    """Jobs (or arrays) as the API returns them, a queued job with its place in its team's queue
    (one read of the team's queue summary per answer; ``berth.logic.queue_view``)."""
    bodies = with_queue((i.public() for i in items), runtime.queue_summaries())
    return [_answer(item, body) for item, body in zip(items, bodies, strict=True)]


def _answer(item: Job | JobArray, body: dict[str, Any]) -> schemas.AnyJobOut:
    model: type[schemas.AnyJobOut] = schemas.ArrayJobOut if isinstance(item, JobArray) else schemas.JobOut
    return model.model_validate({**body, "spec": item.spec})


@router.post(
    "/v1/jobs",
    summary="Submit a training job or a job array",
    description="Optional `Idempotency-Key` header: the same key and body return the same job; "
    "the same key with another body answers 409. A spec with `array` is stored whole (or refused "
    "whole) and answered at once with the array; its tasks `<array id>:<i>` are created in the "
    "background.",
    responses={201: {"description": "Job accepted"}, **schemas.error_responses(400, 403, 409, 415, 422, 429)},
    tags=["jobs"],
)
@tracer.capture_method(capture_response=False)  # the job holds the spec, env included
def submit_job(
    spec: Annotated[JobSpec, Body(embed=False)],
) -> Response[schemas.SubmittedJobOut | schemas.SubmittedArrayOut]:
    caller = services.caller(router.current_event)
    key = router.current_event.headers.get("Idempotency-Key")
    if spec.array_task is not None:
        raise InvalidRequest("array_task is set by Berth on an array's tasks; submit an 'array' instead")
    job: Job | JobArray
    if key is not None:
        job = idempotent_submit.submit(caller, spec, key)
    elif spec.array is not None:
        job = services.arrays().submit(caller, spec)
    else:
        job = services.jobs().submit(caller, spec)
    metrics.add_metric(name="JobsSubmitted", unit=MetricUnit.Count, value=1)
    if spec.array is not None:
        metrics.add_metric(name="ArrayTasksSubmitted", unit=MetricUnit.Count, value=spec.array.count)
    logger.info("job submitted", extra={"job_id": job.id, "tenant": job.tenant})
    # Not ranked by a pass yet: the queue fields are there, empty (no read on the submit path).
    body = {**job.public(), **no_queue_view(), "defaults_applied": defaults_applied(spec), "spec": job.spec}
    model = schemas.SubmittedArrayOut if isinstance(job, JobArray) else schemas.SubmittedJobOut
    return Response(201, content_types.APPLICATION_JSON, model.model_validate(body))


@router.get(
    "/v1/jobs",
    summary="List a tenant's jobs, newest first (your own; admins: any tenant's with `tenant`, "
    "every tenant's with `all_tenants`)",
    description="`since` is applied in the query (pages stay full); `name` and `site` are applied to "
    "each page read, so a page may hold fewer than `limit` jobs while `next_token` says there is more.",
    responses={200: {"description": "A page of jobs"}, **schemas.error_responses(400, 403, 422, 429)},
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
) -> schemas.JobList:
    if array is not None:
        if status is not None or tenant is not None or all_tenants or since or name or site:
            raise InvalidRequest(
                "array cannot be combined with status, tenant, all_tenants, since, name or site"
            )
        caller = services.caller(router.current_event)
        tasks, token = services.arrays().tasks(caller, array, limit, next_token)
        return schemas.JobList(jobs=_answers(tasks), next_token=token)
    after = None if since is None else datetime.fromtimestamp(parse_since(since) / 1000, UTC)
    filters = JobFilter(since=after, name=name, site=site)
    page = services.jobs().list_jobs(
        services.caller(router.current_event),
        status,
        limit,
        next_token,
        tenant=tenant,
        filters=filters,
        all_tenants=all_tenants,
    )
    return schemas.JobList(jobs=_answers(page.jobs), next_token=page.next_token)


@router.get(
    "/v1/jobs/<job_id>",
    summary="Get a job, an array (with `array: {size, counts, created}`) or an array task",
    responses={200: {"description": "The job"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["jobs"],
)
def get_job(job_id: JobId) -> schemas.AnyJobOut:
    return _answers([services.job_or_array(services.caller(router.current_event), job_id)])[0]


@router.post(
    "/v1/jobs/<job_id>/cancel",
    summary="Cancel a job or a whole array",
    description="Queued jobs become CANCELED at once; placed ones CANCELING until the executor stops "
    "them. Repeating a cancel is harmless. An array's id cancels every task not yet ended, created or "
    "not: the answer is the array, and its counts move as the expander reaches each task.",
    responses={202: {"description": "Cancel accepted"}, **schemas.error_responses(403, 404, 409, 422, 429)},
    tags=["jobs"],
)
def cancel_job(job_id: JobId) -> Response[schemas.AnyJobOut]:
    caller = services.caller(router.current_event)
    try:
        canceled: Job | JobArray = services.jobs().cancel(caller, job_id)
    except NotFound:
        if ":" in job_id:
            raise
        # An array: every task not yet ended is canceled, created or not (in the background).
        canceled = services.arrays().cancel(caller, job_id)
    return Response(202, content_types.APPLICATION_JSON, _answers([canceled])[0])


@router.get(
    "/v1/jobs/<job_id>/events",
    summary="A job's state history, oldest first",
    responses={200: {"description": "State changes"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["jobs"],
)
def job_events(job_id: JobId) -> schemas.EventList:
    events = services.jobs().events(services.caller(router.current_event), job_id)
    return schemas.EventList.model_validate({"events": [e.public() for e in events]})


@router.get(
    "/v1/jobs/<job_id>/explain",
    summary="Why a job is pending, or where it was placed",
    description="For a queued job: the scheduler core's outcome for it in a pass over the store now "
    "(the rule ids in order, every candidate site and the rule that kept the job off it, its "
    "fair-share rank). The same tenant check as `GET /v1/jobs/{id}`.",
    responses={200: {"description": "The explanation"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["jobs"],
)
def explain(job_id: JobId) -> schemas.ExplainOut:
    caller = services.caller(router.current_event)
    return schemas.ExplainOut.model_validate(services.fleet().explain(services.jobs(), caller, job_id))


@router.post(
    "/v1/jobs/plan",
    summary="Dry run: validate a job spec and show where the scheduler would run it now",
    description="The same checks and 4xx answers as `POST /v1/jobs`; then the scheduler core's "
    "outcome for the spec in a pass over the store now (as one more queued job of the caller's "
    "tenant): where it would run, or why it would wait, the hourly price and the cost limits. "
    "Nothing is stored: no job, no event, no quota use.",
    responses={200: {"description": "The plan"}, **schemas.error_responses(400, 403, 415, 422, 429)},
    tags=["jobs"],
)
def plan_job(spec: Annotated[JobSpec, Body(embed=False)]) -> schemas.PlanOut:
    return schemas.PlanOut.model_validate(services.plans().plan(services.caller(router.current_event), spec))
