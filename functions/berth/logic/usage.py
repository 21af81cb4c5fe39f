"""A tenant's usage and cost in a month, from the usage ledger: ``GET /v1/tenants/{tenant}/usage``.

Members read their own tenant's, admins any tenant's (the quota route's rule). The ledger holds one
record per job attempt: ended attempts with their final figures, running ones as of the last
accrual (``berth.domain.cost``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from berth.domain.cost import by_site, cloud_spend, month_of
from berth.domain.errors import Forbidden, NotFound, ValidationFailed
from berth.domain.ports import TenantRepository, UsageLedger
from berth.domain.tenancy import Caller, valid_tenant_name

MONTH_RE = re.compile(r"^(19|20|21)\d\d-(0[1-9]|1[0-2])$")


@dataclass(frozen=True)
class UsageService:
    tenants: TenantRepository
    usage: UsageLedger | None
    clock: Callable[[], datetime]

    def month(self, caller: Caller, tenant: str, month: str | None = None) -> dict[str, Any]:
        if not valid_tenant_name(tenant):
            raise ValidationFailed(f"invalid tenant name {tenant!r}")
        if month is not None and not MONTH_RE.match(month):
            raise ValidationFailed(f"invalid month {month!r}; expected YYYY-MM", details={"field": "month"})
        if not caller.is_admin and caller.tenant != tenant:
            raise Forbidden(f"only admins may read tenant {tenant!r}'s usage")
        quota = self.tenants.quota(tenant)
        if quota is None and not self.tenants.tenant_exists(tenant):
            raise NotFound(f"tenant {tenant!r} not found")
        if self.usage is None:
            raise NotFound("this deployment keeps no usage ledger")
        month = month or month_of(self.clock())
        records = self.usage.month(tenant, month)
        sites = by_site(records)
        budget = None if quota is None else quota.monthly_cloud_budget_usd
        spent = cloud_spend(records)
        return {
            "tenant": tenant,
            "month": month,
            "sites": [s.public() for s in sites],
            "attempts": len(records),
            "total_gpu_hours": round(sum(s.gpu_hours for s in sites), 4),
            "total_cost_usd": round(sum(s.cost_usd for s in sites), 4),
            "cloud_cost_usd": round(spent, 4),
            "monthly_budget_usd": budget,
            "budget_left_usd": None if budget is None else round(max(0.0, budget - spent), 4),
        }
