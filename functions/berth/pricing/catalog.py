"""Load the shipped AWS GPU price catalog as scheduler CloudOffers (package data, read-only)."""

from __future__ import annotations

import csv
import io
from collections.abc import Collection
from importlib import resources

from berth.scheduler.snapshot import CloudOffer

CATALOG_FILE = "aws-gpu-instances.csv"

# The catalog's GPU names where they differ from the job spec's (berth.domain.job_spec.GPU_TYPES).
GPU_NAME_ALIASES = {"A100-80GB": "A100-80G"}


def catalog_text() -> str:
    return resources.files("berth.pricing").joinpath(CATALOG_FILE).read_text(encoding="utf-8")


def parse_catalog(text: str) -> list[CloudOffer]:
    offers = []
    for row in csv.DictReader(io.StringIO(text)):
        spot = row.get("spot_usd_h", "").strip()
        offers.append(
            CloudOffer(
                region=row["region"],
                zone=row["zone"],
                instance_type=row["instance_type"],
                gpu_type=GPU_NAME_ALIASES.get(row["gpu"], row["gpu"]),
                gpus=int(row["gpus"]),
                vcpus=float(row["vcpus"]),
                memory_gib=float(row["memory_gib"]),
                on_demand_usd_h=float(row["on_demand_usd_h"]),
                spot_usd_h=float(spot) if spot else None,
            )
        )
    return offers


def load_offers(
    regions: Collection[str] | None = None,
    gpu_types: Collection[str] | None = None,
    instance_types: Collection[str] | None = None,
) -> tuple[CloudOffer, ...]:
    """Offers of the shipped catalog, filtered; in catalog order."""
    return tuple(
        o
        for o in parse_catalog(catalog_text())
        if (regions is None or o.region in regions)
        and (gpu_types is None or o.gpu_type in gpu_types)
        and (instance_types is None or o.instance_type in instance_types)
    )
