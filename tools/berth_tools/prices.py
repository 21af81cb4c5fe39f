"""Fetch current AWS prices for the cloud offers: on-demand from the AWS Price List API
(``pricing:GetProducts``), spot from EC2 ``DescribeSpotPriceHistory`` in each offer region (zone
names mapped to zone ids with ``DescribeAvailabilityZones``). Where a source cannot be reached
(no credentials, no network, an endpoint that lacks the API such as the local cloud's), its
prices stay as they were and a note says why. Parsing is in ``berth.pricing.refresh``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from berth.pricing.refresh import (
    RefreshReport,
    latest_spot_prices,
    on_demand_price,
    price_list_filters,
    refreshed_offers,
)

#: The Price List API answers in a few regions only; us-east-1 is one.
PRICING_REGION = "us-east-1"

ClientFactory = Callable[[str, str], Any]
"""(service, region) -> a boto3 client."""


def default_clients(profile: str | None = None) -> ClientFactory:
    session = boto3.session.Session(profile_name=profile)

    def client(service: str, region: str) -> Any:
        return session.client(service, region_name=region)  # type: ignore[call-overload]

    return client


def _why(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', 'Error')}: {err.get('Message', '')}".strip(": ")
    return f"{exc.__class__.__name__}: {exc}"


def fetch_on_demand(
    clients: ClientFactory, pairs: Iterable[tuple[str, str]], notes: list[str]
) -> dict[tuple[str, str], float]:
    """On-demand USD/h per (region, instance type) from the Price List API."""
    out: dict[tuple[str, str], float] = {}
    try:
        pricing = clients("pricing", PRICING_REGION)
        for region, itype in sorted(set(pairs)):
            pages = pricing.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2", Filters=price_list_filters(itype, region), FormatVersion="aws_v1"
            )
            for page in pages:
                for item in page.get("PriceList", []):
                    found = on_demand_price(item)
                    if found is not None and (found[1], found[0]) == (region, itype):
                        out[(region, itype)] = found[2]
    except (BotoCoreError, ClientError) as exc:
        notes.append(f"AWS Price List API unreachable ({_why(exc)}): on-demand prices kept")
    return out


def fetch_spot(
    clients: ClientFactory, by_region: Mapping[str, set[str]], notes: list[str]
) -> dict[tuple[str, str], float]:
    """The current spot USD/h per (zone id, instance type), region by region."""
    out: dict[tuple[str, str], float] = {}
    for region, itypes in sorted(by_region.items()):
        try:
            ec2 = clients("ec2", region)
            zones = {
                z["ZoneName"]: z.get("ZoneId", z["ZoneName"])
                for z in ec2.describe_availability_zones()["AvailabilityZones"]
            }
            history: list[dict[str, Any]] = []
            pages = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=sorted(itypes),
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=datetime.now(UTC),
            )
            for page in pages:
                history.extend(page.get("SpotPriceHistory", []))
            out.update(latest_spot_prices(history, zones))
        except (BotoCoreError, ClientError) as exc:
            notes.append(f"EC2 spot price history unreachable in {region} ({_why(exc)}): spot prices kept")
    return out


@dataclass(frozen=True)
class Refreshed:
    document: dict[str, Any]
    report: RefreshReport

    @property
    def changed(self) -> bool:
        return bool(self.report.on_demand_updated or self.report.spot_updated)


def refresh_document(document: Mapping[str, Any], clients: ClientFactory) -> Refreshed:
    """The offers document with the prices AWS answers now (the rest unchanged)."""
    offers = list(document.get("offers") or [])
    notes: list[str] = []
    on_demand = fetch_on_demand(clients, ((o["region"], o["instance_type"]) for o in offers), notes)
    by_region: dict[str, set[str]] = {}
    for o in offers:
        if o.get("spot_usd_h") is not None:
            by_region.setdefault(o["region"], set()).add(o["instance_type"])
    spot = fetch_spot(clients, by_region, notes)
    new_offers, report = refreshed_offers(offers, on_demand, spot)
    report.notes.extend(notes)
    return Refreshed({**dict(document), "offers": new_offers}, report)
