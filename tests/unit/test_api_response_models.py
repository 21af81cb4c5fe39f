"""Every API route returns its pydantic response model, and the OpenAPI document shows it.

The route's return annotation is the one definition: Powertools validates and serializes the answer
through it and documents it as the 2xx schema (``berth.handlers.routes``, ``berth.handlers.schemas``).
"""

import json
import types
import typing
from typing import Any

import pytest
from aws_lambda_powertools.event_handler import Response
from pydantic import BaseModel

from berth.handlers.openapi import document

DOC = json.loads(document())  # imports berth.handlers.api with placeholder settings
SUCCESS = {"200", "201", "202"}


def _routes() -> list[Any]:
    from berth.handlers.api import app

    return sorted(app._static_routes + app._dynamic_routes, key=lambda r: (r.openapi_path, r.method))


def _models(annotation: Any) -> list[Any]:
    """The types a return annotation names: ``Response[X]`` is X; a union is its members."""
    if typing.get_origin(annotation) is Response:
        (annotation,) = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def _refs(schema: dict[str, Any]) -> list[str]:
    """The component names a response schema points at (one, or each of an ``anyOf``)."""
    options = schema.get("anyOf", [schema])
    return [o["$ref"].removeprefix("#/components/schemas/") for o in options if "$ref" in o]


ROUTES = _routes()


def test_the_app_has_every_route() -> None:
    documented = {(path, method.upper()) for path, ops in DOC["paths"].items() for method in ops}
    assert {(r.openapi_path, r.method) for r in ROUTES} == documented
    assert len(ROUTES) == 31


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.openapi_path}")
def test_route_returns_a_response_model(route: Any) -> None:
    models = _models(typing.get_type_hints(route.func)["return"])
    assert all(isinstance(m, type) and issubclass(m, BaseModel) for m in models), (
        f"{route.method} {route.openapi_path} returns {models}, not a response model"
    )
    op = DOC["paths"][route.openapi_path][route.method.lower()]
    successes = {code: r for code, r in op["responses"].items() if code in SUCCESS}
    assert successes, f"{route.method} {route.openapi_path} documents no 2xx answer"
    for code, response in successes.items():
        schema = response.get("content", {}).get("application/json", {}).get("schema", {})
        assert sorted(_refs(schema)) == sorted(m.__name__ for m in models), (
            f"{route.method} {route.openapi_path} {code} documents {schema}, not its return model"
        )


def test_every_success_schema_is_an_object_with_fields() -> None:
    components = DOC["components"]["schemas"]
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            for code in SUCCESS & set(op["responses"]):
                schema = op["responses"][code].get("content", {}).get("application/json", {}).get("schema")
                assert schema, f"{method} {path} {code} has no schema"
                refs = _refs(schema)
                assert refs, f"{method} {path} {code}: {schema} names no model"
                for name in refs:
                    assert components[name].get("properties"), f"{method} {path} {code}: {name} is empty"
