"""Builders for scheduler tests."""

from __future__ import annotations

from typing import Any

from berth.scheduler.policy import SchedulingPolicy, load_policy
from berth.scheduler.snapshot import CloudOffer, Host, PendingJob, RunningJob, Snapshot, TenantState

NOW = 100_000.0


def host(
    hid: str,
    pool: str = "p1",
    gpu: str = "V100",
    gpus: int = 8,
    free: int | None = None,
    cpu: float = 64,
    mem: float = 488,
    healthy: bool = True,
) -> Host:
    f = gpus if free is None else free
    used = gpus - f
    return Host(hid, pool, gpu, gpus, f, cpu, cpu - 4 * used, mem, mem - 32 * used, healthy=healthy)


def job(jid: str, tenant: str = "a", gpus: int = 1, **kw: Any) -> PendingJob:
    kw.setdefault("gpu_type", "V100")
    kw.setdefault("submitted_at", NOW - 10)
    kw.setdefault("cpu", 4.0 * gpus / kw.get("nodes", 1))
    kw.setdefault("memory_gib", 32.0 * gpus / kw.get("nodes", 1))
    return PendingJob(job_id=jid, tenant=tenant, gpus=gpus, **kw)


def running(jid: str, tenant: str, hosts: tuple[tuple[str, int], ...], **kw: Any) -> RunningJob:
    gpus = sum(g for _, g in hosts)
    kw.setdefault("gpu_type", "V100")
    kw.setdefault("started_at", NOW - 3600)
    kw.setdefault("cpu", 4.0 * hosts[0][1])
    kw.setdefault("memory_gib", 32.0 * hosts[0][1])
    return RunningJob(
        job_id=jid, tenant=tenant, gpus=gpus, site="onprem", hosts=hosts, nodes=len(hosts), **kw
    )


def offer(
    region: str = "us-east-1",
    zone: str = "use1-az1",
    itype: str = "p3.2xlarge",
    gpu: str = "V100",
    gpus: int = 1,
    od: float = 3.06,
    spot: float | None = 0.9,
) -> CloudOffer:
    return CloudOffer(region, zone, itype, gpu, gpus, 8.0 * gpus, 61.0 * gpus, od, spot)


def snap(
    pending: list[PendingJob] | None = None,
    running_jobs: list[RunningJob] | None = None,
    hosts: list[Host] | None = None,
    offers: list[CloudOffer] | None = None,
    tenants: dict[str, TenantState] | None = None,
    **kw: Any,
) -> Snapshot:
    return Snapshot(
        tuple(pending or ()),
        tuple(running_jobs or ()),
        tuple(hosts or ()),
        tuple(offers or ()),
        tenants or {},
        **kw,
    )


def policy(**kw: Any) -> SchedulingPolicy:
    base: dict[str, Any] = {"burst": {"min_wait_s": 0, "wait_fraction": 0}}
    base.update(kw)
    return load_policy(base)
