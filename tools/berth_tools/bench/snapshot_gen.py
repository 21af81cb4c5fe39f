"""Generate a large, realistic scheduling snapshot, deterministically from a seed."""

from __future__ import annotations

import random

from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy
from berth.domain.placement import Site
from berth.pricing.catalog import load_offers
from berth.scheduler.predictor import RuntimePredictor
from berth.scheduler.snapshot import (
    CloudInstance,
    CloudOffer,
    Host,
    PendingJob,
    RunningJob,
    Snapshot,
    TenantState,
)

MODELS = ("H100", "A100", "V100", "L4")
FAMILIES = ("resnet50", "bert-large", "gpt2", "vit-b16", "dlrm", "whisper")
SHAPES = ((1, 1), (1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (8, 1), (16, 2))
NOW = 10_000_000.0


def generate_snapshot(
    nodes: int, pending: int, tenants: int, seed: int = 0, busy_fraction: float = 0.5
) -> Snapshot:
    """``nodes`` 8-GPU hosts in pools of up to 250, about ``busy_fraction`` of GPUs held by running
    jobs, ``pending`` queued jobs from ``tenants`` tenants (skewed), and the shipped AWS catalog."""
    rng = random.Random(seed)
    names = [f"team-{i:04d}" for i in range(max(1, tenants))]
    hosts: list[Host] = []
    running: list[RunningJob] = []
    n_running = 0
    for i in range(nodes):
        model = MODELS[(i // 250) % len(MODELS)]
        pool = f"pool-{i // 250:03d}"
        hid = f"h{i:06d}"
        busy = 0
        target = sum(1 for _ in range(8) if rng.random() < busy_fraction)
        cpu_used = mem_used = 0.0
        while busy < target:
            g = min(target - busy, rng.choice((1, 1, 2, 4, 8)))
            owner = names[min(len(names) - 1, int(rng.paretovariate(1.2)) - 1)]
            started = NOW - rng.uniform(60, 3 * 86400)
            running.append(
                RunningJob(
                    job_id=f"r{n_running:07d}",
                    tenant=owner,
                    gpu_type=model,
                    gpus=g,
                    started_at=started,
                    site=Site.ONPREM,
                    hosts=((hid, g),),
                    cpu=4.0 * g,
                    memory_gib=32.0 * g,
                    priority=rng.choice((Priority.LOW, Priority.NORMAL, Priority.NORMAL, Priority.HIGH)),
                    borrowed=rng.random() < 0.3,
                    checkpointing=rng.random() < 0.7,
                    checkpoint_interval_s=1800.0,
                    family=rng.choice(FAMILIES),
                    timeout_s=10 * 86400.0,
                )
            )
            n_running += 1
            busy += g
            cpu_used += 4.0 * g
            mem_used += 32.0 * g
        hosts.append(
            Host(
                hid,
                pool,
                model,
                8,
                8 - busy,
                96.0,
                96.0 - cpu_used,
                1024.0,
                1024.0 - mem_used,
                healthy=rng.random() > 0.01,
            )
        )
    jobs: list[PendingJob] = []
    for i in range(pending):
        gpus, nodes_n = rng.choice(SHAPES)
        tenant = names[min(len(names) - 1, int(rng.paretovariate(1.2)) - 1)]
        r = rng.random()
        placement = (
            PlacementConstraint.ONPREM
            if r < 0.1
            else PlacementConstraint.CLOUD
            if r < 0.15
            else PlacementConstraint.AUTO
        )
        regions: tuple[str, ...] = ("us-east-1",) if rng.random() < 0.1 else ()
        expected = rng.choice((1800.0, 4 * 3600.0, 86400.0, 5 * 86400.0))
        jobs.append(
            PendingJob(
                job_id=f"p{i:07d}",
                tenant=tenant,
                gpu_type=rng.choice(MODELS),
                gpus=gpus,
                nodes=nodes_n,
                submitted_at=NOW - rng.uniform(0, 2 * 86400),
                cpu=4.0 * gpus / nodes_n,
                memory_gib=32.0 * gpus / nodes_n,
                placement=placement,
                regions=regions,
                spot=rng.choice(
                    (SpotPolicy.ALLOWED, SpotPolicy.ALLOWED, SpotPolicy.NEVER, SpotPolicy.REQUIRED)
                )
                if placement is not PlacementConstraint.ONPREM
                else SpotPolicy.NEVER,
                priority=rng.choice((Priority.LOW, Priority.NORMAL, Priority.NORMAL, Priority.HIGH)),
                max_hourly_usd=rng.choice((None, None, 50.0, 200.0)),
                expected_duration_s=expected if rng.random() < 0.5 else None,
                timeout_s=7 * 86400.0,
                checkpointing=rng.random() < 0.7,
                family=rng.choice(FAMILIES),
            )
        )
    tstates = {}
    for i, name in enumerate(names):
        tstates[name] = TenantState(
            name=name,
            weight=1.0 + (i % 3),
            guaranteed_gpus={m: 8 for m in MODELS} if i % 5 == 0 else {},
            default_borrow_limit=None if i % 7 else 64,
            monthly_budget_usd=None if i % 4 else 50_000.0,
            cloud_spend_month_usd=rng.uniform(0, 40_000),
        )
    offers = load_offers()
    instances, cloud_running = _shared_instances(rng, offers, names, max(1, nodes // 20))
    return Snapshot(
        pending=tuple(jobs),
        running=(*running, *cloud_running),
        hosts=tuple(hosts),
        offers=offers,
        tenants=tstates,
        instances=instances,
        runtimes=_history(rng, names),
    )


def _history(rng: random.Random, names: list[str]) -> RuntimePredictor:
    """What the service has learnt: a dozen finished jobs per tenant, with estimates half the time."""
    p = RuntimePredictor()
    for name in names:
        bias = rng.lognormvariate(0.0, 0.5)
        for _ in range(12):
            actual = rng.lognormvariate(9.0, 1.5)
            est = actual / bias * rng.lognormvariate(0.0, 0.5) if rng.random() < 0.5 else None
            p.observe(name, rng.choice(FAMILIES), rng.choice(MODELS), rng.choice((1, 2, 4, 8)), actual, est)
    return p


def _shared_instances(
    rng: random.Random, offers: tuple[CloudOffer, ...], names: list[str], n: int
) -> tuple[tuple[CloudInstance, ...], list[RunningJob]]:
    """``n`` running multi-GPU cloud instances, each with one job on part of it."""
    multi = [o for o in offers if o.gpus >= 4 and o.spot_usd_h is not None]
    instances = []
    running = []
    for i in range(n):
        o = rng.choice(multi)
        used = rng.randint(1, o.gpus - 1)
        iid = f"i{i:06d}"
        price = o.spot_usd_h or o.on_demand_usd_h
        instances.append(
            CloudInstance(
                iid, o.region, o.zone, o.instance_type, o.gpu_type, True, o.gpus, o.vcpus, o.memory_gib,
                price, o.gpus - used, o.vcpus - 4.0 * used, o.memory_gib - 32.0 * used, NOW - 600.0,
            )
        )  # fmt: skip
        running.append(
            RunningJob(
                f"c{i:07d}", rng.choice(names), o.gpu_type, used, NOW - rng.uniform(600, 86400),
                Site.CLOUD, region=o.region, instance_type=o.instance_type, spot=True,
                hourly_usd=price * used / o.gpus, cpu=4.0 * used, memory_gib=32.0 * used, checkpointing=True,
                checkpoint_interval_s=1800.0, family=rng.choice(FAMILIES), instance_id=iid,
            )
        )  # fmt: skip
    return tuple(instances), running
