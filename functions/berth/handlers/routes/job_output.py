"""What a job produced: its logs, its GPU and process metrics, and its outputs and checkpoints."""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from berth.domain.arrays import JobArray
from berth.domain.observability import parse_since
from berth.handlers import schemas, services
from berth.handlers.routes.jobs import JobId

router = Router()

Attempt = Annotated[int | None, Query(ge=1, le=1000, description="Which attempt (default: the latest)")]


@router.get(
    "/v1/jobs/<job_id>/outputs",
    summary="Where a job's outputs and checkpoints are, with a presigned GET for each object",
    description="Lists `<tenant>/jobs/<job>/` in the data bucket (`outputs/` and `checkpoints/`, "
    "written by the job's executor), key order, each object with a GET URL valid for "
    "`url_expires_in_s`. An array's id lists every task's. The same tenant check as "
    "`GET /v1/jobs/{id}`.",
    responses={200: {"description": "A page of objects"}, **schemas.error_responses(400, 403, 404, 422, 429)},
    tags=["jobs"],
)
def job_outputs(
    job_id: JobId,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size")] = 1000,
    next_token: Annotated[str | None, Query(max_length=1024, description="From the previous page")] = None,
) -> schemas.OutputsOut:
    found = services.job_or_array(services.caller(router.current_event), job_id)
    is_array = isinstance(found, JobArray)
    page = services.outputs().list(found.tenant, found.id, is_array, limit, next_token)
    return schemas.OutputsOut.model_validate(page)


@router.get(
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
    responses={200: {"description": "A page of output"}, **schemas.error_responses(400, 403, 404, 422, 429)},
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
) -> schemas.LogsOut:
    caller = services.caller(router.current_event)
    since_ms = None if since is None else parse_since(since)
    page = services.observability().logs(caller, job_id, attempt, since_ms, limit, next_token, rank)
    return schemas.LogsOut.model_validate(page)


@router.get(
    "/v1/jobs/<job_id>/metrics",
    summary="A job's GPU, CPU and memory samples for one attempt, with a summary",
    description="Samples the agent took (NVML for GPUs, `/proc` for the job's processes), oldest "
    "first: the latest `limit` of them; the summary covers all of the attempt's samples. The same "
    "tenant check as `GET /v1/jobs/{id}`.",
    responses={200: {"description": "Samples"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["jobs"],
)
def job_metrics(
    job_id: JobId,
    attempt: Attempt = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Most samples returned")] = 1000,
) -> schemas.MetricsOut:
    caller = services.caller(router.current_event)
    return schemas.MetricsOut.model_validate(services.observability().metrics(caller, job_id, attempt, limit))
