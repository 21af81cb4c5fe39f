"""The scheduling policy and the cloud offers: versioned documents, read by anyone, replaced by admins."""

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Query

from berth.handlers import schemas, services
from berth.logic.fleet import document_out
from berth.logic.snapshot import OFFERS, POLICY

router = Router()

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


def _get_document(kind: str, version: int | None) -> schemas.DocumentOut:
    stored = services.fleet().get_document(services.caller(router.current_event), kind, version)
    return schemas.DocumentOut.model_validate(document_out(stored))


def _put_document(kind: str, document: dict[str, Any], if_match: str | None) -> schemas.DocumentOut:
    caller = services.caller(router.current_event)
    expected = None if if_match is None else int(if_match)
    return schemas.DocumentOut.model_validate(
        document_out(services.fleet().put_document(caller, kind, document, expected))
    )


@router.get(
    "/v1/policy",
    summary="The organisation's scheduling policy (the current version, or an older one)",
    responses={200: {"description": "The policy"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["fleet and policy"],
)
def get_policy(version: Version = None) -> schemas.DocumentOut:
    return _get_document(POLICY, version)


@router.put(
    "/v1/policy",
    summary="Replace the scheduling policy (admins only); stored as a new version, the old one kept",
    responses={
        200: {"description": "The new version"},
        **schemas.error_responses(400, 403, 409, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_policy(
    document: Annotated[dict[str, Any], Body(embed=False)], if_match: IfMatch = None
) -> schemas.DocumentOut:
    return _put_document(POLICY, document, if_match)


@router.get(
    "/v1/offers",
    summary="The cloud offers the scheduler may buy (the current version, or an older one)",
    responses={200: {"description": "The offers"}, **schemas.error_responses(403, 404, 422, 429)},
    tags=["fleet and policy"],
)
def get_offers(version: Version = None) -> schemas.DocumentOut:
    return _get_document(OFFERS, version)


@router.put(
    "/v1/offers",
    summary="Replace the cloud offers (admins only); stored as a new version, the old one kept",
    responses={
        200: {"description": "The new version"},
        **schemas.error_responses(400, 403, 409, 415, 422, 429),
    },
    tags=["fleet and policy"],
)
def put_offers(
    document: Annotated[dict[str, Any], Body(embed=False)], if_match: IfMatch = None
) -> schemas.DocumentOut:
    return _put_document(OFFERS, document, if_match)
