"""Idle cost and Ctrl-C time of `berth local up`, measured from outside (a benchmark, not a test).

    python -m berth_tools.bench.idle_bench [--seconds 60] [--agents 4] [-- extra `local up` args]

Starts `berth local up --state-dir <fresh temp dir>`, waits until its `env` file exists (the cloud is
ready), lets it settle, then samples the CPU time (user + system, from /proc) of the local cloud's
process and of each of its descendants over the idle window; then sends SIGINT and polls until no
process of the tree is left. Prints one JSON object: the local cloud's share of a core, the agents'
share (their heartbeats are part of what an idle local cloud costs), the seconds from SIGINT until the
whole tree is gone, what was left behind (if anything), and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from berth_tools.localcloud.process_tree import alive, command_line, descendants

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` itself (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def start_local_cloud(
    agents: int, extra: list[str]
) -> tuple[subprocess.Popen[bytes], Path, list[str], float]:
    """`berth local up` on a fresh temp state dir, in its own session; returns once its `env` file
    exists: (the process, the state dir, the command, seconds until ready)."""
    state = Path(tempfile.mkdtemp(prefix="berth-idle-"))
    berth = Path(sys.executable).with_name("berth")
    cmd = [str(berth), "local", "up", "--state-dir", str(state), "--agents", str(agents), "--quiet", *extra]
    log = (state.parent / f"{state.name}.log").open("w")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    while not (state / "env").exists():
        if process.poll() is not None:
            raise SystemExit(f"berth local up exited {process.returncode}; see {log.name}")
        if time.monotonic() - started > 600:
            process.kill()
            raise SystemExit("berth local up was not ready in 600 s")
        time.sleep(0.2)
    return process, state, cmd, time.monotonic() - started


def stop_local_cloud(process: subprocess.Popen[bytes]) -> tuple[float, list[dict[str, Any]]]:
    """SIGINT to the local cloud alone (as a terminal sends it to the foreground process; its children
    are in its session, not its terminal's group here, so it must stop them itself); polls until its
    whole tree is gone. Returns (seconds, what was left and then killed)."""
    tree = descendants(process.pid)
    t_sig = time.monotonic()
    process.send_signal(signal.SIGINT)
    while alive(tree) and time.monotonic() - t_sig < 120:
        time.sleep(0.05)
    stop_s = time.monotonic() - t_sig
    left = [{"pid": p, "cmd": command_line(p)[:120]} for p in alive(tree)]
    for pid in alive(tree):
        os.kill(pid, signal.SIGKILL)
    process.wait()
    return stop_s, left


def measure(seconds: float, agents: int, settle_s: float, extra: list[str]) -> dict[str, Any]:
    process, _state, cmd, ready_s = start_local_cloud(agents, extra)
    time.sleep(settle_s)
    load_before = os.getloadavg()
    tree = descendants(process.pid)
    before = {pid: cpu_seconds(pid) or 0.0 for pid in tree}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    after = {pid: cpu_seconds(pid) for pid in descendants(process.pid)}
    load_after = os.getloadavg()
    per_process: list[dict[str, Any]] = []
    for pid, end in after.items():
        if end is None:
            continue
        used = end - before.get(pid, 0.0)
        per_process.append({"pid": pid, "cpu_s": round(used, 3), "cmd": command_line(pid)[:120]})
    cloud_s = sum(p["cpu_s"] for p in per_process if p["pid"] == process.pid)
    agent_s = sum(p["cpu_s"] for p in per_process if "berth_agent" in p["cmd"] or "berth-agent" in p["cmd"])
    other_s = sum(p["cpu_s"] for p in per_process) - cloud_s - agent_s
    stop_s, left = stop_local_cloud(process)
    return {
        "command": " ".join(cmd),
        "ready_s": round(ready_s, 1),
        "idle_window_s": round(elapsed, 1),
        "local_cloud_core_fraction": round(cloud_s / elapsed, 4),
        "agents_core_fraction": round(agent_s / elapsed, 4),
        "other_children_core_fraction": round(other_s / elapsed, 4),
        "total_core_fraction": round((cloud_s + agent_s + other_s) / elapsed, 4),
        "processes": per_process,
        "sigint_to_gone_s": round(stop_s, 2),
        "exit_code": process.returncode,
        "left_behind": left,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_after],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after ready before sampling")
    args, extra = parser.parse_known_args(argv)
    print(
        json.dumps(measure(args.seconds, args.agents, args.settle, [a for a in extra if a != "--"]), indent=1)
    )


if __name__ == "__main__":
    main()
