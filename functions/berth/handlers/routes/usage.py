"""Usage: a tenant's GPU-hours and cost in a month, per site, and its cloud budget left."""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from berth.handlers import schemas, services
from berth.handlers.routes.tenants import Tenant
from berth.logic.usage import MONTH_RE

router = Router()

Month = Annotated[
    str | None,
    Query(pattern=MONTH_RE.pattern, description="YYYY-MM (UTC); default: the current month"),
]


@router.get(
    "/v1/tenants/<tenant>/usage",
    summary="A tenant's GPU-hours and cost in a month, per site, and its cloud budget left "
    "(admins: any tenant; members: their own)",
    responses={200: {"description": "The month's usage"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["tenants"],
)
def get_usage(tenant: Tenant, month: Month = None) -> schemas.UsageOut:
    caller = services.caller(router.current_event)
    return schemas.UsageOut.model_validate(services.usage().month(caller, tenant, month))


@router.get(
    "/v1/usage",
    summary="The caller's own tenant's GPU-hours and cost in a month (as /v1/tenants/{tenant}/usage)",
    responses={200: {"description": "The month's usage"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["tenants"],
)
def get_own_usage(month: Month = None) -> schemas.UsageOut:
    caller = services.caller(router.current_event)
    return schemas.UsageOut.model_validate(services.usage().month(caller, caller.tenant, month))
