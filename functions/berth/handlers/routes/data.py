"""Code and data: code bundle uploads, registered on-prem datasets, and S3 read grants."""

from typing import Annotated

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from berth.domain.storage import DATASET_NAME_RE, DataGrants, Dataset
from berth.handlers import schemas, services
from berth.handlers.routes.tenants import Tenant

router = Router()

DatasetName = Annotated[str, Path(pattern=DATASET_NAME_RE, description="Dataset name")]


@router.post(
    "/v1/bundles",
    summary="Ask to upload a code bundle (content-addressed, per tenant)",
    description="Answers 200 `{present: true}` when the tenant already stored this digest, else 201 "
    "with a presigned upload that S3 accepts only for content of this size and SHA-256, once.",
    responses={
        200: {"description": "Already stored"},
        201: {"description": "Upload it"},
        **schemas.error_responses(400, 403, 415, 422, 429),
    },
    tags=["code and data"],
)
def request_bundle_upload(
    request: Annotated[schemas.BundleIn, Body(embed=False)],
) -> Response[schemas.BundleOut]:
    caller = services.caller(router.current_event)
    ticket = services.storage().request_upload(caller, request.digest, request.size)
    if ticket is None:
        present = schemas.BundleOut(digest=request.digest, present=True, upload=None)
        return Response(200, content_types.APPLICATION_JSON, present)
    upload = schemas.UploadOut(
        url=ticket.url, method=ticket.method, headers=ticket.headers, expires_in_s=ticket.expires_in_s
    )
    return Response(
        201,
        content_types.APPLICATION_JSON,
        schemas.BundleOut(digest=request.digest, present=False, upload=upload),
    )


@router.get(
    "/v1/datasets/<name>",
    summary="A registered on-prem dataset (admins; members: datasets their tenant may read)",
    responses={200: {"description": "The dataset"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["code and data"],
)
def get_dataset(name: DatasetName) -> Dataset:
    return services.storage().get_dataset(services.caller(router.current_event), name)


@router.put(
    "/v1/datasets/<name>",
    summary="Register or replace an on-prem dataset (admins only)",
    responses={200: {"description": "The dataset"}, **schemas.error_responses(400, 403, 415, 422, 429)},
    tags=["code and data"],
)
def put_dataset(name: DatasetName, dataset: Annotated[Dataset, Body(embed=False)]) -> Dataset:
    return services.storage().put_dataset(services.caller(router.current_event), name, dataset)


@router.get(
    "/v1/tenants/<tenant>/grants",
    summary="S3 prefixes a tenant may read besides its own (admins; members: their own)",
    responses={200: {"description": "The grants"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["code and data"],
)
def get_grants(tenant: Tenant) -> DataGrants:
    return services.storage().get_grants(services.caller(router.current_event), tenant)


@router.put(
    "/v1/tenants/<tenant>/grants",
    summary="Grant a tenant read access to S3 prefixes (admins only)",
    responses={200: {"description": "The grants"}, **schemas.error_responses(400, 403, 404, 415, 422, 429)},
    tags=["code and data"],
)
def put_grants(tenant: Tenant, grants: Annotated[DataGrants, Body(embed=False)]) -> DataGrants:
    return services.storage().put_grants(services.caller(router.current_event), tenant, grants)
