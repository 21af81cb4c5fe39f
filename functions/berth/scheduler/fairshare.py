"""Weighted dominant resource fairness with decayed usage.

Resources are GPUs of each model (``gpu:<model>``), CPU and memory, each normalised by the
on-prem fleet's capacity of it (a cloud-only model by the fleet's GPU total). A tenant's share
of resource r blends its current allocation (on-prem and cloud) with its usage history:

    s_r = (1 - h) * alloc_r / cap_r + h * usage_r / (cap_r * tau)

where ``usage_r`` is resource-seconds decayed with half-life ``T`` (tau = T / ln 2, so steady
use of the whole fleet gives 1) and ``h`` the policy's ``history_weight``. The dominant share is
max_r s_r, and tenants are served in increasing order of dominant share / weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from berth.scheduler.policy import FairShareRule
from berth.scheduler.snapshot import RunningJob, TenantState


def resource_amounts(gpu_type: str, gpus: int, cpu_total: float, memory_total: float) -> dict[str, float]:
    return {"gpu:" + gpu_type: float(gpus), "cpu": cpu_total, "memory": memory_total}


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    return 0.5 ** (max(0.0, elapsed_s) / half_life_s)


class FairShare:
    """Allocation and history per tenant, with the dominant share kept current as jobs move."""

    __slots__ = ("_alloc", "_capacity", "_hist", "_w_alloc", "_weights", "shares")

    def __init__(
        self,
        tenants: Mapping[str, TenantState],
        running: Iterable[RunningJob],
        capacity: Mapping[str, float],
        rule: FairShareRule,
        now: float,
    ) -> None:
        self._capacity = dict(capacity)
        gpu_total = sum(v for k, v in capacity.items() if k.startswith("gpu:"))
        self._capacity["gpu:*"] = gpu_total or 1.0
        self._w_alloc = 1.0 - rule.history_weight
        tau = rule.half_life_s / math.log(2)
        self._alloc: dict[str, dict[str, float]] = {}
        self._hist: dict[str, dict[str, float]] = {}
        self._weights: dict[str, float] = {}
        self.shares: dict[str, float] = {}
        for name, t in tenants.items():
            self._weights[name] = t.weight if t.weight > 0 else 1.0
            if rule.history_weight > 0 and t.usage:
                f = decay_factor(now - t.usage_as_of, rule.half_life_s) if t.usage_as_of is not None else 1.0
                self._hist[name] = {
                    k: rule.history_weight * v * f / (self._cap(k) * tau) for k, v in t.usage.items()
                }
        alloc = self._alloc
        gpu_keys: dict[str, str] = {}
        for r in running:
            a = alloc.get(r.tenant)
            if a is None:
                a = alloc[r.tenant] = {}
            gk = gpu_keys.get(r.gpu_type)
            if gk is None:
                gk = gpu_keys[r.gpu_type] = "gpu:" + r.gpu_type
            a[gk] = a.get(gk, 0.0) + r.gpus
            if r.site == "onprem":
                n = r.nodes
                a["cpu"] = a.get("cpu", 0.0) + r.cpu * n
                a["memory"] = a.get("memory", 0.0) + r.memory_gib * n
        for name in set(self._weights) | set(self._alloc) | set(self._hist):
            self.shares[name] = self._compute(name)

    def _cap(self, key: str) -> float:
        cap = self._capacity.get(key)
        if not cap:
            cap = self._capacity["gpu:*"] if key.startswith("gpu:") else 1.0
        return cap

    def _add(self, tenant: str, amounts: Mapping[str, float]) -> None:
        alloc = self._alloc.setdefault(tenant, {})
        for k, v in amounts.items():
            alloc[k] = alloc.get(k, 0.0) + v

    def _compute(self, tenant: str) -> float:
        alloc = self._alloc.get(tenant, {})
        hist = self._hist.get(tenant, {})
        best = 0.0
        for k in alloc.keys() | hist.keys():
            s = self._w_alloc * alloc.get(k, 0.0) / self._cap(k) + hist.get(k, 0.0)
            if s > best:
                best = s
        return best / self._weights.get(tenant, 1.0)

    def key(self, tenant: str) -> float:
        """Weighted dominant share: lower goes first."""
        share = self.shares.get(tenant)
        if share is None:
            share = self.shares[tenant] = self._compute(tenant)
        return share

    def add(self, tenant: str, amounts: Mapping[str, float]) -> None:
        self._add(tenant, amounts)
        self.shares[tenant] = self._compute(tenant)

    def remove(self, tenant: str, amounts: Mapping[str, float]) -> None:
        self._add(tenant, {k: -v for k, v in amounts.items()})
        self.shares[tenant] = self._compute(tenant)

    def allocation(self, tenant: str) -> dict[str, float]:
        return dict(self._alloc.get(tenant, {}))
