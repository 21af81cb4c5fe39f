"""Run a simulation end to end: load, replay, summarise."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from berth.scheduler.policy import SchedulingPolicy
from berth_tools.sim.cluster import ClusterSpec, load_cluster
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
) -> dict[str, Any]:
    """Replay ``trace``. ``estimates``: what the scheduler knows of run times (``predictor``, the
    service's view, by default; ``oracle`` is the labelled upper bound); ``estimate_noise``: the
    lognormal sigma of simulated user estimates (None: users give none)."""
    started = time.perf_counter()
    state = Simulator(trace, cluster, policy, estimates, estimate_noise).run()
    result = summarise(trace, cluster, policy, state, str(estimates), estimate_noise)
    result["sim_wall_s"] = round(time.perf_counter() - started, 2)
    return result


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
