"""The discrete-event replay: trace arrivals, completions, spot interruptions and burst timers
drive passes of the real ``schedule()``; decisions are applied to a simulated fleet and cloud.

Model (docs/scheduling.md, "Simulator"):
- On-prem jobs start at once; cloud jobs run after ``startup_delay_s`` (billed from placement).
- A job's estimate of its run time is the trace's duration (the "user-supplied estimate").
- Checkpointing jobs save progress every ``checkpoint_interval_s`` of work; a stop (preemption,
  spot interruption, repatriation) loses the work since the last checkpoint and requeues it.
- Spot interruptions are Poisson per instance with a seeded, per-job random stream, so every
  policy faces the same luck for the same job; each one also counts as a capacity error for the
  circuit of that (region, instance type).
- Passes run on events, batched at most once per ``pass_interval_s``.
- Cloud instances are shared hosts (AWS Batch places several containers on one instance): a
  single-node job goes into free GPU slots (and vCPUs, memory) of a running instance of its GPU
  model, spot mode and region when one has room (best fit), else a new instance is launched; an
  instance is paid from launch until its last job leaves. Each job is charged its GPU share of
  the instance while on it, and an instance's idle slots are charged, when it closes, to the
  jobs that used it (pro rata). Every policy fills free slots first; a new instance is the
  scheduler's choice (the cheapest offer for the job alone) unless the policy packs
  (``burst.pack_instances``, see ``_pack``). Multi-instance gangs get instances of their own.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Any

from berth.domain.job_spec import SpotPolicy
from berth.scheduler.core import schedule
from berth.scheduler.decisions import CloudAssignment, Decisions, OnPremAssignment
from berth.scheduler.eligibility import cloud_job_exclusion, wants_spot
from berth.scheduler.fairshare import decay_factor
from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.snapshot import (
    CircuitRecord,
    CloudOffer,
    Host,
    PendingJob,
    RunningJob,
    Snapshot,
    TenantState,
)
from berth_tools.sim.cluster import ClusterSpec
from berth_tools.sim.trace import TraceJob, split_nodes

FINISH, INTERRUPT, ARRIVE, PASS = 0, 1, 2, 3


@dataclass(slots=True)
class SimJob:
    trace: TraceJob
    nodes: int
    cpu: float
    memory_gib: float
    progress_s: float = 0.0
    first_start_s: float | None = None
    end_s: float | None = None
    epoch: int = 0
    site: str | None = None
    placed_at: float = 0.0
    work_start: float = 0.0
    hosts: tuple[tuple[str, int], ...] = ()
    hourly_usd: float = 0.0
    cost_usd: float = 0.0
    onprem_gpu_s: float = 0.0
    cloud_gpu_s: float = 0.0
    preemptions: int = 0
    interruptions: int = 0
    repatriations: int = 0
    attempts: int = 0
    instance: int | None = None

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.trace.duration_s - self.progress_s)


@dataclass(slots=True)
class SimState:
    jobs: dict[str, SimJob]
    onprem_gpus: int
    span_end_s: float = 0.0
    passes: int = 0
    preemptions: int = 0
    interruptions: int = 0
    repatriations: int = 0
    circuit_failures: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    instances_launched: int = 0
    free_rides: int = 0
    idle_instance_usd: float = 0.0
    max_instance_gpus_used: int = 0


@dataclass(slots=True)
class CloudInstance:
    """A running cloud instance shared by the jobs placed on it."""

    iid: int
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    spot: bool
    gpus: int
    cpu: float
    memory_gib: float
    hourly_usd: float
    launched_at: float
    ready_at: float
    free_gpus: int
    free_cpu: float
    free_memory_gib: float
    jobs: set[str] = field(default_factory=set)
    charged: dict[str, float] = field(default_factory=dict)


class Simulator:
    def __init__(self, trace: list[TraceJob], cluster: ClusterSpec, policy: SchedulingPolicy) -> None:
        self.cluster = cluster
        self.policy = policy
        self.trace = trace
        self.offers = cluster.offers()
        self.ckpt = cluster.jobs.checkpoint_interval_s
        max_host = max((p.gpus_per_host for p in cluster.pools), default=8)
        self.host_specs: dict[str, Host] = {}
        for pool in cluster.pools:
            for i in range(pool.hosts):
                hid = f"{pool.name}-{i:04d}"
                self.host_specs[hid] = Host(
                    hid,
                    pool.name,
                    pool.gpu_type,
                    pool.gpus_per_host,
                    pool.gpus_per_host,
                    pool.cpu,
                    pool.cpu,
                    pool.memory_gib,
                    pool.memory_gib,
                )
        self.free: dict[str, list[float]] = {
            hid: [h.gpus, h.cpu, h.memory_gib] for hid, h in self.host_specs.items()
        }
        self._hosts_cache: tuple[Host, ...] | None = None
        jobs: dict[str, SimJob] = {}
        for t in trace:
            nodes = split_nodes(t.gpus, max_host)
            gpn = t.gpus // nodes
            jobs[t.job_id] = SimJob(
                t, nodes, cluster.jobs.cpu_per_gpu * gpn, cluster.jobs.memory_gib_per_gpu * gpn
            )
        self.state = SimState(jobs=jobs, onprem_gpus=cluster.onprem_gpus)
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.tenant_names = sorted({t.tenant for t in trace})
        self.alloc: dict[str, dict[str, float]] = {n: {} for n in self.tenant_names}
        self.usage: dict[str, dict[str, float]] = {n: {} for n in self.tenant_names}
        self.usage_at = 0.0
        self.spend_month: dict[tuple[str, int], float] = {}
        self._pass_at: float | None = None
        self._last_pass: float | None = None
        self._wake_at: float | None = None
        self._interrupt_at: dict[str, tuple[str, str]] = {}
        self._repatriates = policy.repatriation.enabled and policy.use_onprem
        self._cloud_jobs = 0
        self._onprem_freed = False
        self._static_onprem_only = policy.burst is None and policy.preemption.max_per_pass == 0
        self._arrived_min_gpn = 0
        self._offer_by_key = {(o.region, o.zone, o.instance_type): o for o in self.offers}
        self.instances: dict[int, CloudInstance] = {}
        self._open_slots: dict[tuple[str, bool, str], set[int]] = {}
        self._alone_memo: dict[tuple[int, str, bool, str], float] = {}
        self._packs = policy.burst is not None and policy.burst.pack_instances

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
                and self._arrived_min_gpn > self._largest_free_block()
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
        return self.state

    def _largest_free_block(self) -> float:
        return max((f[0] for f in self.free.values()), default=0)

    def _cloud_running(self) -> bool:
        return self._cloud_jobs > 0

    # ------------------------------------------------------------------ transitions
    def _pending_job(self, job: SimJob) -> PendingJob:
        t = job.trace
        return PendingJob(
            job_id=t.job_id,
            tenant=t.tenant,
            gpu_type=t.gpu_type,
            gpus=t.gpus,
            submitted_at=t.submit_s,
            nodes=job.nodes,
            cpu=job.cpu,
            memory_gib=job.memory_gib,
            spot=SpotPolicy.ALLOWED,
            expected_duration_s=job.remaining_s,
            checkpointing=self.ckpt is not None,
        )

    def _arrive(self, job_id: str, now: float) -> None:
        job = self.state.jobs[job_id]
        if job.trace.duration_s <= 0:
            job.first_start_s = job.end_s = now
            return
        self.pending[job_id] = self._pending_job(job)
        self._arrived_min_gpn = min(self._arrived_min_gpn, job.trace.gpus // job.nodes)

    def _alloc_delta(self, job: SimJob, sign: float) -> None:
        a = self.alloc[job.trace.tenant]
        gk = "gpu:" + job.trace.gpu_type
        a[gk] = a.get(gk, 0.0) + sign * job.trace.gpus
        if job.site == "onprem":
            a["cpu"] = a.get("cpu", 0.0) + sign * job.cpu * job.nodes
            a["memory"] = a.get("memory", 0.0) + sign * job.memory_gib * job.nodes

    def _begin(self, job: SimJob, start: float, **placement: Any) -> float:
        """Record a started attempt (on either site): the running job, its usage and its finish,
        whose time it returns."""
        job.attempts += 1
        if job.first_start_s is None:
            job.first_start_s = start
        end = start + job.remaining_s
        self.running[job.trace.job_id] = RunningJob(
            job_id=job.trace.job_id,
            tenant=job.trace.tenant,
            gpus=job.trace.gpus,
            started_at=start,
            nodes=job.nodes,
            checkpointing=self.ckpt is not None,
            checkpoint_interval_s=self.ckpt,
            expected_end_at=end,
            **placement,
        )
        self._alloc_delta(job, 1.0)
        self._push(end, FINISH, job.trace.job_id, job.epoch)
        return end

    def _start_onprem(self, job: SimJob, a: OnPremAssignment, now: float) -> None:
        for hid, g in a.hosts:
            f = self.free[hid]
            if f[0] < g or f[1] < a.cpu - 1e-9 or f[2] < a.memory_gib - 1e-9:
                raise AssertionError(f"over-allocation of {hid} for {job.trace.job_id}")
            f[0] -= g
            f[1] -= a.cpu
            f[2] -= a.memory_gib
        self._hosts_cache = None
        job.site, job.hosts, job.placed_at, job.work_start, job.hourly_usd = "onprem", a.hosts, now, now, 0.0
        self._begin(
            job,
            now,
            gpu_type=a.gpu_type,
            site="onprem",
            hosts=a.hosts,
            cpu=a.cpu,
            memory_gib=a.memory_gib,
            borrowed=a.borrowed,
        )

    # ------------------------------------------------------------------ cloud instances
    @staticmethod
    def _packable(job: SimJob) -> bool:
        """A single-node job may share an instance (a gang of several nodes gets its own)."""
        return job.nodes == 1

    def _fits(self, inst: CloudInstance, job: SimJob) -> bool:
        return (
            inst.free_gpus >= job.trace.gpus
            and inst.free_cpu >= job.cpu - 1e-9
            and inst.free_memory_gib >= job.memory_gib - 1e-9
        )

    def _find_slot(self, job: SimJob, a: CloudAssignment) -> CloudInstance | None:
        """Best fit among running instances of the job's GPU model, spot mode and region."""
        best: CloudInstance | None = None
        for iid in self._open_slots.get((a.gpu_type, a.spot, a.region), ()):
            inst = self.instances[iid]
            if self._fits(inst, job) and (
                best is None
                or (inst.free_gpus, inst.ready_at, inst.iid) < (best.free_gpus, best.ready_at, best.iid)
            ):
                best = inst
        return best

    def _launch(self, offer: CloudOffer, spot: bool, hourly_usd: float, now: float) -> CloudInstance:
        self.state.instances_launched += 1
        iid = self.state.instances_launched
        inst = CloudInstance(
            iid,
            offer.region,
            offer.zone,
            offer.instance_type,
            offer.gpu_type,
            spot,
            offer.gpus,
            offer.vcpus,
            offer.memory_gib,
            hourly_usd,
            now,
            now + self.cluster.cloud.startup_delay_s,
            offer.gpus,
            offer.vcpus,
            offer.memory_gib,
        )
        self.instances[iid] = inst
        self._open_slots.setdefault((inst.gpu_type, inst.spot, inst.region), set()).add(iid)
        return inst

    def _join(self, job: SimJob, a: CloudAssignment, inst: CloudInstance, now: float) -> None:
        if not self._fits(inst, job):
            raise AssertionError(f"over-allocation of cloud instance {inst.iid} for {job.trace.job_id}")
        inst.free_gpus -= job.trace.gpus
        inst.free_cpu -= job.cpu
        inst.free_memory_gib -= job.memory_gib
        inst.jobs.add(job.trace.job_id)
        used = inst.gpus - inst.free_gpus
        self.state.max_instance_gpus_used = max(self.state.max_instance_gpus_used, used)
        if inst.free_gpus == 0:
            self._open_slots[(inst.gpu_type, inst.spot, inst.region)].discard(inst.iid)
        job.instance = inst.iid
        share = inst.hourly_usd * job.trace.gpus / inst.gpus
        placed = CloudAssignment(
            job_id=a.job_id,
            tenant=a.tenant,
            region=inst.region,
            zone=inst.zone,
            queue=a.queue,
            instance_type=inst.instance_type,
            instances=1,
            gpu_type=inst.gpu_type,
            spot=inst.spot,
            hourly_usd=share,
        )
        self._start_cloud(job, placed, now, max(now, inst.ready_at))

    def _leave(self, job: SimJob, cost: float, now: float) -> None:
        """``job`` leaves its instance; the last one out closes it and pays its idle slots."""
        assert job.instance is not None
        inst = self.instances[job.instance]
        job.instance = None
        inst.jobs.discard(job.trace.job_id)
        inst.charged[job.trace.job_id] = inst.charged.get(job.trace.job_id, 0.0) + cost
        inst.free_gpus += job.trace.gpus
        inst.free_cpu += job.cpu
        inst.free_memory_gib += job.memory_gib
        key = (inst.gpu_type, inst.spot, inst.region)
        if inst.jobs:
            self._open_slots[key].add(inst.iid)
            return
        self._open_slots[key].discard(inst.iid)
        del self.instances[inst.iid]
        total = inst.hourly_usd * max(0.0, now - inst.launched_at) / 3600.0
        paid = sum(inst.charged.values())
        idle = total - paid
        if idle <= 0:
            return
        self.state.idle_instance_usd += idle
        for jid, c in inst.charged.items():
            extra = idle * (c / paid) if paid > 0 else idle / len(inst.charged)
            user = self.state.jobs[jid]
            user.cost_usd += extra
            month = (user.trace.tenant, int(now // (30 * 86400)))
            self.spend_month[month] = self.spend_month.get(month, 0.0) + extra

    def _place_cloud(self, job: SimJob, a: CloudAssignment, now: float) -> None:
        """Free slots of a running instance first, else a new instance of the chosen offer."""
        inst = self._find_slot(job, a) if self._packable(job) else None
        if inst is None:
            if a.instances != 1 or not self._packable(job):
                self._start_cloud(job, a, now, now + self.cluster.cloud.startup_delay_s)
                return
            offer = self._offer_by_key[(a.region, a.zone, a.instance_type)]
            inst = self._launch(offer, a.spot, a.hourly_usd, now)
        self._join(job, a, inst, now)

    def _pack(self, batch: list[tuple[SimJob, CloudAssignment]], now: float) -> None:
        """``burst.pack_instances``: the single-node jobs bursting in this pass fill free slots
        first; the rest are packed (longest expected run first, first fit) onto the offer, of the
        same GPU model, spot mode and region, that saves the most per hour against launching
        each job's own cheapest offer, while any saves. The saving counts the waiting jobs that
        would take the instance's remaining slots at once (``_free_ride``: expected to end before
        the packed jobs) at their own cheapest price; jobs left launch their own offer."""
        rest: list[tuple[SimJob, CloudAssignment]] = []
        for job, a in batch:
            inst = self._find_slot(job, a)
            if inst is not None:
                self._join(job, a, inst, now)
            else:
                rest.append((job, a))
        groups: dict[tuple[str, bool, str], list[tuple[SimJob, CloudAssignment]]] = {}
        for job, a in rest:
            groups.setdefault((a.gpu_type, a.spot, a.region), []).append((job, a))
        for (gpu_type, spot, region), items in groups.items():
            items.sort(key=lambda ja: (-ja[0].remaining_s, ja[0].trace.job_id))
            offers = self._pack_offers(gpu_type, spot, region)
            riders = self._riders(gpu_type, spot, region)
            while items:
                best: tuple[float, CloudOffer, float, list[int]] | None = None
                for offer, price in offers:
                    chosen = self._first_fit(items, offer)
                    if not chosen:
                        continue
                    value = sum(items[i][1].hourly_usd for i in chosen)
                    if riders:
                        value += self._rider_value(items, chosen, offer, riders, gpu_type, spot, region)
                    saving = value - price
                    if saving > 1e-9 and (best is None or saving > best[0]):
                        best = (saving, offer, price, chosen)
                if best is None:
                    break
                _, offer, price, chosen = best
                inst = self._launch(offer, spot, price, now)
                for i in chosen:
                    self._join(items[i][0], items[i][1], inst, now)
                taken = set(chosen)
                items = [ja for i, ja in enumerate(items) if i not in taken]
                if riders:
                    self._free_ride(now)
                    riders = [r for r in riders if r[0] in self.pending]
            for job, a in items:
                self._place_cloud(job, a, now)

    def _rider_ok(self, pj: PendingJob, gpu_type: str, spot: bool, region: str) -> bool:
        """May this waiting job run in a free slot of an instance of this kind (policy rules)?"""
        if gpu_type not in self.policy.accepted_gpus(pj.gpu_type):
            return False
        if pj.regions and region not in pj.regions:
            return False
        residency = self.policy.residency_for(pj.tenant, pj.datasets)
        if cloud_job_exclusion(pj, self.policy, residency) is not None or any(
            r.regions and region not in r.regions for r in residency
        ):
            return False
        mode = wants_spot(pj, self.policy)
        return not ((mode is False and spot) or (mode is True and not spot))

    def _riders(self, gpu_type: str, spot: bool, region: str) -> list[tuple[str, SimJob]]:
        """Waiting single-node jobs that would take free slots of such an instance (submit order)."""
        out = []
        for job_id, pj in self.pending.items():
            job = self.state.jobs[job_id]
            if job.nodes == 1 and self._rider_ok(pj, gpu_type, spot, region):
                out.append((job_id, job))
        out.sort(key=lambda r: (r[1].trace.submit_s, r[0]))
        return out

    def _alone_usd_h(self, gpus: int, gpu_type: str, spot: bool, region: str) -> float:
        """The cheapest hourly price of instances holding ``gpus`` GPUs for one job alone."""
        key = (gpus, gpu_type, spot, region)
        hit = self._alone_memo.get(key)
        if hit is not None:
            return hit
        best = math.inf
        for o in self.offers:
            price = o.spot_usd_h if spot else o.on_demand_usd_h
            if o.gpu_type != gpu_type or o.region != region or price is None:
                continue
            n = 1 if o.gpus >= gpus else (gpus // o.gpus if gpus % o.gpus == 0 else 0)
            if n:
                best = min(best, price * n)
        self._alone_memo[key] = best
        return best

    def _rider_value(
        self,
        items: list[tuple[SimJob, CloudAssignment]],
        chosen: list[int],
        offer: CloudOffer,
        riders: list[tuple[str, SimJob]],
        gpu_type: str,
        spot: bool,
        region: str,
    ) -> float:
        """What the waiting jobs that would fill the rest of this instance cost alone per hour
        (only jobs the instance's bursting jobs keep it running long enough for)."""
        gpus = offer.gpus - sum(items[i][0].trace.gpus for i in chosen)
        cpu = offer.vcpus - sum(items[i][0].cpu for i in chosen)
        mem = offer.memory_gib - sum(items[i][0].memory_gib for i in chosen)
        until = max(items[i][0].remaining_s for i in chosen)
        value = 0.0
        for _, job in riders:
            if gpus <= 0:
                break
            if (
                job.remaining_s <= until
                and job.trace.gpus <= gpus
                and job.cpu <= cpu + 1e-9
                and job.memory_gib <= mem + 1e-9
            ):
                gpus -= job.trace.gpus
                cpu -= job.cpu
                mem -= job.memory_gib
                value += self._alone_usd_h(job.trace.gpus, gpu_type, spot, region)
        return value

    def _free_ride(self, now: float) -> None:
        """``burst.pack_instances``: a waiting single-node job that fits a free slot of a running
        instance which its other jobs keep running (by their expected ends) at least as long as
        this job needs goes there at once: it adds nothing to the bill and frees on-prem room."""
        horizon: dict[int, float] = {}
        for iid in set().union(*self._open_slots.values()):
            inst = self.instances[iid]
            ends = [self.running[j].expected_end_at or 0.0 for j in inst.jobs if j in self.running]
            if ends:
                horizon[iid] = max(ends)
        if not horizon:
            return
        for job_id in sorted(self.pending, key=lambda j: (self.pending[j].submitted_at, j)):
            if not horizon:
                break
            pj = self.pending[job_id]
            job = self.state.jobs[job_id]
            if job.nodes != 1:
                continue
            best: CloudInstance | None = None
            for iid, end in horizon.items():
                inst = self.instances[iid]
                start = max(now, inst.ready_at)
                if (
                    start + job.remaining_s <= end
                    and self._fits(inst, job)
                    and (best is None or (inst.free_gpus, iid) < (best.free_gpus, best.iid))
                ):
                    best = inst
            if best is None or not self._rider_ok(pj, best.gpu_type, best.spot, best.region):
                continue
            del self.pending[job_id]
            a = CloudAssignment(
                job_id=job_id,
                tenant=pj.tenant,
                region=best.region,
                zone=best.zone,
                queue="",
                instance_type=best.instance_type,
                instances=1,
                gpu_type=best.gpu_type,
                spot=best.spot,
                hourly_usd=0.0,
            )
            self._join(job, a, best, now)
            self.state.free_rides += 1
            if best.free_gpus == 0:
                del horizon[best.iid]

    def _pack_offers(self, gpu_type: str, spot: bool, region: str) -> list[tuple[CloudOffer, float]]:
        """The cheapest zone of each multi-GPU instance type of this model and region."""
        best: dict[str, tuple[CloudOffer, float]] = {}
        for o in self.offers:
            if o.gpu_type != gpu_type or o.region != region or o.gpus < 2:
                continue
            price = o.spot_usd_h if spot else o.on_demand_usd_h
            if price is None:
                continue
            cur = best.get(o.instance_type)
            if cur is None or (price, o.zone) < (cur[1], cur[0].zone):
                best[o.instance_type] = (o, price)
        return sorted(best.values(), key=lambda op: (op[1] / op[0].gpus, op[0].instance_type))

    @staticmethod
    def _first_fit(items: list[tuple[SimJob, CloudAssignment]], offer: CloudOffer) -> list[int]:
        gpus, cpu, mem = offer.gpus, offer.vcpus, offer.memory_gib
        chosen = []
        for i, (job, _) in enumerate(items):
            if job.trace.gpus <= gpus and job.cpu <= cpu + 1e-9 and job.memory_gib <= mem + 1e-9:
                gpus -= job.trace.gpus
                cpu -= job.cpu
                mem -= job.memory_gib
                chosen.append(i)
                if gpus == 0:
                    break
        return chosen

    def _start_cloud(self, job: SimJob, a: CloudAssignment, now: float, start: float) -> None:
        job.site, job.hosts, job.placed_at, job.work_start, job.hourly_usd = (
            "cloud",
            (),
            now,
            start,
            a.hourly_usd,
        )
        end = self._begin(
            job,
            start,
            gpu_type=a.gpu_type,
            site="cloud",
            cpu=job.cpu,
            memory_gib=job.memory_gib,
            region=a.region,
            instance_type=a.instance_type,
            spot=a.spot,
            hourly_usd=a.hourly_usd,
        )
        self._cloud_jobs += 1
        rate = self.cluster.cloud.spot.interruptions_per_hour
        if a.spot and rate > 0:
            seed = zlib.crc32(
                f"{self.cluster.cloud.spot.seed}:{job.trace.job_id}:{job.interruptions}".encode()
            )
            u = random.Random(seed).random()
            t_int = start + (-math.log(1.0 - u) / (rate * a.instances)) * 3600.0
            if t_int < end:
                self._push(t_int, INTERRUPT, job.trace.job_id, job.epoch)
                key = (a.region, a.instance_type)
                # Remember where interruptions happen for the circuit breaker (recorded when they occur).
                self._interrupt_at[job.trace.job_id] = key

    def _stop(self, job: SimJob, now: float, finished: bool = False) -> None:
        elapsed = max(0.0, now - job.placed_at)
        if job.site == "onprem":
            job.onprem_gpu_s += job.trace.gpus * elapsed
            self._onprem_freed = True
            for hid, g in job.hosts:
                f = self.free[hid]
                f[0] += g
                f[1] += job.cpu
                f[2] += job.memory_gib
            self._hosts_cache = None
        else:
            self._cloud_jobs -= 1
            job.cloud_gpu_s += job.trace.gpus * elapsed
            cost = job.hourly_usd * elapsed / 3600.0
            job.cost_usd += cost
            month = (job.trace.tenant, int(now // (30 * 86400)))
            self.spend_month[month] = self.spend_month.get(month, 0.0) + cost
            if job.instance is not None:
                self._leave(job, cost, now)
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

    def _requeue(self, job: SimJob) -> None:
        self.pending[job.trace.job_id] = self._pending_job(job)

    def _interrupt(self, job: SimJob, now: float) -> None:
        key = self._interrupt_at.pop(job.trace.job_id, None)
        if key is not None:
            self.state.circuit_failures.setdefault(key, []).append(now)
        self._stop(job, now)
        job.interruptions += 1
        self.state.interruptions += 1
        self._requeue(job)

    # ------------------------------------------------------------------ the pass
    def _hosts(self) -> tuple[Host, ...]:
        if self._hosts_cache is None:
            self._hosts_cache = tuple(
                Host(h.host_id, h.pool, h.gpu_type, h.gpus, int(f[0]), h.cpu, f[1], h.memory_gib, f[2])
                for h, f in ((h, self.free[hid]) for hid, h in self.host_specs.items())
            )
        return self._hosts_cache

    def _tenants(self, now: float) -> dict[str, TenantState]:
        rule = self.policy.fair_share
        if rule.history_weight > 0 and now > self.usage_at:
            f = decay_factor(now - self.usage_at, rule.half_life_s)
            tau = rule.half_life_s / math.log(2)
            for name in self.tenant_names:
                u = self.usage[name]
                for k in u:
                    u[k] *= f
                for k, v in self.alloc[name].items():
                    u[k] = u.get(k, 0.0) + v * tau * (1.0 - f)
            self.usage_at = now
        month = int(now // (30 * 86400))
        out = {}
        for name in self.tenant_names:
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

    def _circuits(self, now: float) -> tuple[CircuitRecord, ...]:
        horizon = self.policy.circuit.window_s + self.policy.circuit.open_s
        records = []
        for (region, itype), times in self.state.circuit_failures.items():
            times[:] = [t for t in times if now - t <= horizon]
            if times:
                records.append(CircuitRecord(region, itype, tuple(times)))
        return tuple(records)

    def snapshot(self, now: float) -> Snapshot:
        return Snapshot(
            pending=tuple(self.pending.values()),
            running=tuple(self.running.values()),
            hosts=self._hosts(),
            offers=self.offers,
            tenants=self._tenants(now),
            circuits=self._circuits(now),
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
        batch: list[tuple[SimJob, CloudAssignment]] = []
        for a in d.placements:
            job = jobs[a.job_id]
            del self.pending[a.job_id]
            if isinstance(a, OnPremAssignment):
                self._start_onprem(job, a, now)
            elif self._packs and self._packable(job):
                batch.append((job, a))
            else:
                self._place_cloud(job, a, now)
        if batch:
            self._pack(batch, now)
        if self._packs and self.pending and any(self._open_slots.values()):
            self._free_ride(now)
        for r in d.repatriations:
            job = jobs[r.job_id]
            self._interrupt_at.pop(r.job_id, None)
            self._stop(job, now)
            job.repatriations += 1
            self.state.repatriations += 1
            self._start_onprem(job, r.to, now)
