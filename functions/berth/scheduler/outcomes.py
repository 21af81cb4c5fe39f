"""What the pass tried for each job and why it stopped, as data (Armada's job scheduling context).

Every rule that can keep a job off a site has one id in ``Rule``. The pass records, per job, the
steps it took (a site, a rule id and a human detail); human reasons, ``explain_job`` and
``check_feasible`` are rendered from these records, so all three name the same rule for the same
cause and tests assert on rule ids rather than on prose.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from berth.domain.placement import Site
from berth.scheduler.decisions import Assignment


class Rule(StrEnum):
    """Why a site did not take a job (or, for ``FREE_SLOT``, why it did without waiting)."""

    PLACEMENT = "job.placement"
    """The job's own ``placement`` constraint excludes the site."""
    USE_ONPREM = "policy.use_onprem"
    BURST = "policy.burst"
    """The policy never bursts to the cloud."""
    BURST_TENANTS = "policy.burst.tenants"
    BURST_WAIT = "policy.burst.wait"
    """The job waits for on-prem before it may burst (relative to its predicted run time)."""
    RESIDENCY = "residency"
    REGIONS = "job.regions"
    AVOID = "retry.avoid"
    GPU_TYPE = "gpu_type"
    SHAPE = "shape"
    SPOT = "job.spot"
    MAX_USD_PER_GPU_HOUR = "policy.max_usd_per_gpu_hour"
    MAX_HOURLY_USD = "job.max_hourly_usd"
    MAX_COST_USD = "job.max_cost_usd"
    BUDGET = "tenant.monthly_budget_usd"
    QUOTA = "tenant.quota"
    """The job alone needs more GPUs of every allowed model than the tenant may ever hold on-prem."""
    BORROW_LIMIT = "tenant.borrow_limit"
    """With what the tenant already runs, the job would exceed its guarantee plus borrowing limit."""
    POOLS = "residency.pools"
    CIRCUIT = "circuit"
    CIRCUIT_PROBE = "circuit.half_open"
    OFFER_CAPACITY = "offer.capacity"
    NO_OFFERS = "offers"
    CAPACITY = "capacity"
    """On-prem has no room of the job's shape now."""
    FREE_SLOT = "policy.burst.free_slots"
    """Placed without waiting in a free slot of a cloud instance already paid for longer than the
    job is predicted to need (``burst.pack_instances``)."""


# Rules that are a shortage of hardware or offers rather than a policy or a constraint.
SHORTAGE_RULES = frozenset({Rule.CAPACITY, Rule.GPU_TYPE, Rule.SHAPE, Rule.NO_OFFERS, Rule.OFFER_CAPACITY})


@dataclass(slots=True, frozen=True)
class Exclusion:
    """The rule (or shortage) that keeps a job off a site, and a sentence for humans."""

    rule: Rule
    message: str
    subject: str = ""
    """Which instance of the rule: a residency rule's label, an instance type, a region."""


@dataclass(slots=True, frozen=True)
class Step:
    """One site the pass considered for a job and why it stopped there."""

    site: Site
    rule: Rule
    detail: str
    at: float | None = None
    """For ``BURST_WAIT``: when the job may burst."""

    def render(self) -> str:
        return f"{'on-prem' if self.site is Site.ONPREM else 'cloud'}: {self.detail}"


@dataclass(slots=True, frozen=True)
class JobOutcome:
    """A job's outcome in one pass: where it was placed (None: left pending) and, in order, the
    sites that did not take it. Immutable, so jobs that failed for the same reason share one."""

    placed: Assignment | None
    steps: tuple[Step, ...] = ()

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(s.rule for s in self.steps)

    def step(self, site: Site) -> Step | None:
        return next((s for s in self.steps if s.site is site), None)

    def reason(self) -> str:
        """The human reason of a job left pending: one clause per site."""
        return "; ".join(s.render() for s in self.steps) or "pending"


def step_from(site: Site, ex: Exclusion) -> Step:
    return Step(site, ex.rule, ex.message)
