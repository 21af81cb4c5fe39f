"""The largest per-node shape a GPU model comes in: for a submit refusal that says what would fit.

A node's share of a job (GPUs, CPU, memory per node) must fit one on-prem host or one cloud
instance; ``check_feasible`` names these when a job's node is bigger than anything that exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from berth.scheduler.snapshot import CloudOffer, Host


@dataclass(slots=True, frozen=True)
class NodeShape:
    """One node's room: GPUs, CPUs and memory, and where it is (an instance type or ``on-prem host``)."""

    gpu_type: str
    gpus: int
    cpu: float
    memory_gib: float
    where: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type,
            "gpus": self.gpus,
            "cpu": self.cpu,
            "memory_gib": self.memory_gib,
            "where": self.where,
        }


@dataclass(slots=True, frozen=True)
class LargestShapes:
    gpu_type: str
    cloud: NodeShape | None
    onprem: NodeShape | None

    def describe(self) -> str:
        """E.g. ``the largest A100 shape is 8 GPUs, 96 vCPUs, 1152 GiB per node (p4d.24xlarge) /
        8 GPUs, 64 CPUs, 488 GiB per on-prem host``."""
        parts = []
        if self.cloud is not None:
            c = self.cloud
            model = "" if c.gpu_type == self.gpu_type else f", {c.gpu_type}"
            parts.append(f"{c.gpus} GPUs, {c.cpu:g} vCPUs, {c.memory_gib:g} GiB per node ({c.where}{model})")
        if self.onprem is not None:
            h = self.onprem
            model = "" if h.gpu_type == self.gpu_type else f" ({h.gpu_type})"
            parts.append(f"{h.gpus} GPUs, {h.cpu:g} CPUs, {h.memory_gib:g} GiB per on-prem host{model}")
        if not parts:
            return f"no host or cloud offer has {self.gpu_type} GPUs"
        return f"the largest {self.gpu_type} shape is " + " / ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type,
            "cloud": None if self.cloud is None else self.cloud.to_dict(),
            "onprem": None if self.onprem is None else self.onprem.to_dict(),
        }


def _key(s: NodeShape) -> tuple[int, float, float, str]:
    return (s.gpus, s.cpu, s.memory_gib, s.where)


def largest_shapes(
    gpu_type: str, models: Iterable[str], hosts: Iterable[Host], offers: Iterable[CloudOffer]
) -> LargestShapes:
    """The largest instance type and host (by GPUs, then CPU, then memory) of the ``models``
    (the job's model and its accepted equivalents)."""
    wanted = frozenset(models)
    cloud: NodeShape | None = None
    for o in offers:
        if o.gpu_type in wanted:
            s = NodeShape(o.gpu_type, o.gpus, o.vcpus, o.memory_gib, o.instance_type)
            if cloud is None or _key(s) > _key(cloud):
                cloud = s
    onprem: NodeShape | None = None
    for h in hosts:
        if h.gpu_type in wanted:
            s = NodeShape(h.gpu_type, h.gpus, h.cpu, h.memory_gib, "on-prem host")
            if onprem is None or _key(s) > _key(onprem):
                onprem = s
    return LargestShapes(gpu_type, cloud, onprem)
