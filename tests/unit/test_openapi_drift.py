"""The committed OpenAPI document is generated from the code; this fails when they drift."""

from pathlib import Path

from berth.handlers.openapi import document

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_openapi_document_matches_code() -> None:
    assert DOC.read_text() == document(), "docs/openapi.json is stale: run `make openapi` and commit it"


def test_every_route_documents_its_errors() -> None:
    import json

    doc = json.loads(document())
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert codes & {"400", "403", "404", "422"}, f"{method} {path} documents no error responses"
