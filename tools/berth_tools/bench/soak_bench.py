"""Memory of a local cloud that has run jobs, over a long idle window (a benchmark, not a test).

    python -m berth_tools.bench.soak_bench [--jobs 1000] [--idle-minutes 60] [--sample-s 60]
        [--agents 4] [-- extra `local up` args]

Starts `berth local up --state-dir <fresh temp dir>` (as `idle_bench` does), runs `berth bench e2e -n
JOBS` against it (one-GPU `sleep 1` jobs on the process agents, through the whole control plane), then
samples the resident memory (VmRSS, from /proc) of the local cloud's process and of its whole process
tree (the Lambda sandboxes and agents included) every SAMPLE_S seconds for IDLE_MINUTES, with the load
average beside each sample. Prints one JSON object: the e2e run's summary, the samples, and the growth
over the idle window (first sample to last, and per hour by a least-squares fit), then stops the local
cloud with SIGINT and reports how long that took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from berth_tools.bench.idle_bench import start_local_cloud, stop_local_cloud
from berth_tools.localcloud.process_tree import descendants
from berth_tools.localcloud.state_dir import parse_exports


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour (0 with fewer than two points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600


def run_jobs(state: Path, jobs: int) -> dict[str, Any]:
    env = {**os.environ, **parse_exports((state / "env").read_text()), "AWS_PROFILE": "alice"}
    berth = Path(sys.executable).with_name("berth")
    cmd = [str(berth), "bench", "e2e", "-n", str(jobs), "-c", "8", "--timeout", "3600", "--output", "json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"berth bench e2e exited {done.returncode}: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    keep = ("jobs", "completed", "lost", "attempts_mean", "submit_to_running_p50_s", "wall_s")
    return {k: report.get(k) for k in keep}


def measure(jobs: int, idle_minutes: float, sample_s: float, agents: int, extra: list[str]) -> dict[str, Any]:
    process, state, cmd, ready_s = start_local_cloud(agents, extra)
    try:
        e2e = run_jobs(state, jobs) if jobs else None
        samples: list[dict[str, Any]] = []
        t0 = time.monotonic()
        end = t0 + idle_minutes * 60
        while True:
            tree = [process.pid, *descendants(process.pid)]
            samples.append(
                {
                    "t_s": round(time.monotonic() - t0, 1),
                    "local_cloud_rss_mib": round(rss_kib(process.pid) / 1024, 1),
                    "tree_rss_mib": round(sum(rss_kib(p) for p in tree) / 1024, 1),
                    "processes": len(tree),
                    "load_avg": [round(x, 2) for x in os.getloadavg()],
                }
            )
            if time.monotonic() >= end:
                break
            time.sleep(min(sample_s, max(0.0, end - time.monotonic())))
    finally:
        stop_s, left = stop_local_cloud(process)
    first, last = samples[0], samples[-1]
    return {
        "command": " ".join(cmd),
        "ready_s": round(ready_s, 1),
        "e2e": e2e,
        "idle_minutes": idle_minutes,
        "local_cloud_rss_mib_first_last": [first["local_cloud_rss_mib"], last["local_cloud_rss_mib"]],
        "tree_rss_mib_first_last": [first["tree_rss_mib"], last["tree_rss_mib"]],
        "local_cloud_rss_mib_per_hour_fit": round(
            slope_per_hour([(s["t_s"], s["local_cloud_rss_mib"]) for s in samples]), 2
        ),
        "tree_rss_mib_per_hour_fit": round(
            slope_per_hour([(s["t_s"], s["tree_rss_mib"]) for s in samples]), 2
        ),
        "samples": samples,
        "sigint_to_gone_s": round(stop_s, 2),
        "left_behind": left,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--idle-minutes", type=float, default=60.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--agents", type=int, default=4)
    args, extra = parser.parse_known_args(argv)
    report = measure(
        args.jobs, args.idle_minutes, args.sample_s, args.agents, [a for a in extra if a != "--"]
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
