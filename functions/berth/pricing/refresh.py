"""Refresh the offers' prices from AWS's own answers (pure parsing; the calls are made by
``berth_tools.prices``): the AWS Price List API (``pricing:GetProducts``) for on-demand prices and
EC2 ``DescribeSpotPriceHistory`` for spot prices. Offers no answer covers keep their price."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The Price List filters that select plain on-demand Linux instances (no licensed software,
#: shared tenancy, used capacity: not reservations).
PRICE_LIST_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


def price_list_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    """``GetProducts`` filters for one instance type in one region."""
    fields = {"instanceType": instance_type, "regionCode": region, **PRICE_LIST_FILTERS}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def on_demand_price(price_item: str | Mapping[str, Any]) -> tuple[str, str, float] | None:
    """(instance type, region, USD per hour) of one ``GetProducts`` PriceList entry (a JSON string),
    or None when it is not a plain hourly on-demand Linux price."""
    item = json.loads(price_item) if isinstance(price_item, str) else price_item
    attrs = (item.get("product") or {}).get("attributes") or {}
    if any(attrs.get(k) != v for k, v in PRICE_LIST_FILTERS.items()):
        return None
    itype, region = attrs.get("instanceType"), attrs.get("regionCode")
    if not itype or not region:
        return None
    for term in ((item.get("terms") or {}).get("OnDemand") or {}).values():
        for dim in (term.get("priceDimensions") or {}).values():
            usd = (dim.get("pricePerUnit") or {}).get("USD")
            if dim.get("unit") in ("Hrs", "Hours") and usd is not None:
                price = float(usd)
                if price > 0:
                    return itype, region, price
    return None


def latest_spot_prices(
    history: Iterable[Mapping[str, Any]], zone_ids: Mapping[str, str]
) -> dict[tuple[str, str], float]:
    """The newest spot price per (zone id, instance type) of ``DescribeSpotPriceHistory`` entries.
    ``zone_ids`` maps the account's zone names (us-east-1a) to zone ids (use1-az1), which the
    catalog uses because names differ from account to account."""
    newest: dict[tuple[str, str], tuple[datetime | str, float]] = {}
    for entry in history:
        zone = zone_ids.get(str(entry.get("AvailabilityZone")), str(entry.get("AvailabilityZone")))
        itype = str(entry.get("InstanceType"))
        try:
            price = float(entry["SpotPrice"])
        except (KeyError, TypeError, ValueError):
            continue
        at = entry.get("Timestamp") or ""
        key = (zone, itype)
        if price > 0 and (key not in newest or str(at) > str(newest[key][0])):
            newest[key] = (at, price)
    return {k: v[1] for k, v in newest.items()}


@dataclass
class RefreshReport:
    on_demand_updated: int = 0
    spot_updated: int = 0
    unchanged: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "on_demand_updated": self.on_demand_updated,
            "spot_updated": self.spot_updated,
            "unchanged": self.unchanged,
            "notes": list(self.notes),
        }


def refreshed_offers(
    offers: Iterable[Mapping[str, Any]],
    on_demand: Mapping[tuple[str, str], float],
    spot: Mapping[tuple[str, str], float],
) -> tuple[list[dict[str, Any]], RefreshReport]:
    """The offers (``OfferModel`` dicts) with the prices AWS answered: on-demand by (region,
    instance type), spot by (zone id, instance type)."""
    report = RefreshReport()
    out: list[dict[str, Any]] = []
    for offer in offers:
        new = dict(offer)
        od = on_demand.get((new["region"], new["instance_type"]))
        sp = spot.get((new["zone"], new["instance_type"]))
        changed = False
        if od is not None and od != new.get("on_demand_usd_h"):
            new["on_demand_usd_h"] = round(od, 6)
            report.on_demand_updated += 1
            changed = True
        if sp is not None and sp != new.get("spot_usd_h"):
            new["spot_usd_h"] = round(sp, 6)
            report.spot_updated += 1
            changed = True
        report.unchanged += int(not changed)
        out.append(new)
    return out, report
