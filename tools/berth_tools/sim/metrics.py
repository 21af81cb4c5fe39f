"""Summary metrics of a simulation run (the ``berth sim`` output contract)."""

from __future__ import annotations

from typing import Any

from berth.scheduler.policy import SchedulingPolicy
from berth.scheduler.snapshot import CloudOffer
from berth_tools.sim.cluster import ClusterSpec
from berth_tools.sim.estimates import relative_errors
from berth_tools.sim.records import SimState
from berth_tools.sim.trace import TraceJob

MIN_DURATION_FOR_SLOWDOWN_S = 60.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-int(q * len(ordered)) // 100)))
    return ordered[rank - 1]


def jain(values: list[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one gets everything."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def cheapest_usd_per_gpu_hour(offers: tuple[CloudOffer, ...], gpu_type: str, spot_ok: bool) -> float | None:
    best: float | None = None
    for o in offers:
        if o.gpu_type != gpu_type:
            continue
        unit = o.spot_usd_h if (spot_ok and o.spot_usd_h is not None) else o.on_demand_usd_h
        per = unit / o.gpus
        best = per if best is None else min(best, per)
    return best


def cost_lower_bound(trace: list[TraceJob], cluster: ClusterSpec, spot_ok: bool) -> float:
    """GPU-hours that cannot fit on-prem over the trace's arrival span, at the cheapest GPU-hour.

    For each GPU model: max(0, demand - on-prem GPUs x span), priced at the cheapest cloud
    price per GPU-hour of that model (spot where the jobs may use it)."""
    if not trace:
        return 0.0
    span_h = (max(t.submit_s for t in trace) - min(t.submit_s for t in trace)) / 3600.0
    offers = cluster.offers()
    demand: dict[str, float] = {}
    for t in trace:
        demand[t.gpu_type] = demand.get(t.gpu_type, 0.0) + t.gpus * t.duration_s / 3600.0
    total = 0.0
    for model, gpu_h in demand.items():
        cap = sum(p.hosts * p.gpus_per_host for p in cluster.pools if p.gpu_type == model)
        overflow = max(0.0, gpu_h - cap * span_h)
        price = cheapest_usd_per_gpu_hour(offers, model, spot_ok)
        if overflow > 0 and price is not None:
            total += overflow * price
    return total


def summarise(
    trace: list[TraceJob],
    cluster: ClusterSpec,
    policy: SchedulingPolicy,
    state: SimState,
    estimates: str = "predictor",
    estimate_noise: float | None = None,
) -> dict[str, Any]:
    jobs = list(state.jobs.values())
    done = [j for j in jobs if j.end_s is not None]
    waits = [j.first_start_s - j.trace.submit_s for j in jobs if j.first_start_s is not None]
    jcts = [j.end_s - j.trace.submit_s for j in done if j.end_s is not None]
    start = min((t.submit_s for t in trace), default=0.0)
    makespan = max(0.0, state.span_end_s - start)
    onprem_gpu_s = sum(j.onprem_gpu_s for j in jobs)
    util = onprem_gpu_s / (state.onprem_gpus * makespan) if state.onprem_gpus and makespan > 0 else 0.0
    tenants: dict[str, dict[str, Any]] = {}
    slow: dict[str, list[float]] = {}
    for j in jobs:
        row = tenants.setdefault(
            j.trace.tenant,
            {
                "tenant": j.trace.tenant,
                "jobs": 0,
                "_wait": 0.0,
                "_started": 0,
                "onprem_gpu_hours": 0.0,
                "cloud_gpu_hours": 0.0,
                "cost_usd": 0.0,
            },
        )
        row["jobs"] += 1
        if j.first_start_s is not None:
            row["_wait"] += j.first_start_s - j.trace.submit_s
            row["_started"] += 1
        row["onprem_gpu_hours"] += j.onprem_gpu_s / 3600.0
        row["cloud_gpu_hours"] += j.cloud_gpu_s / 3600.0
        row["cost_usd"] += j.cost_usd
        if j.end_s is not None:
            slow.setdefault(j.trace.tenant, []).append(
                (j.end_s - j.trace.submit_s) / max(j.trace.duration_s, MIN_DURATION_FOR_SLOWDOWN_S)
            )
    rows = []
    for name in sorted(tenants):
        row = tenants[name]
        started = row.pop("_started")
        wait = row.pop("_wait")
        row["avg_wait_s"] = round(wait / started, 1) if started else 0.0
        row["onprem_gpu_hours"] = round(row["onprem_gpu_hours"], 1)
        row["cloud_gpu_hours"] = round(row["cloud_gpu_hours"], 1)
        row["cost_usd"] = round(row["cost_usd"], 2)
        rows.append(
            {
                k: row[k]
                for k in ("tenant", "jobs", "avg_wait_s", "onprem_gpu_hours", "cloud_gpu_hours", "cost_usd")
            }
        )
    # Jain over tenants of 1 / mean slowdown (JCT / run time): 1 = every tenant slowed down alike.
    speed = [1.0 / (sum(v) / len(v)) for v in slow.values() if v]
    spot_ok = cluster.jobs.checkpoint_interval_s is not None or policy.spot.use == "always"
    errors = relative_errors(state.predictions)
    return {
        "policy": policy.name,
        "estimates": estimates,
        "estimate_noise": estimate_noise,
        "predictor_error_median": round(percentile(errors, 50), 4),
        "predictor_error_p90": round(percentile(errors, 90), 4),
        "jobs": len(jobs),
        "completed": len(done),
        "avg_wait_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
        "p95_wait_s": round(percentile(waits, 95), 1),
        "avg_jct_s": round(sum(jcts) / len(jcts), 1) if jcts else 0.0,
        "onprem_gpu_utilization": round(util, 4),
        "onprem_gpu_hours": round(onprem_gpu_s / 3600.0, 1),
        "cloud_gpu_hours": round(sum(j.cloud_gpu_s for j in jobs) / 3600.0, 1),
        "total_cost_usd": round(sum(j.cost_usd for j in jobs), 2),
        "cost_lower_bound_usd": round(cost_lower_bound(trace, cluster, spot_ok), 2),
        "jain_fairness": round(jain(speed), 4),
        "preemptions": state.preemptions,
        "spot_interruptions": state.interruptions,
        "repatriations": state.repatriations,
        "passes": state.passes,
        "cloud_instances": state.instances_launched,
        "cloud_idle_slot_usd": round(state.idle_instance_usd, 2),
        "free_slot_starts": state.free_rides,
        "makespan_s": round(makespan, 1),
        "tenants": rows,
    }
