"""Run a simulation end to end: load, replay, summarise."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from berth.scheduler.policy import SchedulingPolicy
from berth_tools.sim.cluster import ClusterSpec, load_cluster
from berth_tools.sim.data import DataModel
from berth_tools.sim.engine import Simulator
from berth_tools.sim.estimates import EstimateMode
from berth_tools.sim.metrics import summarise
from berth_tools.sim.policies import resolve_policy
from berth_tools.sim.trace import TraceJob, load_trace


def simulate(
    trace: list[TraceJob],
    cluster: ClusterSpec,
    policy: SchedulingPolicy,
    estimates: EstimateMode = EstimateMode.PREDICTOR,
    estimate_noise: float | None = None,
    data_locality: bool = False,
) -> dict[str, Any]:
    """Replay ``trace``. ``estimates``: what the scheduler knows of run times (``predictor``, the
    service's view, by default; ``oracle`` is the labelled upper bound); ``estimate_noise``: the
    lognormal sigma of simulated user estimates (None: users give none). ``data_locality``: model
    datasets and host caches (``sim/data.py``) and replay twice, with the policy's data locality on
    and off, adding ``data_locality: {with, without, bytes_saved, ...}`` to the result."""
    started = time.perf_counter()
    data = DataModel(cluster.data, trace) if data_locality else None
    mode = "prefer" if policy.data_locality == "off" else policy.data_locality
    on = policy.model_copy(update={"data_locality": mode}) if data_locality else policy
    state = Simulator(trace, cluster, on, estimates, estimate_noise, data).run()
    result = summarise(trace, cluster, policy, state, str(estimates), estimate_noise)
    if data is not None:
        off_data = DataModel(cluster.data, trace)
        off = policy.model_copy(update={"data_locality": "off"})
        off_state = Simulator(trace, cluster, off, estimates, estimate_noise, off_data).run()
        without = {**off_data.summary(), **_waits(summarise(trace, cluster, off, off_state, str(estimates)))}
        with_ = {"mode": mode, **data.summary(), **_waits(result)}
        saved = without["bytes_staged"] - with_["bytes_staged"]
        result["data_locality"] = {
            "with": with_,
            "without": without,
            "bytes_saved": saved,
            "bytes_saved_fraction": round(saved / without["bytes_staged"], 4)
            if without["bytes_staged"]
            else 0.0,
        }
    result["sim_wall_s"] = round(time.perf_counter() - started, 2)
    return result


def _waits(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result[k] for k in ("avg_wait_s", "p95_wait_s", "avg_jct_s", "total_cost_usd")}


def simulate_files(
    trace_path: str | Path,
    cluster_path: str | Path,
    policy: str,
    estimates: EstimateMode = EstimateMode.PREDICTOR,
    estimate_noise: float | None = None,
) -> dict[str, Any]:
    return simulate(
        load_trace(trace_path), load_cluster(cluster_path), resolve_policy(policy), estimates, estimate_noise
    )
