"""The scheduling pass: ``schedule(snapshot, policy, now) -> Decisions``. Pure and deterministic.

The one place placements are decided. Order of work (docs/scheduling.md has the full story):
1. Build the pass ledger (``context.PassContext``): free-capacity index, circuit states, quotas
   in use, fair shares, open shared cloud instances.
2. Serve pending jobs one at a time (``ordering``): each is tried on-prem (``onprem_step``: best
   fit, gang all-or-nothing, quota-bound; else ``preemption_step``), then in the cloud once it
   may burst (``cloud_step``: a free slot of a shared instance, else the cheapest priced offer,
   open circuits skipped). Every job gets a typed outcome (``outcomes.JobOutcome``).
3. Pack the single-node jobs that burst onto shared instances and start waiting jobs in slots
   paid for anyway (``packing``, with ``burst.pack_instances``).
4. Repatriate checkpointing cloud jobs onto capacity no pending job could use (``repatriation``).
"""

from __future__ import annotations

import gc
from itertools import compress, islice
from operator import attrgetter, floordiv

from berth.domain.job_spec import PlacementConstraint
from berth.domain.placement import Site
from berth.scheduler import cloud_step
from berth.scheduler.context import PassContext, ShapeKey
from berth.scheduler.decisions import Decisions
from berth.scheduler.eligibility import cloud_job_exclusion, onprem_job_exclusion
from berth.scheduler.forecast import forecast_queue
from berth.scheduler.onprem_step import try_onprem
from berth.scheduler.ordering import job_order_key, ordered, submit_order
from berth.scheduler.outcomes import JobOutcome, Rule, Step, step_from
from berth.scheduler.packing import pack
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.repatriation import consolidate, repatriate
from berth.scheduler.slots import SlotLedger
from berth.scheduler.snapshot import PendingJob, Snapshot

__all__ = ["SchedulingPass", "job_order_key", "schedule"]

_GPUS = attrgetter("gpus")
_NODES = attrgetter("nodes")


def schedule(
    snapshot: Snapshot, policy: SchedulingPolicy, now: float, *, forecast: bool = False
) -> Decisions:
    """One scheduling pass over ``snapshot`` at time ``now``. ``forecast``: also fill
    ``Decisions.queue`` (each waiting job's queue position and estimated start, ``forecast.py``)."""
    # A pass allocates a few objects per job (outcomes, assignments) and frees none before it
    # ends, so the cyclic collector would re-scan the whole, acyclic snapshot again and again
    # (40 % of a 400,000-job pass). It is paused for the pass and restored as it was.
    enabled = gc.isenabled()
    gc.disable()
    try:
        p = SchedulingPass(snapshot, policy, now)
        decisions = p.run()
        if forecast:
            decisions.queue = forecast_queue(p.ctx)
        return decisions
    finally:
        if enabled:
            gc.enable()


def _fmt_wait(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


class SchedulingPass:
    """One pass: the per-job decision over the ledger, and the fast path for on-prem-only FIFO."""

    def __init__(self, snapshot: Snapshot, policy: SchedulingPolicy, now: float) -> None:
        ctx = self.ctx = PassContext(snapshot, policy, now)
        ctx.cloud = cloud_step.CloudLedger(ctx)
        ctx.slots = SlotLedger.build(ctx)
        ctx.packs = policy.burst is not None and policy.burst.pack_instances
        ctx.waiting_gpus = {}
        self._onprem_only_fast = (
            policy.burst is None and policy.use_onprem and not policy.residency and ctx.preempt_budget == 0
        )
        self._fast: dict[int, JobOutcome] = {}
        self._never_bursts = Step(Site.CLOUD, Rule.BURST, f"policy {policy.name} never bursts to the cloud")

    @property
    def decisions(self) -> Decisions:
        return self.ctx.decisions

    def run(self) -> Decisions:
        ctx = self.ctx
        if ctx.policy.repatriation.before_queue:
            repatriate(ctx)
        if self._onprem_only_fast and ctx.policy.fair_share.ordering == "fifo":
            self._run_fifo_onprem()
        else:
            self._run_ordered()
        if ctx.packs:
            pack(ctx.slots, ctx)
            ctx.slots.fill_free_slots(ctx)
        repatriate(ctx)
        consolidate(ctx)
        ctx.decisions.shares = dict(sorted(ctx.fair.shares.items()))
        return ctx.decisions

    def _exhausted(self) -> bool:
        """Nothing left to give: no free GPU, no cloud, no preemption. The rest just waits."""
        ctx = self.ctx
        if ctx.cloud_possible or ctx.preempt_budget > 0:
            return False
        return not any(ctx.index.free_total.values())

    def _run_ordered(self) -> None:
        order = ordered(self.ctx)
        for job in order:
            self.decide(job)
            if self._exhausted():
                full = JobOutcome(
                    None, (Step(Site.ONPREM, Rule.CAPACITY, "every GPU in the fleet is in use"),)
                )
                self.ctx.outcomes.update(dict.fromkeys((j.job_id for j in order), full))
                break

    def _run_fifo_onprem(self) -> None:
        """Submit order, on-prem only, no preemption. Capacity only shrinks in this loop, so a job
        needing more GPUs per node than the largest free block of any host cannot be placed: such
        jobs are skipped at C speed (``compress``) and share one outcome naming the final block;
        the scan ends when no GPU is left. Placements are exactly those of a full scan."""
        ctx = self.ctx
        ordered_jobs, ids = submit_order(ctx.snapshot.pending)
        n = len(ordered_jobs)
        models = list(ctx.index.pools_by_model)
        block = max((ctx.index.largest_block(m) for m in models), default=0)
        outcomes = ctx.outcomes
        # A (tenant, shape) that failed keeps failing (capacity only shrinks).
        failed: dict[tuple[object, ...], JobOutcome] = {}
        i = 0
        while i < n and block > 0:
            # Lazily (the scan usually ends early, when the fleet is full): the indices from i
            # on whose per-node GPU need fits the largest free block.
            rest = islice(ordered_jobs, i, None), islice(ordered_jobs, i, None)
            per_node = map(floordiv, map(_GPUS, rest[0]), map(_NODES, rest[1]))
            candidates = compress(range(i, n), map(block.__ge__, per_node))
            i = n
            for k in candidates:
                job = ordered_jobs[k]
                key = (job.tenant, job.gpu_type, job.gpus, job.nodes, job.cpu, job.memory_gib, job.placement)
                known = None if job.avoid_hosts else failed.get(key)
                if known is not None:
                    outcomes[job.job_id] = known
                    continue
                if self.decide(job):
                    new_block = max((ctx.index.largest_block(m) for m in models), default=0)
                    if new_block < block:
                        block = new_block
                        i = k + 1
                        break
                elif not job.avoid_hosts:
                    failed[key] = outcomes[job.job_id]
        # Every job not decided above needed more GPUs per node than the largest free block when
        # it was passed over (and the block never grows in a pass).
        shared = JobOutcome(
            None,
            (
                Step(
                    Site.ONPREM,
                    Rule.CAPACITY,
                    f"waiting for capacity: the largest free block is {block} GPUs, "
                    "fewer than the job needs per node",
                ),
                self._never_bursts,
            ),
        )
        everyone = dict.fromkeys(ids, shared)
        everyone.update(outcomes)
        outcomes.clear()
        outcomes.update(everyone)

    def decide(self, job: PendingJob) -> bool:
        """Decide one job: place it or record why not. True when placed."""
        ctx = self.ctx
        if self._onprem_only_fast and not job.avoid_hosts and job.placement is not PlacementConstraint.CLOUD:
            # A queue that can only go on-prem: a shape already known not to fit fails alike.
            key = ShapeKey(
                ctx.accepted(job.gpu_type), job.gpus // job.nodes, job.nodes, job.cpu, job.memory_gib, None
            )
            known = ctx.no_fit.get(key)
            if known is not None:
                outcome = self._fast.get(id(known))
                if outcome is None:
                    outcome = self._fast[id(known)] = JobOutcome(None, (known, self._never_bursts))
                ctx.outcomes[job.job_id] = outcome
                return False
        tenant = ctx.tenant(job.tenant)
        residency = ctx.residency(job)
        steps: list[Step] = []
        if (
            cloud_step.cloud_first(ctx, job, residency)
            and cloud_step.try_cloud(ctx, job, tenant, residency) is None
        ):
            return self._placed(job, steps)
        ex = onprem_job_exclusion(job, ctx.policy)
        if ex is None:
            onprem = try_onprem(ctx, job, tenant, residency)
            if onprem is None:
                return self._placed(job, steps)
            steps.append(onprem)
        elif job.placement is not PlacementConstraint.CLOUD:
            steps.append(step_from(Site.ONPREM, ex))
        cex = cloud_job_exclusion(job, ctx.policy, residency)
        if cex is None:
            eligible_at = cloud_step.may_burst_at(ctx, job, residency, ex is None)
            if ctx.now < eligible_at:
                wake = ctx.decisions.wake_at
                ctx.decisions.wake_at = eligible_at if wake is None else min(wake, eligible_at)
                steps.append(
                    Step(
                        Site.CLOUD,
                        Rule.BURST_WAIT,
                        "waits for on-prem before bursting (policy.burst); "
                        f"may burst in {_fmt_wait(eligible_at - ctx.now)}",
                        eligible_at,
                    )
                )
                if ctx.packs and job.nodes == 1:
                    ctx.slots.waiting.append(job)
            else:
                cloud = cloud_step.try_cloud(ctx, job, tenant, residency)
                if cloud is None:
                    return self._placed(job, steps)
                steps.append(cloud)
        elif job.placement is not PlacementConstraint.ONPREM:
            steps.append(step_from(Site.CLOUD, cex))
        ctx.outcomes[job.job_id] = JobOutcome(None, tuple(steps))
        if ex is None:
            ctx.waiting_gpus[job.gpu_type] = ctx.waiting_gpus.get(job.gpu_type, 0) + job.gpus
        return False

    def _placed(self, job: PendingJob, steps: list[Step]) -> bool:
        ctx = self.ctx
        assert ctx.last_placed is not None and ctx.last_placed.job_id == job.job_id
        ctx.outcomes[job.job_id] = JobOutcome(ctx.last_placed, tuple(steps))
        return True
