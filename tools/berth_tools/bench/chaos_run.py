"""`berth bench chaos` on a fresh local cloud: start it, run the chaos, stop it (Ctrl-C), report."""

from __future__ import annotations

import json
from typing import Any

from berth_tools.bench.chaos_bench import Workload, run_chaos
from berth_tools.bench.idle_bench import start_local_cloud, stop_local_cloud
from berth_tools.cli.fault_cmd import fault_url, send
from berth_tools.localcloud.seed import process_environment
from berth_tools.localcloud.state_dir import parse_exports

#: Real agents with two simulated A100s each (so GPUs are contended), the local Batch for the cloud.
LOCAL_UP_ARGS = ["--agent-kind", "process", "--gpus-per-agent", "2", "--gpu-type", "A100"]


def run_on_fresh_local_cloud(
    *, minutes: float, seed: int, agents: int, workload: Workload, kinds: tuple[str, ...]
) -> dict[str, Any]:
    process, state, cmd, ready_s = start_local_cloud(agents, LOCAL_UP_ARGS)
    try:
        # the local cloud's env (endpoint, profiles) for the run, and the caller's back after it: a
        # process that goes on (a test session) must not keep talking to a local cloud that is gone
        with process_environment(parse_exports((state / "env").read_text())):
            hosts = [str(a["host_id"]) for a in json.loads((state / "agents.json").read_text())]
            url = fault_url(state)
            report = run_chaos(
                state,
                lambda body: send(url, body),
                hosts,
                minutes=minutes,
                seed=seed,
                workload=workload,
                kinds=kinds,
            )
    finally:
        stop_s, left = stop_local_cloud(process)
    report.update(
        command=" ".join(cmd),
        ready_s=round(ready_s, 1),
        ctrl_c_to_gone_s=round(stop_s, 1),
        left_after_ctrl_c=left,
    )
    return report
