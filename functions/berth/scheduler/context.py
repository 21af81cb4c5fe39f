"""The ledger of one pass: what has been given out so far, threaded through every step.

The steps of a pass (``ordering``, ``onprem_step``, ``preemption_step``, ``cloud_step``,
``packing``, ``repatriation``) are functions over this one object, so what they share is
visible in one place: free capacity, quotas in use, fair shares, the cloud's commitments and
each job's outcome. Memos keyed by a job's frozen shape (``ShapeKey``) make the 100,000th job
of a known shape cost a dictionary lookup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from berth.domain.job_spec import Priority
from berth.domain.placement import Site
from berth.scheduler.circuit import CircuitBoard
from berth.scheduler.decisions import Assignment, Decisions
from berth.scheduler.fairshare import FairShare
from berth.scheduler.outcomes import Step
from berth.scheduler.placement_onprem import OnPremIndex
from berth.scheduler.policy import ResidencyRule, SchedulingPolicy
from berth.scheduler.predictor import Runtime, fallback_runtime
from berth.scheduler.snapshot import PendingJob, RunningJob, Snapshot, TenantState

if TYPE_CHECKING:
    from berth.scheduler.cloud_step import CloudLedger
    from berth.scheduler.slots import SlotLedger

RANK = {p: p.rank for p in Priority}


class ShapeKey(NamedTuple):
    """What decides whether a job fits on-prem: equal keys fit (or fail) alike within a pass."""

    models: tuple[str, ...]
    gpus_per_node: int
    nodes: int
    cpu: float
    memory_gib: float
    pools: frozenset[str] | None


class PassContext:
    """Mutable state of one pass (one per ``schedule()`` call)."""

    def __init__(self, snapshot: Snapshot, policy: SchedulingPolicy, now: float) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.index = OnPremIndex(snapshot.hosts)
        self.circuits = CircuitBoard(snapshot.circuits, now, policy.circuit)
        self.fair = FairShare(snapshot.tenants, snapshot.running, self.index.capacity, policy.fair_share, now)
        self.decisions = Decisions()
        self.outcomes = self.decisions.outcomes
        self.onprem_used: dict[tuple[str, str], int] = {}
        # Cheap pre-checks for preemption: lowest priority each tenant runs on-prem, borrowed jobs.
        self.lowest_rank: dict[str, int] = {}
        self.any_borrowed = False
        for r in snapshot.running:
            if r.site == Site.ONPREM:
                key = (r.tenant, r.gpu_type)
                self.onprem_used[key] = self.onprem_used.get(key, 0) + r.gpus
                rank = RANK[r.priority]
                if rank < self.lowest_rank.get(r.tenant, 99):
                    self.lowest_rank[r.tenant] = rank
                if r.borrowed:
                    self.any_borrowed = True
        self.preempted: set[str] = set()
        self.preempt_budget = policy.preemption.max_per_pass
        self.repatriated: set[str] = set()
        self.no_fit: dict[ShapeKey, Step] = {}
        self.no_victims: set[tuple[object, ...]] = set()
        self.committed_usd: dict[str, float] = {}
        self.cloud_possible = policy.burst is not None and bool(snapshot.offers or snapshot.instances)
        self._accepted: dict[str, tuple[str, ...]] = {}
        self._residency: dict[tuple[str, tuple[str, ...]], list[ResidencyRule]] = {}
        self._runtimes: dict[tuple[object, ...], Runtime | None] = {}
        self._remaining: dict[tuple[object, ...], float | None] = {}
        self.victims_on_host: dict[str, list[RunningJob]] | None = None
        self.last_placed: Assignment | None = None
        # Set by the pass once the ledgers exist (they read this context to build themselves).
        self.cloud: CloudLedger
        self.slots: SlotLedger
        self.packs = False
        self.waiting_gpus: dict[str, int] = {}
        """GPUs of jobs left waiting so far in this pass, per model (``burst.estimate_wait``)."""

    # ------------------------------------------------------------------ shared lookups
    def accepted(self, gpu_type: str) -> tuple[str, ...]:
        models = self._accepted.get(gpu_type)
        if models is None:
            models = self._accepted[gpu_type] = self.policy.accepted_gpus(gpu_type)
        return models

    def residency(self, job: PendingJob) -> list[ResidencyRule]:
        key = (job.tenant, job.datasets)
        rules = self._residency.get(key)
        if rules is None:
            rules = self._residency[key] = self.policy.residency_for(job.tenant, job.datasets)
        return rules

    def tenant(self, name: str) -> TenantState:
        return self.snapshot.tenant(name)

    # ------------------------------------------------------------------ run times
    def runtime(
        self,
        tenant: str,
        family: str,
        gpu_type: str,
        gpus: int,
        estimate_s: float | None,
        timeout_s: float | None,
    ) -> Runtime | None:
        """The predicted whole run time of such a job (the predictor's, else the estimate, else
        the timeout). Memoised per pass: queues repeat the same few keys."""
        key = (tenant, family, gpu_type, gpus, estimate_s, timeout_s)
        hit = self._runtimes.get(key, self)
        if hit is not self:
            return hit  # type: ignore[return-value]
        model = self.snapshot.runtimes
        if model is None:
            rt = fallback_runtime(estimate_s, timeout_s)
        else:
            rt = model.predict(tenant, family, gpu_type, gpus, estimate_s, timeout_s)
        self._runtimes[key] = rt
        return rt

    def remaining_s(self, job: PendingJob, q: float) -> float | None:
        """The ``q`` quantile of a pending job's remaining run time (given its saved progress)."""
        mkey = (
            job.tenant,
            job.family,
            job.gpu_type,
            job.gpus,
            job.expected_duration_s,
            job.timeout_s,
            job.progress_s,
            q,
        )
        hit = self._remaining.get(mkey, self)
        if hit is not self:
            return hit  # type: ignore[return-value]
        rt = self.runtime(
            job.tenant, job.family, job.gpu_type, job.gpus, job.expected_duration_s, job.timeout_s
        )
        value = None if rt is None else rt.remaining(q, job.progress_s)
        self._remaining[mkey] = value
        return value

    def cost_horizon_s(self, job: PendingJob) -> float:
        """Run time that bounds a job's cost (``runtime.cost_q``; one hour when nothing is known)."""
        rem = self.remaining_s(job, self.policy.runtime.cost_q)
        return 3600.0 if rem is None else rem

    def expected_end(self, r: RunningJob, q: float) -> float | None:
        """When a running job is expected to end: its known end, else the ``q`` quantile of its run
        time given the work it has done (past its median, the prediction grows)."""
        if r.expected_end_at is not None:
            return r.expected_end_at
        rt = self.runtime(r.tenant, r.family, r.gpu_type, r.gpus, r.expected_duration_s, r.timeout_s)
        if rt is None:
            return None
        done = r.progress_s + max(0.0, self.now - r.started_at)
        return self.now + rt.remaining(q, done)
