"""The simulated usage ledger: what the service's store would hold about tenants (allocation,
decayed usage for fair share, cloud spend per month), turned into the snapshot's TenantState."""

from __future__ import annotations

import math

from berth.scheduler.fairshare import decay_factor, resource_amounts
from berth.scheduler.policy import FairShareRule
from berth.scheduler.snapshot import TenantState
from berth_tools.sim.cluster import ClusterSpec

MONTH_S = 30 * 86400


class TenantLedger:
    def __init__(self, cluster: ClusterSpec, names: list[str], rule: FairShareRule) -> None:
        self.cluster = cluster
        self.rule = rule
        self.names = names
        self.alloc: dict[str, dict[str, float]] = {n: {} for n in names}
        self.usage: dict[str, dict[str, float]] = {n: {} for n in names}
        self.usage_at = 0.0
        self.spend_month: dict[tuple[str, int], float] = {}

    def allocate(self, tenant: str, gpu_type: str, gpus: int, cpu: float, memory: float, sign: float) -> None:
        """A job starts (sign 1) or stops (-1): GPUs count on either site, CPU and memory on-prem
        only (``cpu``/``memory`` 0 in the cloud), as fair share counts them."""
        a = self.alloc[tenant]
        for k, v in resource_amounts(gpu_type, gpus, cpu, memory).items():
            if v:
                a[k] = a.get(k, 0.0) + sign * v

    def charge(self, tenant: str, usd: float, now: float) -> None:
        key = (tenant, int(now // MONTH_S))
        self.spend_month[key] = self.spend_month.get(key, 0.0) + usd

    def tenants(self, now: float) -> dict[str, TenantState]:
        rule = self.rule
        if rule.history_weight > 0 and now > self.usage_at:
            f = decay_factor(now - self.usage_at, rule.half_life_s)
            tau = rule.half_life_s / math.log(2)
            for name in self.names:
                u = self.usage[name]
                for k in u:
                    u[k] *= f
                for k, v in self.alloc[name].items():
                    u[k] = u.get(k, 0.0) + v * tau * (1.0 - f)
            self.usage_at = now
        month = int(now // MONTH_S)
        out = {}
        for name in self.names:
            base = self.cluster.tenant_state(name)
            out[name] = TenantState(
                name=name,
                weight=base.weight,
                guaranteed_gpus=base.guaranteed_gpus,
                borrow_limit_gpus=base.borrow_limit_gpus,
                default_borrow_limit=base.default_borrow_limit,
                monthly_budget_usd=base.monthly_budget_usd,
                cloud_spend_month_usd=self.spend_month.get((name, month), 0.0),
                usage=dict(self.usage[name]),
                usage_as_of=now,
            )
        return out
