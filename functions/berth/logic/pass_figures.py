"""The operational figures a scheduling pass knows, as data (``PassReport.figures``): its queue per
team and GPU type, and each team's monthly cloud budget burn. The scheduler's handler publishes them
as CloudWatch metrics (``berth.handlers.telemetry``); computing them here keeps the pass pure of any
metrics library. Pure.

The queue figures are those of the queued jobs the pass read (the heads of every team's queue, up to
its read budget: ``PassReport.not_considered`` counts the rest), so a team's depth is at most what
was read and its oldest age is that of the oldest job read, which is the team's oldest of the
highest priority it has queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from berth.domain.queue import QueueEntry
from berth.scheduler.snapshot import TenantState


@dataclass(frozen=True)
class QueueFigure:
    """Queued jobs of one team and GPU type that the pass read, and the oldest one's age."""

    tenant: str
    gpu_type: str
    depth: int
    oldest_s: float
    """Seconds since the oldest of them was submitted (a retried job's too: its age is the job's)."""


@dataclass(frozen=True)
class PassFigures:
    queue: list[QueueFigure] = field(default_factory=list)
    budget_used_pct: dict[str, float] = field(default_factory=dict)
    """Per team with a monthly cloud budget: its cloud spend this month as a percentage of it."""

    @property
    def oldest_queued_s(self) -> float:
        """The oldest queued job's age of every team (0 with nothing queued)."""
        return max((q.oldest_s for q in self.queue), default=0.0)


def queue_figures(pending: Iterable[QueueEntry], now: datetime) -> list[QueueFigure]:
    depth: dict[tuple[str, str], int] = {}
    oldest: dict[tuple[str, str], datetime] = {}
    for entry in pending:
        key = (entry.tenant, entry.gpu_type)
        depth[key] = depth.get(key, 0) + 1
        if key not in oldest or entry.created_at < oldest[key]:
            oldest[key] = entry.created_at
    return [
        QueueFigure(tenant, gpu, depth[key], max(0.0, (now - oldest[key]).total_seconds()))
        for key in sorted(depth)
        for tenant, gpu in (key,)
    ]


def budget_used_pct(tenants: Mapping[str, TenantState]) -> dict[str, float]:
    """A budget of 0 is spent from the start (100 %)."""
    out: dict[str, float] = {}
    for name, state in sorted(tenants.items()):
        budget = state.monthly_budget_usd
        if budget is None:
            continue
        out[name] = 100.0 if budget <= 0 else 100.0 * state.cloud_spend_month_usd / budget
    return out


def pass_figures(
    pending: Iterable[QueueEntry], tenants: Mapping[str, TenantState], now: datetime
) -> PassFigures:
    return PassFigures(queue=queue_figures(pending, now), budget_used_pct=budget_used_pct(tenants))
