"""Tenants (teams): their quotas."""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from berth.domain.tenancy import TENANT_RE, Quota
from berth.handlers import schemas, services

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
