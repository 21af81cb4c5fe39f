"""Generate a large, realistic scheduling snapshot, deterministically from a seed."""

from __future__ import annotations

import random

from berth.domain.job_spec import PlacementConstraint, Priority, SpotPolicy
from berth.domain.placement import Site
from berth.pricing.catalog import load_offers
from berth.scheduler.snapshot import Host, PendingJob, RunningJob, Snapshot, TenantState

MODELS = ("H100", "A100", "V100", "L4")
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
                    expected_end_at=started + rng.uniform(3600, 10 * 86400),
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
                expected_duration_s=expected,
                checkpointing=rng.random() < 0.7,
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
    return Snapshot(
        pending=tuple(jobs), running=tuple(running), hosts=tuple(hosts), offers=load_offers(), tenants=tstates
    )
