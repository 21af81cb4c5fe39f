"""The simulated cloud: shared instances launched and joined as the scheduler decided, and their
billing. An instance is paid from launch until its last job leaves; each job is charged its GPU
share while on it, and the instance's idle slots are charged, when it closes, to the jobs that
used it (pro rata), so tenant costs add up to the total."""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.fits import fits
from berth.scheduler.policy import CircuitRule
from berth.scheduler.snapshot import CircuitRecord, CloudInstance, CloudOffer
from berth_tools.sim.cluster import SpotSpec


def interruption_at(spot: SpotSpec, job_id: str, nth: int, start: float, instances: int) -> float:
    """When a spot attempt is interrupted: Poisson per instance, from a random stream seeded per
    job and attempt, so every policy meets the same luck for the same job (inf: never)."""
    if spot.interruptions_per_hour <= 0:
        return math.inf
    u = random.Random(zlib.crc32(f"{spot.seed}:{job_id}:{nth}".encode())).random()
    return start + (-math.log(1.0 - u) / (spot.interruptions_per_hour * instances)) * 3600.0


def circuit_records(
    failures: dict[tuple[str, str], list[float]], rule: CircuitRule, now: float
) -> tuple[CircuitRecord, ...]:
    """The capacity errors (spot interruptions) the circuit breakers still remember."""
    horizon = rule.window_s + rule.open_s
    records = []
    for (region, itype), times in failures.items():
        times[:] = [t for t in times if now - t <= horizon]
        if times:
            records.append(CircuitRecord(region, itype, tuple(times)))
    return tuple(records)


@dataclass(slots=True)
class Instance:
    """A running cloud instance shared by the jobs placed on it."""

    offer: CloudOffer
    instance_id: str
    spot: bool
    hourly_usd: float
    launched_at: float
    ready_at: float
    free_gpus: int
    free_cpu: float
    free_memory_gib: float
    jobs: set[str] = field(default_factory=set)
    charged: dict[str, float] = field(default_factory=dict)

    def view(self) -> CloudInstance:
        o = self.offer
        return CloudInstance(
            self.instance_id, o.region, o.zone, o.instance_type, o.gpu_type, self.spot, o.gpus, o.vcpus,
            o.memory_gib, self.hourly_usd, self.free_gpus, self.free_cpu, self.free_memory_gib, self.ready_at,
        )  # fmt: skip


@dataclass
class CloudFleet:  # no slots: tests wrap ``join`` to watch every slot taken
    offers: dict[tuple[str, str, str], CloudOffer]
    startup_delay_s: float
    instances: dict[str, Instance] = field(default_factory=dict)
    launched: int = 0
    idle_usd: float = 0.0
    max_gpus_used: int = 0

    def snapshot(self) -> tuple[CloudInstance, ...]:
        return tuple(i.view() for i in self.instances.values() if i.free_gpus > 0)

    def join(
        self, a: CloudAssignment, job_id: str, gpus: int, cpu: float, mem: float, now: float
    ) -> Instance:
        """Apply a shared-instance assignment: launch the instance it names if new, then take a slot."""
        assert a.instance_id is not None
        inst = self.instances.get(a.instance_id)
        if inst is None:
            if not a.launch:
                raise AssertionError(f"{job_id}: instance {a.instance_id} is not running")
            offer = self.offers[(a.region, a.zone, a.instance_type)]
            self.launched += 1
            inst = self.instances[a.instance_id] = Instance(
                offer, a.instance_id, a.spot, a.instance_hourly_usd, now, now + self.startup_delay_s,
                offer.gpus, offer.vcpus, offer.memory_gib,
            )  # fmt: skip
        if not fits(inst.free_gpus, inst.free_cpu, inst.free_memory_gib, gpus, cpu, mem):
            raise AssertionError(f"over-allocation of cloud instance {inst.instance_id} for {job_id}")
        inst.free_gpus -= gpus
        inst.free_cpu -= cpu
        inst.free_memory_gib -= mem
        inst.jobs.add(job_id)
        self.max_gpus_used = max(self.max_gpus_used, inst.offer.gpus - inst.free_gpus)
        return inst

    def leave(
        self, instance_id: str, job_id: str, gpus: int, cpu: float, mem: float, cost: float, now: float
    ) -> dict[str, float]:
        """``job_id`` leaves; the last one out closes the instance. Returns extra charges (idle
        slots) per job id."""
        inst = self.instances[instance_id]
        inst.jobs.discard(job_id)
        inst.charged[job_id] = inst.charged.get(job_id, 0.0) + cost
        inst.free_gpus += gpus
        inst.free_cpu += cpu
        inst.free_memory_gib += mem
        if inst.jobs:
            return {}
        del self.instances[instance_id]
        total = inst.hourly_usd * max(0.0, now - inst.launched_at) / 3600.0
        paid = sum(inst.charged.values())
        idle = total - paid
        if idle <= 0:
            return {}
        self.idle_usd += idle
        return {
            jid: idle * (c / paid) if paid > 0 else idle / len(inst.charged)
            for jid, c in inst.charged.items()
        }
