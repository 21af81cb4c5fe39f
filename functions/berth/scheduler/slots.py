"""Shared cloud instances in a pass: which are open, and taking a slot of one.

AWS Batch places several containers on one instance, so a running instance with free GPUs is
capacity: a single-node job of its kind (GPU model, spot mode, region) may join it and pays its
GPU share. Every policy fills free slots first (best fit over instances bucketed by free GPUs),
under the same rules as any cloud placement: burst tenants, residency, regions, avoided regions,
spot rule, open circuits, ``max_usd_per_gpu_hour``, ``max_hourly_usd``, ``max_cost_usd`` and the
tenant's budget. With ``burst.pack_instances`` a job waiting for on-prem may also start at once
in a slot that the instance's paying jobs keep paid (``fill_free_slots``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from berth.domain.batch_queues import batch_queue_name
from berth.domain.placement import Site
from berth.scheduler.circuit import CircuitState
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.eligibility import (
    budget_exclusion,
    cloud_job_exclusion,
    offer_kind_exclusion,
    price_exclusion,
    wants_spot,
)
from berth.scheduler.fits import fits
from berth.scheduler.outcomes import JobOutcome, Rule, Step
from berth.scheduler.snapshot import PendingJob, TenantState

if TYPE_CHECKING:
    from berth.scheduler.context import PassContext

_SCAN_LIMIT = 256
"""Instances of one bucket tried before giving up on it (bounds a pass with many instances)."""

Kind = tuple[str, bool, str]
"""(GPU model, spot, region): instances a job may share."""


def new_instance_id(job: PendingJob, now: float) -> str:
    """A new shared instance is named after the job that launches it and the pass."""
    return f"i-{job.job_id}@{now:.0f}"


@dataclass(slots=True)
class OpenInstance:
    instance_id: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    spot: bool
    gpus: int
    hourly_usd: float
    free_gpus: int
    free_cpu: float
    free_memory_gib: float
    ready_at: float
    queue: str = ""
    paid_until: float = 0.0
    """The latest predicted end of its paying jobs: how long it runs anyway."""

    @property
    def kind(self) -> Kind:
        return (self.gpu_type, self.spot, self.region)


@dataclass(slots=True)
class SlotLedger:
    """Open shared instances (the snapshot's and those launched in this pass) and the jobs
    deferred to the packing step."""

    instances: dict[str, OpenInstance] = field(default_factory=dict)
    open_by_kind: dict[Kind, dict[int, dict[str, None]]] = field(default_factory=dict)
    """Open instances by kind, then by free GPUs (best fit looks at the smallest bucket that fits)."""
    _kinds: dict[tuple[object, ...], list[Kind]] = field(default_factory=dict)
    _kind_ok: dict[tuple[object, ...], bool] = field(default_factory=dict)
    deferred: list[tuple[PendingJob, CloudAssignment]] = field(default_factory=list)
    waiting: list[PendingJob] = field(default_factory=list)
    """Jobs left waiting for on-prem that could start in a free slot (``pack_instances``)."""
    alone_memo: dict[tuple[int, str, bool, str], float] = field(default_factory=dict)
    """Packing: the cheapest price of an instance for one job alone, per (GPUs, kind)."""

    @classmethod
    def build(cls, ctx: PassContext) -> SlotLedger:
        led = cls()
        for i in ctx.snapshot.instances:
            led.open(
                OpenInstance(
                    i.instance_id, i.region, i.zone, i.instance_type, i.gpu_type, i.spot, i.gpus,
                    i.hourly_usd, i.free_gpus, i.free_cpu, i.free_memory_gib, i.ready_at,
                    batch_queue_name(i.region, i.instance_type, i.spot),
                )
            )  # fmt: skip
        q = ctx.policy.runtime.pack_q
        for r in ctx.snapshot.running:
            inst = led.instances.get(r.instance_id or "")
            if inst is not None:
                end = ctx.expected_end(r, q)
                if end is not None:
                    inst.paid_until = max(inst.paid_until, end)
        return led

    def open(self, inst: OpenInstance) -> None:
        self.instances[inst.instance_id] = inst
        if inst.free_gpus > 0:
            if inst.kind not in self.open_by_kind:
                self._kinds.clear()  # a new kind: the memo of kinds each job class may use is stale
            self.open_by_kind.setdefault(inst.kind, {}).setdefault(inst.free_gpus, {})[inst.instance_id] = (
                None
            )

    def _take(self, inst: OpenInstance, gpus: int, cpu: float, memory_gib: float) -> None:
        buckets = self.open_by_kind.get(inst.kind, {})
        buckets.get(inst.free_gpus, {}).pop(inst.instance_id, None)
        inst.free_gpus -= gpus
        inst.free_cpu -= cpu
        inst.free_memory_gib -= memory_gib
        if inst.free_gpus > 0:
            buckets.setdefault(inst.free_gpus, {})[inst.instance_id] = None

    # ------------------------------------------------------------------ placing
    def defer(self, ctx: PassContext, job: PendingJob, a: CloudAssignment) -> None:
        self.deferred.append((job, a))
        ctx.last_placed = a
        # Counted in fair share now, so the rest of the pass sees the tenant's cloud GPUs.
        ctx.fair.add(job.tenant, {"gpu:" + a.gpu_type: float(job.gpus)})

    def place(self, ctx: PassContext, job: PendingJob, a: CloudAssignment, deferred: bool = False) -> None:
        """Commit a cloud assignment: the decision, fair share, and a new shared instance's slots."""
        ctx.decisions.placements.append(a)
        ctx.last_placed = a
        if not deferred:
            ctx.fair.add(job.tenant, {"gpu:" + a.gpu_type: float(job.gpus)})
        if a.instance_id is None:
            return
        inst = self.instances.get(a.instance_id)
        if inst is None and a.launch:
            offer = ctx.cloud.by_key[(a.region, a.zone, a.instance_type)]
            inst = OpenInstance(
                a.instance_id, a.region, a.zone, a.instance_type, a.gpu_type, a.spot, offer.gpus,
                a.instance_hourly_usd, offer.gpus, offer.vcpus, offer.memory_gib, ctx.now, a.queue,
            )  # fmt: skip
            self.open(inst)
        assert inst is not None
        self._take(inst, job.gpus, job.cpu, job.memory_gib)

    def kind_ok(self, ctx: PassContext, job: PendingJob, kind: Kind, mode: bool | None) -> bool:
        """May this job run on capacity of this kind (every job-level and kind-level cloud rule)?
        Memoised per job class, kind and pass: queues repeat a few classes."""
        key = (
            job.tenant,
            job.datasets,
            job.placement,
            job.gpu_type,
            job.regions,
            job.avoid_regions,
            mode,
            kind,
        )
        ok = self._kind_ok.get(key)
        if ok is None:
            residency = ctx.residency(job)
            ok = self._kind_ok[key] = cloud_job_exclusion(job, ctx.policy, residency) is None and (
                offer_kind_exclusion(job, ctx.policy, residency, kind[0], kind[2], kind[1], mode) is None
            )
        return ok

    def _allowed_kinds(self, ctx: PassContext, job: PendingJob, mode: bool | None) -> list[Kind]:
        """Kinds of open instances this job may use (memoised per job class and pass)."""
        key = (job.tenant, job.datasets, job.placement, job.gpu_type, job.regions, job.avoid_regions, mode)
        kinds = self._kinds.get(key)
        if kinds is None:
            kinds = self._kinds[key] = [k for k in self.open_by_kind if self.kind_ok(ctx, job, k, mode)]
        return kinds

    def join_best(
        self,
        ctx: PassContext,
        job: PendingJob,
        tenant: TenantState,
        horizon_s: float,
        need_until: float | None = None,
    ) -> CloudAssignment | None:
        """Best fit among open instances the job may use; with ``need_until``, only an instance
        paid until then anyway (a free-slot start). Commits and returns the assignment."""
        if not self.open_by_kind:
            return None
        mode = wants_spot(job, ctx.policy, ctx.remaining_s(job, ctx.policy.runtime.spot_q))
        best: tuple[int, float, str] | None = None
        for kind in self._allowed_kinds(ctx, job, mode):
            buckets = self.open_by_kind[kind]
            top = best[0] if best is not None else max(buckets, default=0)
            for free in range(job.gpus, top + 1):
                bucket = buckets.get(free)
                if not bucket:
                    continue
                found = self._first_in_bucket(ctx, job, bucket, horizon_s, need_until)
                if found is not None:
                    cand = (free, self.instances[found].ready_at, found)
                    if best is None or cand < best:
                        best = cand
                    break
        if best is None:
            return None
        inst = self.instances[best[2]]
        share = inst.hourly_usd * job.gpus / inst.gpus
        committed = ctx.committed_usd.get(job.tenant, 0.0)
        if budget_exclusion(tenant, share, committed, horizon_s) is not None:
            return None
        ctx.committed_usd[job.tenant] = committed + share * horizon_s / 3600.0
        a = slot_assignment(job, inst, share)
        self.place(ctx, job, a)
        return a

    def _first_in_bucket(
        self,
        ctx: PassContext,
        job: PendingJob,
        bucket: dict[str, None],
        horizon_s: float,
        need_until: float | None,
    ) -> str | None:
        """The first instance of a bucket (in launch order) that holds the job under every rule."""
        for tried, iid in enumerate(bucket):
            if tried >= _SCAN_LIMIT:
                break
            inst = self.instances[iid]
            if not fits(
                inst.free_gpus, inst.free_cpu, inst.free_memory_gib, job.gpus, job.cpu, job.memory_gib
            ):
                continue
            if (
                need_until is not None
                and max(ctx.now, inst.ready_at) + (need_until - ctx.now) > inst.paid_until
            ):
                continue
            if ctx.circuits.state(inst.region, inst.instance_type) is CircuitState.OPEN:
                continue
            share = inst.hourly_usd * job.gpus / inst.gpus
            where = f"a slot of {inst.instance_type} in {inst.zone}"
            if (
                price_exclusion(job, ctx.policy, where, inst.hourly_usd / inst.gpus, share, horizon_s)
                is not None
            ):
                continue
            return iid
        return None

    # ------------------------------------------------------------------ packing

    def fill_free_slots(self, ctx: PassContext) -> None:
        """A job waiting for on-prem starts in a free slot of an instance that its paying jobs keep
        running at least as long as this job is predicted to need: it adds nothing to the bill
        while the instance runs anyway, and leaves on-prem room to the others."""
        if not self.waiting or not self.open_by_kind:
            return
        need_q = ctx.policy.runtime.slot_need_q
        # No slot is paid beyond the latest paid-until of an open instance: a cheap first test.
        latest = max(
            (
                self.instances[i].paid_until
                for b in self.open_by_kind.values()
                for ids in b.values()
                for i in ids
            ),
            default=0.0,
        )
        still: list[PendingJob] = []
        for job in self.waiting:
            if ctx.outcomes[job.job_id].placed is not None:
                continue
            need = ctx.remaining_s(job, need_q)
            a = None
            if need is not None and ctx.now + need <= latest:
                a = self.join_best(ctx, job, ctx.tenant(job.tenant), ctx.cost_horizon_s(job), ctx.now + need)
            if a is None:
                still.append(job)
                continue
            old = ctx.outcomes[job.job_id].steps
            steps = tuple(s for s in old if s.rule is not Rule.BURST_WAIT)
            note = Step(
                Site.CLOUD, Rule.FREE_SLOT, f"started in a free slot of {a.instance_type} paid for anyway"
            )
            ctx.outcomes[job.job_id] = JobOutcome(a, (*steps, note))
        self.waiting = still


def alone_price(a: CloudAssignment) -> float:
    """What a job's own choice costs per hour alone: the whole instance it would launch."""
    return a.instance_hourly_usd if a.instance_id is not None else a.hourly_usd


def slot_assignment(
    job: PendingJob, inst: OpenInstance, share: float, launch: bool = False
) -> CloudAssignment:
    return CloudAssignment(
        job_id=job.job_id,
        tenant=job.tenant,
        region=inst.region,
        zone=inst.zone,
        queue=inst.queue,
        instance_type=inst.instance_type,
        instances=1,
        gpu_type=inst.gpu_type,
        spot=inst.spot,
        hourly_usd=share,
        instance_id=inst.instance_id,
        launch=launch,
        instance_hourly_usd=inst.hourly_usd,
    )
