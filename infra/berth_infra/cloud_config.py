"""The cloud (AWS Batch) configuration of the CDK app: regions, instance types, tenants, home region.

Context keys (cdk.json or ``-c``):

- ``berth:cloudRegions``: a list (or its JSON text) of ``{region, instance_types: [...], max_vcpus}``.
  Default: every region of the shipped price file (``functions/berth/pricing/aws-gpu-instances.csv``)
  with its instance types of the families in ``DEFAULT_FAMILIES``.
- ``berth:tenants``: the tenants that get a Batch job role (``Berth-job-<tenant>``); default the
  tenants the local cloud seeds.
- ``berth:homeRegion``: the region of the ``Berth`` stack (its event bus); default ``berth:region``,
  else ``us-east-1``.

Names are deterministic (docs/cloud.md), so no stack refers to another one. Each region gets one
compute environment and job queue per (instance type, purchase type), ``berth-<region>-<family>_<size>-
<ondemand|spot>`` (``berth.domain.batch_queues``): AWS Batch chooses neither the GPU model nor the
instance size, and the sizes of one family differ in price, so a queue holds the one instance type the
scheduler priced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from constructs import Construct

from berth.domain.batch_queues import CloudCapacity, batch_queue_name, instance_family
from berth.pricing.catalog import load_offers

#: GPU instance families Berth runs in the cloud (single- and multi-GPU sizes; the scheduler packs
#: several jobs onto one multi-GPU instance).
DEFAULT_FAMILIES = ("g5", "g6", "g6e", "p3", "p4d", "p5")
#: vCPU ceiling of each compute environment (8 x p5.48xlarge = 1536; 4 x p4d.24xlarge = 384).
DEFAULT_MAX_VCPUS = 768
#: Instance types per region: two compute environments and two job queues each, under AWS Batch's
#: default quota of 50 of each per account and region (room left for other users of the account).
MAX_INSTANCE_TYPES_PER_REGION = 20
#: The tenants ``berth local up`` seeds (tools/berth_tools/localcloud/seed.py DEFAULT_USERS).
DEFAULT_TENANTS = ("vision", "nlp", "platform")
DEFAULT_HOME_REGION = "us-east-1"
#: Batch job roles are named ``Berth-job-<tenant>`` and tagged ``berth:tenant=<tenant>``.
JOB_ROLE_PREFIX = "Berth-job-"
#: ECS execution roles (resolve a job definition's ``secrets``): ``Berth-exec-<tenant>``, same tag.
EXEC_ROLE_PREFIX = "Berth-exec-"
TENANT_TAG = "berth:tenant"
#: The job tag the dispatcher puts on every Batch job (and the env var the launcher reads).
JOB_TENANT_TAG = "BERTH_TENANT"
#: Where job output goes (CloudWatch Logs, home region): ``/berth/jobs/<tenant>``.
JOB_LOG_GROUP_PREFIX = "/berth/jobs"
#: The regional rule that forwards Batch job state changes to the home bus, and its role's name.
FORWARD_RULE_NAME = "berth-batch-state-changes"
FORWARD_ROLE_PREFIX = "Berth-batch-events-"

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_TENANT = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")


class CloudConfigError(ValueError):
    pass


@dataclass(frozen=True)
class CloudRegion:
    region: str
    instance_types: tuple[str, ...]
    max_vcpus: int = DEFAULT_MAX_VCPUS

    @property
    def families(self) -> tuple[str, ...]:
        """The instance families (GPU models) of ``instance_types``, in first-seen order."""
        return tuple(dict.fromkeys(instance_family(t) for t in self.instance_types))

    def instance_types_of(self, family: str) -> tuple[str, ...]:
        return tuple(t for t in self.instance_types if instance_family(t) == family)

    def name(self, instance_type: str, spot: bool) -> str:
        """Compute environment and job queue name (= scheduler ``CloudOffer.queue_name(spot)`` of an
        offer of this instance type in this region): one per instance type and purchase type."""
        return batch_queue_name(self.region, instance_type, spot)

    @property
    def stack_name(self) -> str:
        return f"Berth-batch-{self.region}"

    def as_json(self) -> dict[str, object]:
        return {
            "region": self.region,
            "instance_types": list(self.instance_types),
            "max_vcpus": self.max_vcpus,
            "families": {family: list(self.instance_types_of(family)) for family in self.families},
            "queues": {
                instance_type: {
                    "ondemand": self.name(instance_type, False),
                    "spot": self.name(instance_type, True),
                }
                for instance_type in self.instance_types
            },
        }


def cloud_capacity(regions: list[CloudRegion]) -> CloudCapacity:
    """What the regions' compute environments hold: the functions that read offers get it
    (``BERTH_CLOUD_CAPACITY``) and offer nothing else."""
    return CloudCapacity.of({r.region: r.instance_types for r in regions})


def default_cloud_regions(families: tuple[str, ...] = DEFAULT_FAMILIES) -> list[CloudRegion]:
    """Every region of the shipped price file with its instance types of ``families``."""
    by_region: dict[str, list[str]] = {}
    for offer in load_offers():
        if offer.instance_type.split(".", 1)[0] in families:
            types = by_region.setdefault(offer.region, [])
            if offer.instance_type not in types:
                types.append(offer.instance_type)
    return [CloudRegion(region, tuple(sorted(types))) for region, types in sorted(by_region.items())]


def parse_cloud_regions(value: object) -> list[CloudRegion]:
    """``berth:cloudRegions`` as given (a list, or its JSON text from ``-c``), validated."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise CloudConfigError(f"berth:cloudRegions is not JSON: {exc}") from exc
    if not isinstance(value, list) or not value:
        raise CloudConfigError("berth:cloudRegions must be a non-empty list of {region, instance_types}")
    regions: list[CloudRegion] = []
    for item in value:
        if not isinstance(item, dict):
            raise CloudConfigError(f"berth:cloudRegions entry {item!r} is not an object")
        region = item.get("region")
        types = item.get("instance_types")
        max_vcpus = item.get("max_vcpus", DEFAULT_MAX_VCPUS)
        if not isinstance(region, str) or not _REGION.match(region):
            raise CloudConfigError(f"berth:cloudRegions: bad region {region!r}")
        if (
            not isinstance(types, list)
            or not types
            or not all(isinstance(t, str) and _INSTANCE_TYPE.match(t) for t in types)
        ):
            raise CloudConfigError(f"berth:cloudRegions: {region} needs a list of instance types")
        if not isinstance(max_vcpus, int) or isinstance(max_vcpus, bool) or max_vcpus <= 0:
            raise CloudConfigError(f"berth:cloudRegions: {region} max_vcpus must be a positive integer")
        cloud_region = CloudRegion(region, tuple(dict.fromkeys(types)), max_vcpus)
        if len(cloud_region.instance_types) > MAX_INSTANCE_TYPES_PER_REGION:
            raise CloudConfigError(
                f"berth:cloudRegions: {region} has {len(cloud_region.instance_types)} instance types; at "
                f"most {MAX_INSTANCE_TYPES_PER_REGION} (each is two compute environments and two job queues)"
            )
        regions.append(cloud_region)
    names = [r.region for r in regions]
    if len(set(names)) != len(names):
        raise CloudConfigError("berth:cloudRegions names a region twice")
    return regions


def cloud_regions(scope: Construct) -> list[CloudRegion]:
    value = scope.node.try_get_context("berth:cloudRegions")
    return default_cloud_regions() if value is None else parse_cloud_regions(value)


def tenants(scope: Construct) -> list[str]:
    value = scope.node.try_get_context("berth:tenants")
    if value is None:
        return list(DEFAULT_TENANTS)
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith("[") else value.split(",")
    if not isinstance(value, list) or not value:
        raise CloudConfigError("berth:tenants must be a non-empty list of tenant names")
    names = [str(t).strip() for t in value]
    for name in names:
        if not _TENANT.match(name):
            raise CloudConfigError(f"berth:tenants: bad tenant name {name!r}")
    if len(set(names)) != len(names):
        raise CloudConfigError("berth:tenants names a tenant twice")
    return names


def home_region(scope: Construct) -> str:
    value = scope.node.try_get_context("berth:homeRegion") or scope.node.try_get_context("berth:region")
    return str(value) if value else DEFAULT_HOME_REGION
