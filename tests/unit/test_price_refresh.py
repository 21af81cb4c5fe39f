"""Price refresh parsing on recorded answer shapes: the AWS Price List API's GetProducts entries
(only plain on-demand Linux prices count), EC2 spot price history (newest per zone id), and the
offers updated where an answer covers them and kept elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

from berth.logic.snapshot import OffersDocument, default_offers_document
from berth.pricing.refresh import latest_spot_prices, on_demand_price, price_list_filters, refreshed_offers

RECORDED = json.loads((Path(__file__).parent / "data" / "pricing_get_products_g5.json").read_text())


def test_only_the_plain_on_demand_linux_price_is_read() -> None:
    parsed = [on_demand_price(item) for item in RECORDED["PriceList"]]
    assert parsed == [("g5.xlarge", "us-east-1", 1.006), None, None]  # reservations, SQL licences: no


def test_filters_select_one_type_in_one_region() -> None:
    filters = {f["Field"]: f["Value"] for f in price_list_filters("p5.48xlarge", "us-west-2")}
    assert filters == {
        "instanceType": "p5.48xlarge",
        "regionCode": "us-west-2",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }


def test_the_newest_spot_price_per_zone_id_wins() -> None:
    history = [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.40",
            "Timestamp": "2026-12-01T10:00:00Z",
        },
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.45",
            "Timestamp": "2026-12-01T11:00:00Z",
        },
        {
            "AvailabilityZone": "us-east-1b",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.39",
            "Timestamp": "2026-12-01T09:00:00Z",
        },
        {"AvailabilityZone": "us-east-1b", "InstanceType": "g5.xlarge", "SpotPrice": "junk"},
    ]
    zones = {"us-east-1a": "use1-az4", "us-east-1b": "use1-az6"}
    assert latest_spot_prices(history, zones) == {
        ("use1-az4", "g5.xlarge"): 0.45,
        ("use1-az6", "g5.xlarge"): 0.39,
    }


def test_offers_take_the_answered_prices_and_keep_the_rest() -> None:
    offers = default_offers_document()["offers"]
    g5 = [o for o in offers if o["instance_type"] == "g5.xlarge" and o["region"] == "us-east-1"]
    zone = g5[0]["zone"]
    new, report = refreshed_offers(offers, {("us-east-1", "g5.xlarge"): 1.2}, {(zone, "g5.xlarge"): 0.5})
    assert report.on_demand_updated == len(g5) and report.spot_updated == 1
    assert report.unchanged == len(offers) - len(g5)
    changed = [o for o in new if o["instance_type"] == "g5.xlarge" and o["region"] == "us-east-1"]
    assert all(o["on_demand_usd_h"] == 1.2 for o in changed)
    assert next(o for o in changed if o["zone"] == zone)["spot_usd_h"] == 0.5
    others = [o for o in new if not (o["instance_type"] == "g5.xlarge" and o["region"] == "us-east-1")]
    assert others == [o for o in offers if o not in g5]
    OffersDocument.model_validate({"offers": new})  # still a valid offers document
