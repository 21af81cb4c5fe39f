"""Refuse request bodies the resolver cannot safely parse, before routing.

Powertools' resolver parses a body by its content type (form data, multipart) and with Python's
``json``, which raises plain exceptions (a multipart type without a boundary, an integer of more than
4,300 digits, deep nesting) that would surface as a 5xx. The API takes JSON only, so everything else is
answered here with a 4xx in the API's error shape.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any

from berth.domain.errors import DomainError, InvalidRequest, PayloadTooLarge, UnsupportedMediaType

#: No field of any body needs more digits than this (the largest bound is 10,000,000).
MAX_NUMBER_CHARS = 32


class _BadNumber(Exception):
    pass


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _BadNumber(f"a number in the request body has more than {MAX_NUMBER_CHARS} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text) if len(text) <= MAX_NUMBER_CHARS else math.inf
    if not math.isfinite(value):
        raise _BadNumber("a number in the request body is out of range")
    return value


def _constant(name: str) -> Any:
    raise _BadNumber(f"{name} is not a JSON number")


def _header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name:
            return str(value)
    return None


def _content_type_problem(content_type: str | None) -> DomainError | None:
    if content_type is None:
        return None  # clients that send JSON without saying so are common (curl --data)
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "application/json":
        return UnsupportedMediaType(
            f"request bodies must be application/json, not {media.strip()[:100]!r}",
            details={"accepted": ["application/json"]},
        )
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return UnsupportedMediaType("JSON request bodies must be UTF-8 encoded")
    return None


def body_problem(event: Mapping[str, Any], max_body_bytes: int) -> DomainError | None:
    """The first reason to refuse this proxy event's body, or None when the resolver may parse it."""
    raw = event.get("body")
    if not raw:
        return None
    problem = _content_type_problem(_header(event.get("headers"), "content-type"))
    if problem is not None:
        return problem
    data: bytes = raw.encode() if isinstance(raw, str) else raw
    too_large = PayloadTooLarge(
        f"request body is larger than {max_body_bytes} bytes; a job spec must be smaller"
    )
    if len(data) > (max_body_bytes * 4 // 3 + 4 if event.get("isBase64Encoded") else max_body_bytes):
        return too_large
    try:
        if event.get("isBase64Encoded"):
            data = base64.b64decode(data, validate=True)
        text = data.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return InvalidRequest("request body is not UTF-8 encoded JSON")
    if len(data) > max_body_bytes:
        return too_large
    try:
        json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        return InvalidRequest("request body is nested too deeply")
    except _BadNumber as exc:
        return InvalidRequest(str(exc))
    except ValueError:
        return InvalidRequest("request body is not valid JSON")
    return None


def with_canonical_content_type(event: dict[str, Any]) -> dict[str, Any]:
    """The event with its Content-Type spelled ``application/json`` (media types are case-insensitive;
    the resolver compares them exactly). Call only after ``body_problem`` accepted the body."""
    out = dict(event)
    for field in ("headers", "multiValueHeaders"):
        headers = event.get(field)
        if not headers:
            continue
        out[field] = {
            k: (
                v
                if k.lower() != "content-type"
                else (["application/json"] if isinstance(v, list) else "application/json")
            )
            for k, v in headers.items()
        }
    return out
