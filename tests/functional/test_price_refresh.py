"""``berth_tools.prices`` against AWS answer shapes: the Price List API through botocore's Stubber
(moto has no Price List API) and EC2 spot price history and zones on moto; a source that cannot
be reached keeps its prices and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from berth.logic.snapshot import default_offers_document
from berth_tools.prices import refresh_document

RECORDED = json.loads(
    (Path(__file__).resolve().parents[1] / "unit" / "data" / "pricing_get_products_g5.json").read_text()
)


def _document() -> dict[str, Any]:
    """Two offers of the shipped catalog: g5.xlarge in one us-east-1 zone, and one other."""
    offers = default_offers_document()["offers"]
    g5 = next(o for o in offers if o["instance_type"] == "g5.xlarge" and o["region"] == "us-east-1")
    other = next(o for o in offers if o["instance_type"] == "p5.48xlarge" and o["region"] == "us-east-1")
    return {"offers": [g5, other]}


def _pricing_stub(fail: bool = False) -> tuple[Any, Stubber]:
    pricing = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(pricing)
    for _ in range(2):  # one GetProducts per (region, instance type)
        if fail:
            stub.add_client_error("get_products", "AccessDeniedException", "not authorized", 400)
            break
        stub.add_response(
            "get_products",
            RECORDED,
            {"ServiceCode": "AmazonEC2", "Filters": ANY, "FormatVersion": "aws_v1"},
        )
    stub.activate()
    return pricing, stub


def test_prices_from_the_price_list_and_spot_history(aws: None) -> None:
    pricing, stub = _pricing_stub()
    ec2_clients: dict[str, Any] = {}

    def clients(service: str, region: str) -> Any:
        if service == "pricing":
            return pricing
        return ec2_clients.setdefault(region, boto3.client("ec2", region_name=region))

    doc = _document()
    result = refresh_document(doc, clients)
    stub.assert_no_pending_responses()
    g5, other = result.document["offers"]
    assert g5["on_demand_usd_h"] == 1.006  # the recorded Price List answer
    # moto answers every type offered in a zone with its own figure; the zone id maps back
    assert g5["spot_usd_h"] == pytest.approx(0.00001) and result.report.spot_updated >= 1
    assert other["on_demand_usd_h"] == doc["offers"][1]["on_demand_usd_h"]  # the answer was for g5 only
    assert result.changed and result.report.notes == []


def test_an_unreachable_source_keeps_its_prices_with_a_note(aws: None) -> None:
    pricing, _ = _pricing_stub(fail=True)

    def clients(service: str, region: str) -> Any:
        if service == "pricing":
            return pricing
        raise_client = boto3.client("ec2", region_name=region)
        stub = Stubber(raise_client)
        stub.add_client_error("describe_availability_zones", "UnauthorizedOperation", "no", 403)
        stub.activate()
        return raise_client

    doc = _document()
    result = refresh_document(doc, clients)
    assert result.document == doc and not result.changed
    assert any("Price List API unreachable (AccessDeniedException" in n for n in result.report.notes)
    assert any(
        "spot price history unreachable in us-east-1 (UnauthorizedOperation" in n for n in result.report.notes
    )
