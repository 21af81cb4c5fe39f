"""Choosing preemption victims that lose the least.

A victim is eligible by the caller's rule (reclaim of borrowed capacity, or lower priority
within the tenant). On each candidate host the victims freeing enough room are taken in order
of least loss: shortest run since their last checkpoint, then youngest. Hosts (and, for
multi-node jobs, sets of hosts in one pool) are compared by total lost GPU-seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from berth.scheduler.fits import fits
from berth.scheduler.placement_onprem import OnPremIndex
from berth.scheduler.snapshot import RunningJob


def victim_order(job: RunningJob, now: float) -> tuple[float, float, str]:
    """Least loss first: shortest run since last checkpoint, then youngest (latest start)."""
    return (job.lost_progress_s(now), -job.started_at, job.job_id)


def _host_plan(
    hid: str,
    index: OnPremIndex,
    on_host: list[RunningJob],
    eligible: Callable[[RunningJob], bool],
    gpus: int,
    cpu: float,
    memory_gib: float,
    now: float,
) -> tuple[float, list[RunningJob]] | None:
    free_g = index.free_gpus[hid]
    free_c = index.free_cpu[hid]
    free_m = index.free_mem[hid]
    if fits(free_g, free_c, free_m, gpus, cpu, memory_gib):
        return (0.0, [])
    victims: list[RunningJob] = []
    loss = 0.0
    for v in sorted((v for v in on_host if eligible(v)), key=lambda v: victim_order(v, now)):
        share = sum(g for h, g in v.hosts if h == hid)
        free_g += share
        free_c += v.cpu
        free_m += v.memory_gib
        victims.append(v)
        loss += v.lost_progress_s(now) * v.gpus
        if fits(free_g, free_c, free_m, gpus, cpu, memory_gib):
            return (loss, victims)
    return None


def find_victims(
    index: OnPremIndex,
    running_on_host: Mapping[str, list[RunningJob]],
    eligible: Callable[[RunningJob], bool],
    gpu_types: Iterable[str],
    gpus_per_node: int,
    nodes: int,
    cpu: float,
    memory_gib: float,
    pools: Collection[str] | None,
    max_victims: int,
    now: float,
) -> list[RunningJob] | None:
    """The cheapest set of at most ``max_victims`` jobs whose removal lets the gang fit, or None."""
    best: tuple[float, list[RunningJob]] | None = None
    for model in gpu_types:
        for pool in index.pools(model):
            if pools is not None and pool not in pools:
                continue
            plans: list[tuple[float, str, list[RunningJob]]] = []
            for hid in index.group_hosts(pool, model):
                if index.hosts[hid].gpus < gpus_per_node:
                    continue
                plan = _host_plan(
                    hid, index, running_on_host.get(hid, []), eligible, gpus_per_node, cpu, memory_gib, now
                )
                if plan is not None:
                    plans.append((plan[0], hid, plan[1]))
            if len(plans) < nodes:
                continue
            plans.sort(key=lambda p: (p[0], len(p[2]), p[1]))
            chosen: dict[str, RunningJob] = {}
            loss = 0.0
            for plan_loss, _hid, victims in plans[:nodes]:
                loss += plan_loss
                for v in victims:
                    chosen[v.job_id] = v
            if len(chosen) > max_victims or not chosen:
                continue
            if best is None or loss < best[0]:
                best = (loss, sorted(chosen.values(), key=lambda v: victim_order(v, now)))
        if best is not None:
            return best[1]
    return None
