"""The discrete-event replay: trace arrivals, completions, spot interruptions and burst timers
drive passes of the real ``schedule()``; the simulator only applies its decisions and advances
time. Everything placed (on-prem hosts, a slot of a shared cloud instance, a new instance,
packing) is the core's decision.

Model (docs/scheduling.md, "Simulator"):
- On-prem jobs start at once; cloud jobs run once their instance is up (``startup_delay_s``
  after launch, billed from launch).
- What the scheduler knows of run times is the estimate mode (``estimates.py``): by default
  the service's view (user estimates only from a stated noise model, a predictor learning from
  finished jobs); ``oracle`` hands it the truth, as a labelled upper bound.
- Checkpointing jobs save progress every ``checkpoint_interval_s`` of work; a stop (preemption,
  spot interruption, repatriation) loses the work since the last checkpoint and requeues it.
- Spot interruptions are Poisson per instance with a seeded, per-job random stream, so every
  policy faces the same luck for the same job; each one also counts as a capacity error for the
  circuit of that (region, instance type).
- Passes run on events, batched at most once per ``pass_interval_s``.
- Cloud instances are shared hosts (``cloud_fleet.py``): billing and idle slots there.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

from berth.domain.placement import Site
from berth.scheduler.core import schedule
from berth.scheduler.decisions import CloudAssignment, Decisions, OnPremAssignment
from berth.scheduler.outcomes import Rule
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.snapshot import PendingJob, RunningJob, Snapshot
from berth_tools.sim.accounting import TenantLedger
from berth_tools.sim.cloud_fleet import CloudFleet, circuit_records, interruption_at
from berth_tools.sim.cluster import ClusterSpec
from berth_tools.sim.data import DataModel
from berth_tools.sim.estimates import EstimateMode, ServiceKnowledge, UserEstimates
from berth_tools.sim.fleet import OnPremFleet
from berth_tools.sim.records import SimJob, SimState
from berth_tools.sim.trace import TraceJob, split_nodes

FINISH, INTERRUPT, ARRIVE, PASS = 0, 1, 2, 3


class Simulator:
    def __init__(
        self,
        trace: list[TraceJob],
        cluster: ClusterSpec,
        policy: SchedulingPolicy,
        estimates: EstimateMode = EstimateMode.PREDICTOR,
        estimate_noise: float | None = None,
        data: DataModel | None = None,
    ) -> None:
        self.cluster = cluster
        self.data = data
        self.policy = policy
        self.trace = trace
        self.mode = estimates
        self.knows = ServiceKnowledge(estimates, cluster.jobs.timeout_s, cluster.jobs.checkpoint_interval_s)
        user = UserEstimates(estimate_noise, cluster.cloud.spot.seed)
        self.offers = cluster.offers()
        self.ckpt = cluster.jobs.checkpoint_interval_s
        self.fleet = OnPremFleet(cluster)
        max_host = self.fleet.max_gpus_per_host if self.fleet.specs else 8
        jobs: dict[str, SimJob] = {}
        for t in trace:
            nodes = split_nodes(t.gpus, max_host)
            gpn = t.gpus // nodes
            jobs[t.job_id] = SimJob(
                t,
                nodes,
                cluster.jobs.cpu_per_gpu * gpn,
                cluster.jobs.memory_gib_per_gpu * gpn,
                estimate_s=t.estimate_s if t.estimate_s is not None else user.estimate(t),
            )
        self.state = SimState(jobs=jobs, onprem_gpus=cluster.onprem_gpus)
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.ledger = TenantLedger(cluster, sorted({t.tenant for t in trace}), policy.fair_share)
        self._pass_at: float | None = None
        self._last_pass: float | None = None
        self._wake_at: float | None = None
        self._interrupt_at: dict[str, tuple[str, str]] = {}
        self._repatriates = policy.repatriation.enabled and policy.use_onprem
        self._cloud_jobs = 0
        self._onprem_freed = False
        self._static_onprem_only = policy.burst is None and policy.preemption.max_per_pass == 0
        self._arrived_min_gpn = 0
        self.cloud = CloudFleet(
            {(o.region, o.zone, o.instance_type): o for o in self.offers}, cluster.cloud.startup_delay_s
        )

    # ------------------------------------------------------------------ events
    def _push(self, at: float, kind: int, job_id: str = "", epoch: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, self._seq, job_id, epoch))

    def run(self) -> SimState:
        for t in self.trace:
            self._push(t.submit_s, ARRIVE, t.job_id)
        interval = self.cluster.pass_interval_s
        while self.events:
            now = self.events[0][0]
            dirty = False
            while self.events and self.events[0][0] == now:
                _, kind, _, job_id, epoch = heapq.heappop(self.events)
                if kind == ARRIVE:
                    self._arrive(job_id, now)
                    dirty = True
                elif kind == FINISH:
                    job = self.state.jobs[job_id]
                    if job.epoch == epoch:
                        self._stop(job, now, finished=True)
                        self._learn(job)
                        dirty = True
                elif kind == INTERRUPT:
                    job = self.state.jobs[job_id]
                    if job.epoch == epoch:
                        self._interrupt(job, now)
                        dirty = True
                else:  # PASS (timer or burst wake-up)
                    if self._pass_at == now:
                        self._pass_at = None
                    if self._wake_at == now:
                        self._wake_at = None
                    dirty = True
            if not dirty or not (
                self.pending or (self._onprem_freed and self._repatriates and self._cloud_running())
            ):
                continue
            if (
                self._static_onprem_only
                and not self._onprem_freed
                and self._arrived_min_gpn > self.fleet.largest_free_block()
            ):
                # Only arrivals since the last pass, none of which fits any host's free GPUs, and
                # this policy can neither burst nor preempt: the pass could place nothing (the
                # queue did not fit this capacity last time). Exact, just skipped.
                continue
            if interval > 0 and self._last_pass is not None and now < self._last_pass + interval:
                due = self._last_pass + interval
                if self._pass_at is None or self._pass_at > due:
                    self._pass_at = due
                    self._push(due, PASS)
                continue
            self._pass(now)
        self.state.instances_launched = self.cloud.launched
        self.state.idle_instance_usd = self.cloud.idle_usd
        self.state.max_instance_gpus_used = self.cloud.max_gpus_used
        return self.state

    def _learn(self, job: SimJob) -> None:
        """A job finished: the service learns its run time (and how its estimate compared)."""
        self.knows.learn(job, self.state)

    def _cloud_running(self) -> bool:
        return self._cloud_jobs > 0

    # ------------------------------------------------------------------ transitions
    def _arrive(self, job_id: str, now: float) -> None:
        job = self.state.jobs[job_id]
        if job.trace.duration_s <= 0:
            job.first_start_s = job.end_s = now
            return
        self.pending[job_id] = self._pending_job(job)
        self.knows.predict_at_submit(job)
        self._arrived_min_gpn = min(self._arrived_min_gpn, job.trace.gpus // job.nodes)

    def _alloc_delta(self, job: SimJob, sign: float) -> None:
        onprem = job.site is Site.ONPREM
        t = job.trace
        cpu = job.cpu * job.nodes if onprem else 0.0
        mem = job.memory_gib * job.nodes if onprem else 0.0
        self.ledger.allocate(t.tenant, t.gpu_type, t.gpus, cpu, mem, sign)

    def _begin(self, job: SimJob, start: float, **placement: Any) -> float:
        """Record a started attempt (on either site): the running job, its usage and its finish,
        whose time it returns."""
        job.attempts += 1
        if job.first_start_s is None:
            job.first_start_s = start
        end = start + job.remaining_s
        t = job.trace
        self.running[t.job_id] = RunningJob(
            job_id=t.job_id,
            tenant=t.tenant,
            gpus=t.gpus,
            started_at=start,
            nodes=job.nodes,
            instance_id=job.instance,
            **self.knows.running_fields(job, end),
            **placement,
        )
        self._alloc_delta(job, 1.0)
        self._push(end, FINISH, job.trace.job_id, job.epoch)
        return end

    def _start_onprem(self, job: SimJob, a: OnPremAssignment, now: float) -> None:
        self._stage_onprem(job, a)
        self.fleet.take(a.hosts, a.cpu, a.memory_gib, job.trace.job_id)
        job.site, job.hosts, job.placed_at, job.work_start, job.hourly_usd = (
            Site.ONPREM,
            a.hosts,
            now,
            now,
            0.0,
        )
        self._begin(
            job,
            now,
            gpu_type=a.gpu_type,
            site=Site.ONPREM,
            hosts=a.hosts,
            cpu=a.cpu,
            memory_gib=a.memory_gib,
            borrowed=a.borrowed,
        )

    # ------------------------------------------------------------------ cloud
    def _place_cloud(self, job: SimJob, a: CloudAssignment, now: float) -> None:
        """A shared-instance slot (joined or launched as the core decided), or the gang's own
        instances."""
        if a.instance_id is None:
            self._start_cloud(job, a, now, now + self.cluster.cloud.startup_delay_s)
            return
        inst = self.cloud.join(a, job.trace.job_id, job.trace.gpus, job.cpu, job.memory_gib, now)
        job.instance = inst.instance_id
        self._start_cloud(job, a, now, max(now, inst.ready_at))

    def _start_cloud(self, job: SimJob, a: CloudAssignment, now: float, start: float) -> None:
        job.site, job.hosts, job.placed_at, job.work_start, job.hourly_usd = (
            Site.CLOUD,
            (),
            now,
            start,
            a.hourly_usd,
        )
        end = self._begin(
            job,
            start,
            gpu_type=a.gpu_type,
            site=Site.CLOUD,
            cpu=job.cpu,
            memory_gib=job.memory_gib,
            region=a.region,
            instance_type=a.instance_type,
            spot=a.spot,
            hourly_usd=a.hourly_usd,
        )
        self._cloud_jobs += 1
        if self.data is not None:
            self.data.stage_cloud(job.trace.job_id, job.nodes)
        if a.spot:
            t_int = interruption_at(
                self.cluster.cloud.spot, job.trace.job_id, job.interruptions, start, a.instances
            )
            if t_int < end:
                self._push(t_int, INTERRUPT, job.trace.job_id, job.epoch)
                key = (a.region, a.instance_type)
                # Remember where interruptions happen for the circuit breaker (recorded when they occur).
                self._interrupt_at[job.trace.job_id] = key

    def _stop(self, job: SimJob, now: float, finished: bool = False) -> None:
        elapsed = max(0.0, now - job.placed_at)
        if job.site is Site.ONPREM:
            job.onprem_gpu_s += job.trace.gpus * elapsed
            self._onprem_freed = True
            self.fleet.give_back(job.hosts, job.cpu, job.memory_gib)
        else:
            self._cloud_jobs -= 1
            job.cloud_gpu_s += job.trace.gpus * elapsed
            cost = job.hourly_usd * elapsed / 3600.0
            self._charge(job, cost, now)
            if job.instance is not None:
                extra = self.cloud.leave(
                    job.instance, job.trace.job_id, job.trace.gpus, job.cpu, job.memory_gib, cost, now
                )
                job.instance = None
                for jid, usd in extra.items():
                    self._charge(self.state.jobs[jid], usd, now)
        done = max(0.0, now - job.work_start)
        if finished:
            job.progress_s = job.trace.duration_s
            job.end_s = now
            self.state.span_end_s = max(self.state.span_end_s, now)
        elif self.ckpt is not None:
            job.progress_s = min(job.trace.duration_s, job.progress_s + (done // self.ckpt) * self.ckpt)
        self._alloc_delta(job, -1.0)
        job.epoch += 1
        job.site = None
        job.hosts = ()
        self.running.pop(job.trace.job_id, None)

    def _charge(self, job: SimJob, usd: float, now: float) -> None:
        job.cost_usd += usd
        self.ledger.charge(job.trace.tenant, usd, now)

    def _requeue(self, job: SimJob) -> None:
        self.pending[job.trace.job_id] = self._pending_job(job)

    def _pending_job(self, job: SimJob) -> PendingJob:
        pj = self.knows.pending_job(job)
        return pj if self.data is None else replace(pj, datasets=self.data.datasets(job.trace.job_id))

    def _stage_onprem(self, job: SimJob, a: OnPremAssignment) -> None:
        """Before the fleet is taken: was a host caching its data free for one node? Then stage."""
        if self.data is None:
            return
        src = self.data.source[job.trace.job_id]
        gpn = job.trace.gpus // job.nodes
        holder_free = any(
            src in cached and self.fleet.has_room(hid, gpn, job.cpu, job.memory_gib)
            for hid, cached in self.fleet.cached.items()
        )
        hosts = [hid for hid, _ in a.hosts]
        self.data.stage_onprem(job.trace.job_id, hosts, holder_free)
        for hid in hosts:
            self.fleet.set_cached(hid, self.data.cached(hid))

    def _interrupt(self, job: SimJob, now: float) -> None:
        key = self._interrupt_at.pop(job.trace.job_id, None)
        if key is not None:
            self.state.circuit_failures.setdefault(key, []).append(now)
        self._stop(job, now)
        job.interruptions += 1
        self.state.interruptions += 1
        self._requeue(job)

    # ------------------------------------------------------------------ the pass
    def snapshot(self, now: float) -> Snapshot:
        return Snapshot(
            pending=tuple(self.pending.values()),
            running=tuple(self.running.values()),
            hosts=self.fleet.hosts(),
            offers=self.offers,
            tenants=self.ledger.tenants(now),
            circuits=circuit_records(self.state.circuit_failures, self.policy.circuit, now),
            instances=self.cloud.snapshot(),
            runtimes=self.knows.predictor,
        )

    def _pass(self, now: float) -> None:
        self._last_pass = now
        self._onprem_freed = False
        self._arrived_min_gpn = 1 << 30
        self.state.passes += 1
        decisions = schedule(self.snapshot(now), self.policy, now)
        self._apply(decisions, now)
        if decisions.wake_at is not None and decisions.wake_at > now:
            wake = decisions.wake_at
            if self._wake_at is None or wake < self._wake_at or self._wake_at <= now:
                self._wake_at = wake
                self._push(wake, PASS)

    def _apply(self, d: Decisions, now: float) -> None:
        jobs = self.state.jobs
        for p in d.preemptions:
            job = jobs[p.job_id]
            self._stop(job, now)
            job.preemptions += 1
            self.state.preemptions += 1
            self._requeue(job)
        for a in d.placements:
            job = jobs[a.job_id]
            del self.pending[a.job_id]
            if isinstance(a, OnPremAssignment):
                self._start_onprem(job, a, now)
            else:
                self._place_cloud(job, a, now)
        for o in d.outcomes.values():
            if o.placed is not None and Rule.FREE_SLOT in o.rules:
                self.state.free_rides += 1
        for r in d.repatriations:
            job = jobs[r.job_id]
            self._interrupt_at.pop(r.job_id, None)
            self._stop(job, now)
            job.repatriations += 1
            self.state.repatriations += 1
            self._start_onprem(job, r.to, now)
