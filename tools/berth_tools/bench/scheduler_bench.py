"""Time one full scheduling pass on a generated snapshot."""

from __future__ import annotations

import time
from typing import Any

from berth.domain.placement import Site
from berth.scheduler.core import schedule
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.policy import SchedulingPolicy
from berth_tools.bench.snapshot_gen import NOW, generate_snapshot


def bench_scheduler(
    nodes: int, pending: int, tenants: int, policy: SchedulingPolicy, seed: int = 0, repeat: int = 1
) -> dict[str, Any]:
    """``decisions_per_s``: pending jobs decided (placed, or left pending with a reason) per second
    of the pass; ``pass_s``: the best of ``repeat`` passes (snapshot generation not counted)."""
    t0 = time.perf_counter()
    snap = generate_snapshot(nodes, pending, tenants, seed)
    gen_s = time.perf_counter() - t0
    best = float("inf")
    decisions = None
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        decisions = schedule(snap, policy, NOW)
        best = min(best, time.perf_counter() - start)
    assert decisions is not None
    onprem = sum(1 for p in decisions.placements if p.site is Site.ONPREM)
    shared = sum(
        1 for p in decisions.placements if isinstance(p, CloudAssignment) and p.instance_id is not None
    )
    return {
        "nodes": nodes,
        "pending": pending,
        "tenants": tenants,
        "running": len(snap.running),
        "policy": policy.name,
        "pass_s": round(best, 4),
        "decisions": decisions.decided,
        "decisions_per_s": round(decisions.decided / best, 1) if best > 0 else 0.0,
        "placed": len(decisions.placements),
        "placed_onprem": onprem,
        "placed_cloud": len(decisions.placements) - onprem,
        "placed_shared_instances": shared,
        "outcomes": len(decisions.outcomes),
        "preemptions": len(decisions.preemptions),
        "repatriations": len(decisions.repatriations),
        "left_pending": len(decisions.reasons),
        "snapshot_gen_s": round(gen_s, 2),
    }
