"""Map domain errors and request validation failures to the API's error body."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from pydantic import BaseModel

from berth.domain import errors as e
from berth.domain.validation_messages import describe

#: First match wins: subclasses before their bases.
STATUS: list[tuple[type[e.DomainError], int]] = [
    (e.UnsupportedMediaType, 415),
    (e.InvalidRequest, 400),
    (e.Unauthenticated, 401),
    (e.Forbidden, 403),
    (e.NotFound, 404),
    (e.Conflict, 409),
    (e.ValidationFailed, 422),
    (e.Infeasible, 422),
    (e.QuotaExceeded, 429),
    (e.RateLimited, 429),
    (e.RequestInProgress, 429),
    (e.StoreUnavailable, 503),
]


def error_response(status: int, code: str, message: str, details: Any = None) -> Response[Any]:
    body: dict[str, Any] = {"error": {"code": code, "message": message, "details": details}}
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers
    )


def from_domain(exc: e.DomainError) -> Response[Any]:
    status = next((s for cls, s in STATUS if isinstance(exc, cls)), 500)
    response = error_response(status, exc.code, exc.message, exc.details)
    if isinstance(exc, e.RateLimited):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where, rest = parts[0], parts[1:]
        return ".".join(rest) if where == "body" and rest else f"{where}:{'.'.join(rest)}"
    return ".".join(parts)


def _describe(err: dict[str, Any]) -> str:
    where = _loc(err.get("loc", ()))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


#: A body's model, the words for its pattern fields and the values of its closed fields
#: (``berth.domain.validation_messages.describe``).
BodyModel = tuple[type[BaseModel], Mapping[str, str], Mapping[str, Sequence[str]]]


def from_validation(exc: RequestValidationError, body: BodyModel | None = None) -> Response[Any]:
    """422 ``ValidationError``: ``details`` one entry per problem, ``{field, message}`` plus, for a
    body with a model, ``allowed`` and ``did_you_mean`` where they help (domain/validation_messages)."""
    errs = list(exc.errors())
    if any(err.get("type") == "json_invalid" for err in errs):
        return error_response(400, "BadRequest", "request body is not valid JSON")
    in_body = [e for e in errs if tuple(e.get("loc", ()))[:1] == ("body",)]
    others = [e for e in errs if e not in in_body]
    details = [{"field": _loc(err.get("loc", ())), "message": _describe(err)} for err in others]
    model, forms, choices = body if body is not None else (None, {}, {})
    details += describe(in_body, model, forms, choices)
    message = "; ".join(d["message"] for d in details[:5]) or "invalid request"
    if len(details) > 5:
        message += f" (and {len(details) - 5} more)"
    return error_response(422, "ValidationError", message, details)
