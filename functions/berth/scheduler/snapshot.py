"""What the scheduler reads: an immutable snapshot of the fleet, the queue and the tenants.

Plain frozen dataclasses with slots (the hot path of a pass touches them millions of times);
pydantic is kept for policy validation only. No I/O, no clock: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from berth.domain.batch_queues import batch_queue_name
from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy
from berth.domain.placement import Site
from berth.scheduler.predictor import RuntimePredictor


@dataclass(slots=True, frozen=True)
class PendingJob:
    """A job waiting for a place. ``cpu`` and ``memory_gib`` are per node."""

    job_id: str
    tenant: str
    gpu_type: str
    gpus: int
    submitted_at: float
    nodes: int = 1
    cpu: float = 4.0
    memory_gib: float = 16.0
    placement: PlacementConstraint = PlacementConstraint.AUTO
    regions: tuple[str, ...] = ()
    spot: SpotPolicy = SpotPolicy.ALLOWED
    priority: Priority = Priority.NORMAL
    max_hourly_usd: float | None = None
    max_cost_usd: float | None = None
    expected_duration_s: float | None = None
    """The user's estimate of the whole run time (a hint): the predictor calibrates it."""
    timeout_s: float | None = None
    checkpointing: bool = False
    datasets: tuple[str, ...] = ()
    avoid_hosts: tuple[str, ...] = ()
    avoid_regions: tuple[str, ...] = ()
    family: str = ""
    """What the job is (its name or model family): the predictor's history key."""
    progress_s: float = 0.0
    """Work already saved by checkpoints in earlier attempts (the service knows it)."""

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass(slots=True, frozen=True)
class RunningJob:
    """A job holding capacity. On-prem: ``hosts`` is ((host_id, gpus), ...); cloud: region etc."""

    job_id: str
    tenant: str
    gpu_type: str
    gpus: int
    started_at: float
    site: Site
    hosts: tuple[tuple[str, int], ...] = ()
    nodes: int = 1
    cpu: float = 4.0
    memory_gib: float = 16.0
    priority: Priority = Priority.NORMAL
    region: str | None = None
    instance_type: str | None = None
    spot: bool = False
    hourly_usd: float = 0.0
    borrowed: bool = False
    checkpointing: bool = False
    checkpoint_interval_s: float | None = None
    last_checkpoint_at: float | None = None
    expected_end_at: float | None = None
    """An end time the caller knows for sure (None: the pass predicts it from the run time)."""
    placement: PlacementConstraint = PlacementConstraint.AUTO
    datasets: tuple[str, ...] = ()
    family: str = ""
    expected_duration_s: float | None = None
    """The user's estimate of the whole run time."""
    timeout_s: float | None = None
    progress_s: float = 0.0
    """Work saved before this attempt started (its run time so far is that plus now - started_at)."""
    instance_id: str | None = None
    """The shared cloud instance it runs on (``Snapshot.instances``), if any."""

    def last_checkpoint(self, now: float) -> float:
        """When its progress was last saved (its start when it does not checkpoint)."""
        if self.last_checkpoint_at is not None:
            return self.last_checkpoint_at
        if self.checkpointing and self.checkpoint_interval_s:
            done = max(0.0, now - self.started_at)
            return self.started_at + (done // self.checkpoint_interval_s) * self.checkpoint_interval_s
        return self.started_at

    def lost_progress_s(self, now: float) -> float:
        """Seconds of work thrown away if it stopped now."""
        return max(0.0, now - self.last_checkpoint(now))


@dataclass(slots=True, frozen=True)
class Host:
    """An on-prem GPU host as its agent last reported it."""

    host_id: str
    pool: str
    gpu_type: str
    gpus: int
    free_gpus: int
    cpu: float
    free_cpu: float
    memory_gib: float
    free_memory_gib: float
    healthy: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    cached_datasets: frozenset[str] = frozenset()
    """Data sources (``s3://...`` as a job spec names them) whose objects its agent's cache holds."""


@dataclass(slots=True, frozen=True)
class CloudOffer:
    """One purchasable instance type in one zone. ``spot_usd_h`` is None where spot is not sold."""

    region: str
    zone: str
    instance_type: str
    gpu_type: str
    gpus: int
    vcpus: float
    memory_gib: float
    on_demand_usd_h: float
    spot_usd_h: float | None = None
    available: int | None = None
    queue: str = ""

    def queue_name(self, spot: bool) -> str:
        """The Batch job queue that runs this offer: its region's queue of its instance type
        (``berth-<region>-<family>_<size>-<ondemand|spot>``), whose compute environment holds that type
        only, so the instance priced is the one Batch launches. ``queue`` overrides it (tests,
        simulations)."""
        if self.queue:
            return self.queue
        return batch_queue_name(self.region, self.instance_type, spot)


@dataclass(slots=True, frozen=True)
class CloudInstance:
    """A running cloud instance that hosts several jobs' containers (AWS Batch places them so):
    its free GPU, vCPU and memory slots can take more single-node jobs of its kind."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    spot: bool
    gpus: int
    vcpus: float
    memory_gib: float
    hourly_usd: float
    free_gpus: int
    free_cpu: float
    free_memory_gib: float
    ready_at: float = 0.0


@dataclass(slots=True, frozen=True)
class CircuitRecord:
    """Recent capacity or API errors for one (region, instance type); ``instance_type`` '*' = region."""

    region: str
    instance_type: str
    failures: tuple[float, ...] = ()
    last_success_at: float | None = None


@dataclass(slots=True, frozen=True)
class TenantState:
    """A team: weight for fair share, on-prem quotas per GPU model, cloud budget, decayed usage.

    ``guaranteed_gpus[model]`` GPUs are the tenant's own; above that it may borrow up to
    ``borrow_limit_gpus[model]`` (``default_borrow_limit`` for models not listed; None = no
    limit). ``usage`` holds resource-seconds decayed to ``usage_as_of`` with the policy's
    half-life, keyed like the fair-share resources (``gpu:<model>``, ``cpu``, ``memory``).
    """

    name: str
    weight: float = 1.0
    guaranteed_gpus: Mapping[str, int] = field(default_factory=dict)
    borrow_limit_gpus: Mapping[str, int] = field(default_factory=dict)
    default_borrow_limit: int | None = None
    monthly_budget_usd: float | None = None
    cloud_spend_month_usd: float = 0.0
    usage: Mapping[str, float] = field(default_factory=dict)
    usage_as_of: float | None = None

    def onprem_limit(self, gpu_type: str) -> int | None:
        borrow = self.borrow_limit_gpus.get(gpu_type, self.default_borrow_limit)
        if borrow is None:
            return None
        return self.guaranteed_gpus.get(gpu_type, 0) + borrow


@dataclass(slots=True, frozen=True)
class Snapshot:
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    hosts: tuple[Host, ...]
    offers: tuple[CloudOffer, ...]
    tenants: Mapping[str, TenantState]
    circuits: tuple[CircuitRecord, ...] = ()
    instances: tuple[CloudInstance, ...] = ()
    runtimes: RuntimePredictor | None = None
    """What the service has learnt of run times (read only here). None: estimates as given."""
    unread: Mapping[str, int] = field(default_factory=dict)
    """Per tenant, the queued jobs the pass did not read (the queue index is read head first within
    a budget; ``berth.logic.snapshot.read_queue``): the core never sees them this pass, ``explain``
    says how many."""

    def tenant(self, name: str) -> TenantState:
        found = self.tenants.get(name)
        return found if found is not None else TenantState(name=name)
