"""What a job costs: the rates, the cost of an attempt so far, and the ``max_cost_usd`` limit. Pure.

An attempt costs its hourly rate times the time it has run (from the first rank's ``started``
report, or the cloud job's start, to now or to its end):

- cloud: the placement's ``hourly_usd``, which the scheduler core already gives as the job's own
  cost (the whole price of its instances, or its GPU share of a shared instance);
- on-prem: an internal rate per GPU-hour (``CostRates.onprem_usd_per_gpu_hour``, in the scheduling
  policy's ``accounting`` section) times the GPUs the placement holds.

Either rate is fixed on the placement (``hourly_usd``) when the attempt is placed, so a price or
policy change never reprices a running attempt, and whoever ends the attempt needs no policy.

A job's ``cost_usd`` is the cost of its ended attempts (``RunState.cost_done_usd``) plus the
current attempt's so far. Usage is attributed to the month (UTC) in which the attempt started.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from berth.domain.job import Job
from berth.domain.placement import CloudPlacement, JobPlacement, OnPremPlacement, Site


class CostRates(BaseModel):
    """How Berth prices on-prem time and how often it writes a running job's cost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    onprem_usd_per_gpu_hour: Annotated[float, Field(ge=0, le=10_000)] = 1.0
    """The internal rate charged for one on-prem GPU-hour (chargeback)."""
    accrual_step_usd: Annotated[float, Field(gt=0, le=1_000)] = 0.01
    """A running job's stored cost is rewritten only once it moved by at least this much ..."""
    accrual_interval_s: Annotated[float, Field(ge=0, le=86_400)] = 60.0
    """... and at most once per this many seconds (bounds the write rate of big jobs)."""


def onprem_hourly_usd(rates: CostRates, gpus: int) -> float:
    """What ``gpus`` on-prem GPUs cost per hour at the internal rate."""
    return rates.onprem_usd_per_gpu_hour * gpus


def placement_gpus(placement: JobPlacement, job_gpus: int) -> int:
    if isinstance(placement, OnPremPlacement):
        return sum(h.gpus for h in placement.hosts)
    return job_gpus


def month_of(at: datetime) -> str:
    """``YYYY-MM`` (UTC): the ledger's month key."""
    return at.astimezone(UTC).strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class AttemptUsage:
    """What one attempt used up to some time: the ledger's record of it (one per job and attempt)."""

    tenant: str
    month: str
    job_id: str
    attempt: int
    site: Site
    location: str
    """The pool (on-prem) or region (cloud) it ran in."""
    gpus: int
    seconds: float
    hourly_usd: float
    final: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.seconds / 3600.0

    @property
    def cost_usd(self) -> float:
        return self.hourly_usd * self.seconds / 3600.0


def attempt_usage(job: Job, until: datetime, final: bool = False) -> AttemptUsage | None:
    """The current attempt's usage from its start to ``until`` (None: not placed or not started)."""
    placement, started = job.placement, job.run.attempt.started_at
    if placement is None or started is None or job.attempts < 1:
        return None
    location = placement.region if isinstance(placement, CloudPlacement) else placement.pool
    return AttemptUsage(
        tenant=job.tenant,
        month=month_of(started),
        job_id=job.id,
        attempt=job.attempts,
        site=placement.site,
        location=location,
        gpus=placement_gpus(placement, job.spec.resources.gpus),
        seconds=max(0.0, (until - started).total_seconds()),
        hourly_usd=placement.hourly_usd,
        final=final,
    )


def cost_now(job: Job, now: datetime) -> float:
    """The job's whole cost so far: its ended attempts plus the current one up to ``now``."""
    usage = attempt_usage(job, now)
    return job.run.cost_done_usd + (0.0 if usage is None else usage.cost_usd)


def accrual_due(job: Job, now: datetime, rates: CostRates) -> float | None:
    """The cost to store on a running job now, or None when the stored one is close enough (moved
    by less than ``accrual_step_usd``, or written less than ``accrual_interval_s`` ago)."""
    cost = cost_now(job, now)
    if cost - job.cost_usd < rates.accrual_step_usd:
        return None
    last = job.run.attempt.cost_at
    if last is not None and (now - last).total_seconds() < rates.accrual_interval_s:
        return None
    return cost


@dataclass(frozen=True, slots=True)
class CostLimit:
    """When the running attempt must be stopped so the job stays within ``max_cost_usd``."""

    limit_usd: float
    spent_usd: float
    stop_in_s: float
    """Seconds from now until it must be stopped (<= 0: now)."""

    @property
    def reason(self) -> str:
        return f"cost limit max_cost_usd={self.limit_usd:.2f} reached ({self.spent_usd:.2f} spent)"


def cost_limit(job: Job, now: datetime, margin_s: float) -> CostLimit | None:
    """The job's ``max_cost_usd`` as seen now. ``margin_s`` is how long a stop takes to take effect
    (the directive's delivery and the attempt's end): the attempt must be stopped that long before
    its cost would reach the limit. None: no limit, or not running."""
    limit = job.spec.constraints.max_cost_usd
    if limit is None or job.placement is None or job.run.attempt.started_at is None:
        return None
    spent = cost_now(job, now)
    rate = job.placement.hourly_usd
    if rate <= 0:
        return CostLimit(limit, spent, float("inf") if spent < limit else 0.0)
    stop_in = (limit - spent) * 3600.0 / rate - margin_s
    return CostLimit(limit, spent, stop_in)


@dataclass(frozen=True, slots=True)
class SiteUsage:
    site: str
    gpu_hours: float
    cost_usd: float

    def public(self) -> dict[str, object]:
        return {"site": self.site, "gpu_hours": round(self.gpu_hours, 4), "cost_usd": round(self.cost_usd, 4)}


def by_site(records: list[AttemptUsage]) -> list[SiteUsage]:
    """A month's attempts summed per site (on-prem, cloud), in that order, sites without use left out."""
    totals: dict[Site, tuple[float, float]] = {}
    for r in records:
        h, c = totals.get(r.site, (0.0, 0.0))
        totals[r.site] = (h + r.gpu_hours, c + r.cost_usd)
    return [SiteUsage(str(s), *totals[s]) for s in (Site.ONPREM, Site.CLOUD) if s in totals]


def cloud_spend(records: list[AttemptUsage]) -> float:
    """What a month's cloud attempts cost (what the tenant's monthly cloud budget counts)."""
    return sum(r.cost_usd for r in records if r.site is Site.CLOUD)
