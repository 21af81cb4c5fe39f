"""The scheduling pass: ``schedule(snapshot, policy, now) -> Decisions``. Pure and deterministic.

Order of work (docs/scheduling.md has the full story):
1. Build the free-capacity index, circuit states, quotas in use and fair shares.
2. Serve pending jobs one at a time, always from the tenant with the lowest weighted dominant
   share (or in submit order for a FIFO policy); within a tenant by priority then submit time.
   Each job is tried on-prem (best fit, gang all-or-nothing, quota-bound), then by preemption
   when a rule allows it, then in the cloud once it may burst (cheapest priced offer, healthier
   first on a tie, open circuits skipped). A job left pending gets the reasons of each site.
3. Repatriate checkpointing cloud jobs onto capacity no pending job could use.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate, compress, islice
from operator import attrgetter, floordiv

from berth.domain.job_spec import PlacementConstraint, Priority
from berth.scheduler.circuit import CircuitBoard, CircuitState
from berth.scheduler.decisions import CloudAssignment, Decisions, OnPremAssignment, Preemption, Repatriation
from berth.scheduler.eligibility import (
    Exclusion,
    PricedOffer,
    budget_exclusion,
    burst_eligible_at,
    cloud_job_exclusion,
    onprem_job_exclusion,
    pool_exclusion,
    price_offer,
    wants_spot,
)
from berth.scheduler.fairshare import FairShare, resource_amounts
from berth.scheduler.placement_onprem import OnPremIndex
from berth.scheduler.policy import ResidencyRule, SchedulingPolicy
from berth.scheduler.preemption import find_victims
from berth.scheduler.snapshot import CloudOffer, PendingJob, RunningJob, Snapshot, TenantState


def schedule(snapshot: Snapshot, policy: SchedulingPolicy, now: float) -> Decisions:
    """One scheduling pass over ``snapshot`` at time ``now``."""
    return SchedulingPass(snapshot, policy, now).run()


RANK = {p: p.rank for p in Priority}
_GPUS = attrgetter("gpus")
_NODES = attrgetter("nodes")
_JOB_ID = attrgetter("job_id")
_SUBMITTED = attrgetter("submitted_at")


def job_order_key(job: PendingJob) -> tuple[int, float, str]:
    """Within a tenant: higher priority first, then earlier submission."""
    return (-RANK[job.priority], job.submitted_at, job.job_id)


def longest_first_key(job: PendingJob) -> tuple[int, float, float, str]:
    """Within a tenant: higher priority first, then longest expected run, then earlier submission."""
    return (-RANK[job.priority], -(job.expected_duration_s or 0.0), job.submitted_at, job.job_id)


def _submit_order(pending: tuple[PendingJob, ...]) -> tuple[list[PendingJob], list[str]]:
    """``pending`` by (submit time, job id), and their ids: two stable single-key sorts (no key
    tuples to build; each is linear on a queue already nearly in order, the usual case)."""
    ordered = sorted(pending, key=_JOB_ID)
    ordered.sort(key=_SUBMITTED)
    return ordered, list(map(_JOB_ID, ordered))


def _fmt_wait(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


class SchedulingPass:
    """State of one pass. Also used by ``explain`` to replay the pass for one job."""

    def __init__(self, snapshot: Snapshot, policy: SchedulingPolicy, now: float) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.index = OnPremIndex(snapshot.hosts)
        self.circuits = CircuitBoard(snapshot.circuits, now, policy.circuit)
        self.fair = FairShare(snapshot.tenants, snapshot.running, self.index.capacity, policy.fair_share, now)
        self.decisions = Decisions()
        self.onprem_used: dict[tuple[str, str], int] = {}
        # Cheap pre-checks for preemption: lowest priority each tenant runs on-prem, borrowed jobs.
        self._lowest_rank: dict[str, int] = {}
        self._any_borrowed = False
        for r in snapshot.running:
            if r.site == "onprem":
                key = (r.tenant, r.gpu_type)
                self.onprem_used[key] = self.onprem_used.get(key, 0) + r.gpus
                rank = RANK[r.priority]
                if rank < self._lowest_rank.get(r.tenant, 99):
                    self._lowest_rank[r.tenant] = rank
                if r.borrowed:
                    self._any_borrowed = True
        self._no_fit: dict[tuple[object, ...], str] = {}
        self._no_victims: set[tuple[object, ...]] = set()
        self._cloud_memo: dict[tuple[object, ...], tuple[list[tuple[PricedOffer, CircuitState]], str]] = {}
        self._residency_memo: dict[tuple[str, tuple[str, ...]], list[ResidencyRule]] = {}
        self._running_on_host: dict[str, list[RunningJob]] | None = None
        self._offers_by_model: dict[str, list[CloudOffer]] | None = None
        self._accepted: dict[str, tuple[str, ...]] = {}
        self.preempted: set[str] = set()
        self.preempt_budget = policy.preemption.max_per_pass
        self._committed_usd: dict[str, float] = {}
        self._offer_left: dict[int, int] = {
            i: o.available for i, o in enumerate(snapshot.offers) if o.available is not None
        }
        self._offer_pos = {id(o): i for i, o in enumerate(snapshot.offers)}
        self._probes: dict[tuple[str, str], int] = {}
        self._repatriated: set[str] = set()
        self._cloud_possible = policy.burst is not None and bool(snapshot.offers)
        self.outcome: dict[str, OnPremAssignment | CloudAssignment] = {}
        self._onprem_only_fast = (
            policy.burst is None and policy.use_onprem and not policy.residency and self.preempt_budget == 0
        )
        self._fast_reasons: dict[str, str] = {}
        # policy.burst.estimate_wait: the running on-prem jobs' expected ends per model (times,
        # cumulative GPUs freed) and the GPUs of jobs left waiting so far in this pass.
        self._ends: dict[str, tuple[list[float], list[int]]] | None = None
        self._ahead: dict[str, int] | None = (
            {} if policy.burst is not None and policy.burst.estimate_wait else None
        )

    # ------------------------------------------------------------------ ordering
    def _ordered(self) -> Iterator[PendingJob]:
        pending = self.snapshot.pending
        if self.policy.fair_share.ordering == "fifo":
            yield from sorted(pending, key=attrgetter("submitted_at", "job_id"))
            return
        queues: dict[str, list[PendingJob]] = {}
        for job in pending:
            queues.setdefault(job.tenant, []).append(job)
        key = job_order_key if self.policy.fair_share.within_tenant == "submit" else longest_first_key
        for q in queues.values():
            q.sort(key=key, reverse=True)  # pop() from the end
        heap = [(self.fair.key(t), t) for t in queues]
        heapq.heapify(heap)
        while heap:
            _, tenant = heapq.heappop(heap)
            q = queues[tenant]
            yield q.pop()
            if q:
                heapq.heappush(heap, (self.fair.key(tenant), tenant))

    def _exhausted(self) -> bool:
        """Nothing left to give: no free GPU, no cloud, no preemption. The rest just waits."""
        if self._cloud_possible or self.preempt_budget > 0:
            return False
        return not any(self.index.free_total.values())

    # ------------------------------------------------------------------ the pass
    def run(self) -> Decisions:
        if self.policy.repatriation.before_queue:
            self._repatriate()
        if self._onprem_only_fast and self.policy.fair_share.ordering == "fifo":
            self._run_fifo_onprem()
        else:
            self._run_ordered()
        self._repatriate()
        self.decisions.shares = dict(sorted(self.fair.shares.items()))
        return self.decisions

    def _run_fifo_onprem(self) -> None:
        """Submit order, on-prem only, no preemption. Capacity only shrinks in this loop, so a job
        needing more GPUs per node than the largest free block of any host cannot be placed: such
        jobs are skipped at C speed (``compress``) and share one reason naming the final block;
        the scan ends when no GPU is left. Placements are exactly those of a full scan."""
        ordered, ids = _submit_order(self.snapshot.pending)
        n = len(ordered)
        models = list(self.index.pools_by_model)
        block = max((self.index.largest_block(m) for m in models), default=0)
        before = len(self.decisions.placements)
        placed = before
        reasons = self.decisions.reasons
        # A (tenant, shape) that failed keeps failing (capacity only shrinks).
        failed: dict[tuple[object, ...], str] = {}
        i = 0
        while i < n and block > 0:
            # Lazily (the scan usually ends early, when the fleet is full): the indices from i
            # on whose per-node GPU need fits the largest free block.
            rest = islice(ordered, i, None), islice(ordered, i, None)
            per_node = map(floordiv, map(_GPUS, rest[0]), map(_NODES, rest[1]))
            candidates = compress(range(i, n), map(block.__ge__, per_node))
            i = n
            for k in candidates:
                job = ordered[k]
                key = (job.tenant, job.gpu_type, job.gpus, job.nodes, job.cpu, job.memory_gib, job.placement)
                known = None if job.avoid_hosts else failed.get(key)
                if known is not None:
                    reasons[job.job_id] = known
                    continue
                self.decide(job)
                if len(self.decisions.placements) != placed:
                    placed = len(self.decisions.placements)
                    new_block = max((self.index.largest_block(m) for m in models), default=0)
                    if new_block < block:
                        block = new_block
                        i = k + 1
                        break
                elif not job.avoid_hosts:
                    failed[key] = reasons[job.job_id]
        # Every job neither placed nor given its own reason needed more GPUs per node than the
        # largest free block when it was passed over (and the block never grows in a pass).
        shared = (
            f"on-prem: waiting for capacity: the largest free block is {block} GPUs, "
            f"fewer than the job needs per node; "
            f"cloud: policy {self.policy.name} never bursts to the cloud"
        )
        everyone = dict.fromkeys(ids, shared)
        everyone.update(reasons)
        for a in islice(self.decisions.placements, before, None):
            everyone.pop(a.job_id, None)
        self.decisions.reasons = everyone

    def _run_ordered(self) -> None:
        order = self._ordered()
        for job in order:
            self.decide(job)
            if self._exhausted():
                rest = [j.job_id for j in order]
                self.decisions.reasons.update(
                    dict.fromkeys(rest, "waiting for on-prem capacity: every GPU in the fleet is in use")
                )
                break

    def accepted(self, gpu_type: str) -> tuple[str, ...]:
        models = self._accepted.get(gpu_type)
        if models is None:
            models = self._accepted[gpu_type] = self.policy.accepted_gpus(gpu_type)
        return models

    def residency(self, job: PendingJob) -> list[ResidencyRule]:
        key = (job.tenant, job.datasets)
        rules = self._residency_memo.get(key)
        if rules is None:
            rules = self._residency_memo[key] = self.policy.residency_for(job.tenant, job.datasets)
        return rules

    def decide(self, job: PendingJob) -> bool:
        if self._onprem_only_fast and not job.avoid_hosts and job.placement is not PlacementConstraint.CLOUD:
            # Fast path for a queue that can only go on-prem: a shape already known not to fit.
            known = self._no_fit.get(
                (self.accepted(job.gpu_type), job.gpus // job.nodes, job.nodes, job.cpu, job.memory_gib, None)
            )
            if known is not None:
                self.decisions.reasons[job.job_id] = self._fast_reasons.get(known) or self._fast_reason(known)
                return False
        tenant = self.snapshot.tenant(job.tenant)
        residency = self.residency(job)
        why: list[str] = []
        if self._cloud_first(job, residency) and self._try_cloud(job, tenant, residency) is None:
            return True
        ex = onprem_job_exclusion(job, self.policy)
        if ex is None:
            onprem_why = self._try_onprem(job, tenant, residency)
            if onprem_why is None:
                return True
            why.append("on-prem: " + onprem_why)
        elif job.placement is not PlacementConstraint.CLOUD:
            why.append("on-prem: " + ex.message)
        cex = cloud_job_exclusion(job, self.policy, residency)
        if cex is None:
            eligible_at = burst_eligible_at(job, self.policy, self._cheapest_per_gpu_hour(job, residency))
            if self.now < eligible_at and self._onprem_out_of_reach(job, eligible_at):
                eligible_at = self.now
            if self.now < eligible_at:
                wake = self.decisions.wake_at
                self.decisions.wake_at = eligible_at if wake is None else min(wake, eligible_at)
                why.append(
                    f"cloud: waits for on-prem before bursting (policy.burst); may burst in "
                    f"{_fmt_wait(eligible_at - self.now)}"
                )
            else:
                cloud_why = self._try_cloud(job, tenant, residency)
                if cloud_why is None:
                    return True
                why.append("cloud: " + cloud_why)
        elif job.placement is not PlacementConstraint.ONPREM:
            why.append("cloud: " + cex.message)
        self.decisions.reasons[job.job_id] = "; ".join(why)
        if ex is None and self._ahead is not None:
            self._ahead[job.gpu_type] = self._ahead.get(job.gpu_type, 0) + job.gpus
        return False

    def _onprem_out_of_reach(self, job: PendingJob, eligible_at: float) -> bool:
        """policy.burst.estimate_wait: on-prem is not expected to take the job before it may burst
        anyway (and it has waited ``min_wait_s``), so waiting longer only adds to its JCT."""
        burst = self.policy.burst
        if burst is None or not burst.estimate_wait or job.placement is not PlacementConstraint.AUTO:
            return False
        if self.now < job.submitted_at + burst.min_wait_s:
            return False
        if self._ends is None:
            by_model: dict[str, list[tuple[float, int]]] = {}
            for r in self.snapshot.running:
                if r.site == "onprem" and r.expected_end_at is not None:
                    by_model.setdefault(r.gpu_type, []).append((r.expected_end_at, r.gpus))
            self._ends = {}
            for model, ends in by_model.items():
                ends.sort()
                self._ends[model] = ([t for t, _ in ends], list(accumulate(g for _, g in ends)))
        assert self._ahead is not None
        model = job.gpu_type
        need = self._ahead.get(model, 0) + job.gpus - self.index.free_total.get(model, 0)
        times, freed = self._ends.get(model, ([], []))
        i = bisect_left(freed, max(1, need))
        return i >= len(times) or times[i] >= eligible_at

    # ------------------------------------------------------------------ on-prem
    def _fast_reason(self, why: str) -> str:
        reason = f"on-prem: {why}; cloud: policy {self.policy.name} never bursts to the cloud"
        self._fast_reasons[why] = reason
        return reason

    def quota_models(self, job: PendingJob, tenant: TenantState) -> tuple[tuple[str, ...], str | None]:
        ok: list[str] = []
        why: str | None = None
        for model in self.accepted(job.gpu_type):
            limit = tenant.onprem_limit(model)
            used = self.onprem_used.get((job.tenant, model), 0)
            if limit is not None and used + job.gpus > limit:
                why = why or (
                    f"quota: tenant {job.tenant} uses {used} of its {limit} {model} GPUs "
                    f"(guarantee plus borrowing limit); the job needs {job.gpus}"
                )
                continue
            ok.append(model)
        return tuple(ok), why

    def allowed_pools(self, residency: list[ResidencyRule]) -> frozenset[str] | None:
        allowed: frozenset[str] | None = None
        for rule in residency:
            if rule.pools:
                allowed = frozenset(rule.pools) if allowed is None else allowed & frozenset(rule.pools)
        return allowed

    def _try_onprem(self, job: PendingJob, tenant: TenantState, residency: list[ResidencyRule]) -> str | None:
        models, quota_why = self.quota_models(job, tenant)
        if not models:
            return quota_why or "no GPU model allowed"
        pools = self.allowed_pools(residency)
        if pools is not None and not any(p in pools for m in models for p in self.index.pools(m)):
            ex = pool_exclusion("", residency)
            return ex.message if ex else "no allowed pool"
        gpn = job.gpus_per_node
        key = (models, gpn, job.nodes, job.cpu, job.memory_gib, pools)
        fit = None
        if job.avoid_hosts or key not in self._no_fit:
            fit = self.index.find(models, gpn, job.nodes, job.cpu, job.memory_gib, pools, job.avoid_hosts)
        if fit is None:
            if not job.avoid_hosts and key not in self._no_fit:
                self._no_fit[key] = self._shortage(models, gpn, job.nodes, pools)
            fit = self._preempt_for(job, tenant, models, pools)
            if fit is None:
                return self._no_fit.get(key) or self._shortage(models, gpn, job.nodes, pools)
        pool, model, host_ids = fit
        self._assign_onprem(job, pool, model, host_ids)
        return None

    def _shortage(self, models: tuple[str, ...], gpn: int, nodes: int, pools: frozenset[str] | None) -> str:
        parts = []
        for m in models:
            cap = self.index.capacity.get("gpu:" + m, 0)
            if not cap:
                parts.append(f"no healthy {m} hosts")
                continue
            block = max(
                (self.index.largest_block(m, p) for p in self.index.pools(m) if pools is None or p in pools),
                default=0,
            )
            shape = (
                f"{nodes} hosts with {gpn} free {m} GPUs" if nodes > 1 else f"a host with {gpn} free {m} GPUs"
            )
            parts.append(
                f"no {shape} ({self.index.free_total.get(m, 0)} of {cap:.0f} free, "
                f"largest free block {block})"
            )
        return "; ".join(parts)

    def _assign_onprem(self, job: PendingJob, pool: str, model: str, host_ids: tuple[str, ...]) -> None:
        gpn = job.gpus_per_node
        self.index.allocate(host_ids, gpn, job.cpu, job.memory_gib)
        tenant = self.snapshot.tenant(job.tenant)
        key = (job.tenant, model)
        used = self.onprem_used.get(key, 0) + job.gpus
        self.onprem_used[key] = used
        borrowed = used > tenant.guaranteed_gpus.get(model, 0)
        a = OnPremAssignment(
            job_id=job.job_id,
            tenant=job.tenant,
            pool=pool,
            gpu_type=model,
            hosts=tuple((h, gpn) for h in host_ids),
            cpu=job.cpu,
            memory_gib=job.memory_gib,
            borrowed=borrowed,
        )
        self.decisions.placements.append(a)
        self.outcome[job.job_id] = a
        self.fair.add(
            job.tenant, resource_amounts(model, job.gpus, job.cpu * job.nodes, job.memory_gib * job.nodes)
        )

    # ------------------------------------------------------------------ preemption
    def _victim_index(self) -> dict[str, list[RunningJob]]:
        if self._running_on_host is None:
            self._running_on_host = {}
            for r in self.snapshot.running:
                if r.site == "onprem":
                    for hid, _ in r.hosts:
                        self._running_on_host.setdefault(hid, []).append(r)
        return self._running_on_host

    def _preempt_for(
        self, job: PendingJob, tenant: TenantState, models: tuple[str, ...], pools: frozenset[str] | None
    ) -> tuple[str, str, tuple[str, ...]] | None:
        rule = self.policy.preemption
        if self.preempt_budget <= 0 or not self.policy.use_onprem:
            return None
        now = self.now
        kinds: list[tuple[str, tuple[str, ...]]] = []
        job_rank = RANK[job.priority]
        if rule.reclaim and self._any_borrowed:
            own = tuple(
                m
                for m in models
                if self.onprem_used.get((job.tenant, m), 0) + job.gpus <= tenant.guaranteed_gpus.get(m, 0)
            )
            if own:
                kinds.append(("reclaim", own))
        if rule.priority and self._lowest_rank.get(job.tenant, 99) < job_rank:
            kinds.append(("priority", models))
        for kind, kind_models in kinds:
            memo = (
                kind,
                job.tenant if kind == "priority" else "",
                job.priority.rank,
                kind_models,
                job.gpus_per_node,
                job.nodes,
                job.cpu,
                job.memory_gib,
                pools,
            )
            if memo in self._no_victims:
                continue

            def eligible(v: RunningJob, kind: str = kind) -> bool:
                if v.job_id in self.preempted or now - v.started_at < rule.min_runtime_s:
                    return False
                if kind == "reclaim":
                    owner = self.snapshot.tenant(v.tenant)
                    return (
                        v.borrowed
                        and v.tenant != job.tenant
                        and self.onprem_used.get((v.tenant, v.gpu_type), 0)
                        > owner.guaranteed_gpus.get(v.gpu_type, 0)
                    )
                return v.tenant == job.tenant and RANK[v.priority] < job_rank

            victims = find_victims(
                self.index,
                self._victim_index(),
                eligible,
                kind_models,
                job.gpus_per_node,
                job.nodes,
                job.cpu,
                job.memory_gib,
                pools,
                self.preempt_budget,
                now,
            )
            if victims is None:
                self._no_victims.add(memo)
                continue
            for v in victims:
                self._stop(v)
                self.decisions.preemptions.append(
                    Preemption(
                        job_id=v.job_id,
                        tenant=v.tenant,
                        for_job=job.job_id,
                        rule=f"policy.preemption.{kind}",
                        lost_progress_s=v.lost_progress_s(now),
                    )
                )
            self.preempt_budget -= len(victims)
            self._no_fit.clear()
            fit = self.index.find(
                kind_models, job.gpus_per_node, job.nodes, job.cpu, job.memory_gib, pools, job.avoid_hosts
            )
            if fit is not None:
                return fit
        return None

    def _stop(self, v: RunningJob) -> None:
        """Release a running job's on-prem capacity within this pass."""
        self.preempted.add(v.job_id)
        nodes = max(1, len(v.hosts))
        self.index.release(v.hosts, v.cpu, v.memory_gib)
        key = (v.tenant, v.gpu_type)
        self.onprem_used[key] = self.onprem_used.get(key, 0) - v.gpus
        self.fair.remove(v.tenant, resource_amounts(v.gpu_type, v.gpus, v.cpu * nodes, v.memory_gib * nodes))

    # ------------------------------------------------------------------ cloud
    def cloud_candidates(
        self, job: PendingJob, residency: list[ResidencyRule]
    ) -> tuple[list[tuple[PricedOffer, CircuitState]], str]:
        """Eligible priced offers, cheapest first then healthiest; and why the others are out."""
        models = self.accepted(job.gpu_type)
        key = (
            models,
            job.gpus,
            job.nodes,
            job.cpu,
            job.memory_gib,
            job.regions,
            job.spot,
            job.max_hourly_usd,
            job.max_cost_usd,
            job.cost_horizon_s if job.max_cost_usd else None,
            tuple(id(r) for r in residency),
            job.avoid_regions,
            wants_spot(job, self.policy),
        )
        hit = self._cloud_memo.get(key)
        if hit is not None:
            return hit
        ok: list[tuple[PricedOffer, CircuitState]] = []
        excluded: dict[str, int] = {}
        first: dict[str, str] = {}
        if self._offers_by_model is None:
            self._offers_by_model = {}
            for offer in self.snapshot.offers:
                self._offers_by_model.setdefault(offer.gpu_type, []).append(offer)
        matching = [o for m in models for o in self._offers_by_model.get(m, ())]
        if len(matching) < len(self.snapshot.offers):
            excluded["gpu_type"] = len(self.snapshot.offers) - len(matching)
            first["gpu_type"] = f"they offer other GPU models than {' or '.join(models)}"
        for offer in matching:
            priced = price_offer(job, offer, self.policy, residency)
            if isinstance(priced, Exclusion):
                excluded[priced.rule] = excluded.get(priced.rule, 0) + 1
                first.setdefault(priced.rule, priced.message)
                continue
            state = self.circuits.state(offer.region, offer.instance_type)
            if state is CircuitState.OPEN:
                excluded["circuit"] = excluded.get("circuit", 0) + 1
                first.setdefault("circuit", f"circuit open for {offer.instance_type} in {offer.region}")
                continue
            ok.append((priced, state))
        ok.sort(
            key=lambda p: (
                p[0].hourly_usd,
                p[1] is CircuitState.HALF_OPEN,
                p[0].offer.region,
                p[0].offer.instance_type,
                p[0].offer.zone,
            )
        )
        if excluded:
            summary = "; ".join(
                f"{n} offer{'s' if n > 1 else ''} excluded by {rule} (e.g. {first[rule]})"
                for rule, n in sorted(excluded.items(), key=lambda kv: -kv[1])
            )
        else:
            summary = "no cloud offers in the snapshot"
        result = (ok, summary)
        self._cloud_memo[key] = result
        return result

    def _cloud_first(self, job: PendingJob, residency: list[ResidencyRule]) -> bool:
        """A cheap-in-the-cloud job skips a contended on-prem fleet (policy.burst.cloud_first_*)."""
        burst = self.policy.burst
        if (
            burst is None
            or burst.cloud_first_below_usd_per_gpu_hour is None
            or job.placement is not PlacementConstraint.AUTO
        ):
            return False
        cap = self.index.capacity.get("gpu:" + job.gpu_type, 0.0)
        if cap and self.index.free_total.get(job.gpu_type, 0) >= burst.contended_below * cap:
            return False
        if cloud_job_exclusion(job, self.policy, residency) is not None:
            return False
        candidates, _ = self.cloud_candidates(job, residency)
        if not candidates:
            return False
        return candidates[0][0].hourly_usd / job.gpus <= burst.cloud_first_below_usd_per_gpu_hour

    def _cheapest_per_gpu_hour(self, job: PendingJob, residency: list[ResidencyRule]) -> float | None:
        burst = self.policy.burst
        if burst is None or burst.reference_usd_per_gpu_hour is None:
            return None
        candidates, _ = self.cloud_candidates(job, residency)
        if not candidates:
            return None
        return candidates[0][0].hourly_usd / job.gpus

    def _try_cloud(self, job: PendingJob, tenant: TenantState, residency: list[ResidencyRule]) -> str | None:
        candidates, summary = self.cloud_candidates(job, residency)
        if not candidates:
            return "no eligible offer: " + summary
        why = ""
        for priced, state in candidates:
            offer = priced.offer
            pos = self._offer_pos[id(offer)]
            left = self._offer_left.get(pos)
            if left is not None and left < priced.instances:
                why = why or f"{offer.instance_type} in {offer.zone} has no capacity left"
                continue
            ckey = (offer.region, offer.instance_type)
            if (
                state is CircuitState.HALF_OPEN
                and self._probes.get(ckey, 0) >= self.policy.circuit.half_open_probes
            ):
                why = (
                    why
                    or f"circuit half-open for {offer.instance_type} in {offer.region}, probe already sent"
                )
                continue
            committed = self._committed_usd.get(job.tenant, 0.0)
            bex = budget_exclusion(job, tenant, priced.hourly_usd, committed)
            if bex is not None:
                return bex.message  # every later offer costs at least as much
            if left is not None:
                self._offer_left[pos] = left - priced.instances
            if state is CircuitState.HALF_OPEN:
                self._probes[ckey] = self._probes.get(ckey, 0) + 1
            self._committed_usd[job.tenant] = committed + priced.hourly_usd * job.cost_horizon_s / 3600.0
            a = CloudAssignment(
                job_id=job.job_id,
                tenant=job.tenant,
                region=offer.region,
                zone=offer.zone,
                queue=offer.queue_name(priced.spot),
                instance_type=offer.instance_type,
                instances=priced.instances,
                gpu_type=offer.gpu_type,
                spot=priced.spot,
                hourly_usd=priced.hourly_usd,
            )
            self.decisions.placements.append(a)
            self.outcome[job.job_id] = a
            self.fair.add(job.tenant, {"gpu:" + offer.gpu_type: float(job.gpus)})
            return None
        return why or "no eligible offer"

    # ------------------------------------------------------------------ repatriation
    def _repatriate(self) -> None:
        rule = self.policy.repatriation
        if not rule.enabled or not self.policy.use_onprem or not any(self.index.free_total.values()):
            return
        now = self.now
        scored: list[tuple[float, str, RunningJob, float]] = []
        for r in self.snapshot.running:
            if (
                r.site != "cloud"
                or not r.checkpointing
                or r.expected_end_at is None
                or r.placement is PlacementConstraint.CLOUD
                or r.job_id in self.preempted
                or r.job_id in self._repatriated
            ):
                continue
            lost = r.lost_progress_s(now)
            remaining = r.expected_end_at - now
            if lost > rule.max_lost_progress_s:
                continue
            saving = r.hourly_usd * (remaining - lost - rule.restart_overhead_s) / 3600.0
            if saving >= rule.min_saving_usd:
                scored.append((-saving, r.job_id, r, lost))
        scored.sort(key=lambda s: (s[0], s[1]))
        moved = len(self._repatriated)
        for neg_saving, _, r, lost in scored:
            if moved >= rule.max_per_pass or not any(self.index.free_total.values()):
                break
            job = PendingJob(
                job_id=r.job_id,
                tenant=r.tenant,
                gpu_type=r.gpu_type,
                gpus=r.gpus,
                submitted_at=r.started_at,
                nodes=max(1, r.nodes),
                cpu=r.cpu,
                memory_gib=r.memory_gib,
                priority=r.priority,
                datasets=r.datasets,
            )
            if job.gpus % job.nodes:
                continue
            tenant = self.snapshot.tenant(r.tenant)
            models, _ = self.quota_models(job, tenant)
            if not models:
                continue
            pools = self.allowed_pools(self.residency(job))
            fit = self.index.find(models, job.gpus_per_node, job.nodes, job.cpu, job.memory_gib, pools)
            if fit is None:
                continue
            pool, model, host_ids = fit
            before = len(self.decisions.placements)
            self._assign_onprem(job, pool, model, host_ids)
            a = self.decisions.placements.pop(before)
            assert isinstance(a, OnPremAssignment)
            self.fair.remove(r.tenant, {"gpu:" + r.gpu_type: float(r.gpus)})
            self.decisions.repatriations.append(
                Repatriation(
                    job_id=r.job_id,
                    tenant=r.tenant,
                    from_region=r.region or "",
                    to=a,
                    saving_usd=-neg_saving,
                    lost_progress_s=lost,
                )
            )
            self._repatriated.add(r.job_id)
            moved += 1
