"""Tenants (teams): their quotas, and their queues in the order the scheduler serves them."""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from berth.domain.job import iso
from berth.domain.tenancy import TENANT_RE, Caller, Quota
from berth.handlers import schemas, services
from berth.logic.team_queue import MAX_LIMIT

router = Router()

Tenant = Annotated[str, Path(pattern=TENANT_RE, description="Tenant (team) name")]


@router.get(
    "/v1/tenants/<tenant>/quota",
    summary="A tenant's quota (admins: any tenant; members: their own)",
    responses={200: {"description": "The quota"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["tenants"],
)
def get_quota(tenant: Tenant) -> Quota:
    return services.tenants().get_quota(services.caller(router.current_event), tenant)


@router.put(
    "/v1/tenants/<tenant>/quota",
    summary="Set a tenant's quota (admins only)",
    responses={
        200: {"description": "The new quota"},
        **schemas.error_responses(400, 403, 404, 415, 422, 429),
    },
    tags=["tenants"],
)
def put_quota(tenant: Tenant, quota: Annotated[Quota, Body(embed=False)]) -> Quota:
    return services.tenants().put_quota(services.caller(router.current_event), tenant, quota)


QueueLimit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many jobs")]
QUEUE_DESCRIPTION = (
    "The head of the team's queue as the last scheduling pass ranked it (one read of the team's queue "
    "summary and one batch read of its jobs, however deep the queue): each job with its "
    "`queue_position` and `estimated_start`. `waiting` counts the whole queue."
)


@router.get(
    "/v1/queue",
    summary="Your team's waiting jobs in the order the scheduler serves them",
    description=QUEUE_DESCRIPTION,
    responses={200: {"description": "The queue's head"}, **schemas.error_responses(403, 422, 429)},
    tags=["tenants"],
)
def get_own_queue(limit: QueueLimit = 50) -> schemas.TeamQueueOut:
    caller = services.caller(router.current_event)
    return _queue(caller, caller.tenant, limit)


@router.get(
    "/v1/tenants/<tenant>/queue",
    summary="A team's waiting jobs in the order the scheduler serves them (members: their own team)",
    description=QUEUE_DESCRIPTION,
    responses={200: {"description": "The queue's head"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["tenants"],
)
def get_queue(tenant: Tenant, limit: QueueLimit = 50) -> schemas.TeamQueueOut:
    return _queue(services.caller(router.current_event), tenant, limit)


def _queue(caller: Caller, tenant: str, limit: int) -> schemas.TeamQueueOut:
    queue = services.team_queues().queue(caller, tenant, limit)
    summary = queue.summary
    jobs = [
        schemas.JobOut.model_validate({**job.public(), **summary.view(job.id), "spec": job.spec})
        for job in queue.jobs
        if summary is not None
    ]
    return schemas.TeamQueueOut(
        tenant=tenant,
        as_of=None if queue.as_of is None else iso(queue.as_of),
        waiting=queue.waiting,
        jobs=jobs,
    )
