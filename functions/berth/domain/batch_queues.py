"""AWS Batch queue names and the deployed cloud capacity (docs/cloud.md, "Queues per instance type").

AWS Batch chooses neither a GPU model nor an instance size: a job asking for one GPU in a queue whose
compute environment mixes g5.xlarge (1 A10G, 1.006 USD/h) and g5.12xlarge (4 A10G, 5.672 USD/h), or
g5 (A10G) and p5 (H100) instances, may land on any of them. So Berth deploys one compute environment
and one job queue per (region, instance type, purchase type), named
``berth-<region>-<family>_<size>-<ondemand|spot>`` (``g5.12xlarge`` -> ``g5_12xlarge``: Batch names
allow no dot), each holding that one instance type; the scheduler's chosen offer decides the queue
(``CloudOffer.queue_name``), so the instance it priced is the one Batch launches.

``CloudCapacity`` is what those compute environments can run: the instance types of each region. The
stack passes it to the functions that read offers (``BERTH_CLOUD_CAPACITY``, JSON
``{"<region>": ["<instance type>", ...]}``) so that nothing is offered that no compute environment has.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Every Berth queue and compute environment name starts with it (the regional EventBridge rule
#: forwards the state changes of ``job-queue/berth-*`` only).
QUEUE_PREFIX = "berth-"
ONDEMAND = "ondemand"
SPOT = "spot"

_REGION = r"[a-z]{2}(?:-[a-z]+)+-\d"
_FAMILY = r"[a-z][a-z0-9-]*"
_SIZE = r"[a-z0-9]+"
_QUEUE = re.compile(
    rf"^{QUEUE_PREFIX}(?P<region>{_REGION})-(?P<family>{_FAMILY})_(?P<size>{_SIZE})"
    rf"-(?P<purchase>{ONDEMAND}|{SPOT})$"
)
_REGION_ONLY = re.compile(rf"^{_REGION}$")
_INSTANCE_TYPE = re.compile(r"^(?P<family>[a-z][a-z0-9-]*)\.[a-z0-9]+$")


class CloudCapacityError(ValueError):
    """A malformed deployed-capacity document (a deployment mistake, not a user's)."""


def instance_family(instance_type: str) -> str:
    """``g5.12xlarge`` -> ``g5``: the part before the size. One family is one GPU model."""
    return instance_type.split(".", 1)[0]


def purchase(spot: bool) -> str:
    return SPOT if spot else ONDEMAND


def batch_queue_name(region: str, instance_type: str, spot: bool) -> str:
    """The job queue (and compute environment) of ``instance_type`` instances in ``region``:
    ``berth-us-east-1-g5_12xlarge-ondemand``."""
    return f"{QUEUE_PREFIX}{region}-{instance_type.replace('.', '_', 1)}-{purchase(spot)}"


@dataclass(frozen=True, slots=True)
class QueueName:
    region: str
    instance_type: str
    spot: bool

    @property
    def family(self) -> str:
        return instance_family(self.instance_type)


def parse_batch_queue_name(name: str) -> QueueName | None:
    """The parts of a Berth queue name (None: not one of Berth's per-instance-type queues)."""
    m = _QUEUE.match(name)
    if m is None:
        return None
    return QueueName(m["region"], f"{m['family']}.{m['size']}", m["purchase"] == SPOT)


@dataclass(frozen=True)
class CloudCapacity:
    """The instance types the deployed compute environments hold, per region."""

    regions: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, regions: Mapping[str, Iterable[str]]) -> CloudCapacity:
        return cls({r: frozenset(types) for r, types in regions.items()})

    @classmethod
    def from_json(cls, text: str) -> CloudCapacity:
        """Parse ``BERTH_CLOUD_CAPACITY`` (``{"<region>": ["<instance type>", ...]}``)."""
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise CloudCapacityError(f"cloud capacity is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise CloudCapacityError("cloud capacity is a JSON object of region -> instance types")
        regions: dict[str, frozenset[str]] = {}
        for region, types in value.items():
            if not isinstance(region, str) or not _REGION_ONLY.match(region):
                raise CloudCapacityError(f"cloud capacity: bad region {region!r}")
            if not isinstance(types, list) or not all(
                isinstance(t, str) and _INSTANCE_TYPE.match(t) for t in types
            ):
                raise CloudCapacityError(f"cloud capacity: {region} needs a list of instance types")
            regions[region] = frozenset(types)
        return cls(regions)

    def to_json(self) -> str:
        return json.dumps(
            {r: sorted(types) for r, types in sorted(self.regions.items())}, separators=(",", ":")
        )

    def has(self, region: str, instance_type: str) -> bool:
        """Whether a compute environment in ``region`` holds ``instance_type``."""
        return instance_type in self.regions.get(region, frozenset())

    def families(self, region: str) -> list[str]:
        return sorted({instance_family(t) for t in self.regions.get(region, frozenset())})

    def queue_names(self) -> list[str]:
        """Every job queue the deployment has (one per region, instance type and purchase type)."""
        return [
            batch_queue_name(region, instance_type, spot)
            for region in sorted(self.regions)
            for instance_type in sorted(self.regions[region])
            for spot in (False, True)
        ]
