"""The utilisation sampler on a fake /proc and a fake NVML, plus one real /proc read."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

from berth_agent.usage import UsageSampler, group_processes


def _proc(root: Path, pid: int, pgid: int, utime: int, stime: int, rss: int, comm: str = "python") -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime vsize rss ...
    fields = ["S", "1", str(pgid), str(pgid), "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime)]
    fields += ["0", "0", "20", "0", "1", "0", "100", "1000", str(rss)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_cpu_rate_and_rss_of_the_group_only(tmp_path: Path) -> None:
    _proc(tmp_path, 10, 10, utime=100, stime=0, rss=1000, comm="train (main) x")
    _proc(tmp_path, 11, 10, utime=50, stime=50, rss=500)
    _proc(tmp_path, 20, 20, utime=9999, stime=0, rss=99999)  # another job
    (tmp_path / "self").mkdir()
    clock = Clock()
    s = UsageSampler(proc_root=tmp_path, clock=clock, wall=lambda: 1.0, ticks_per_s=100, page_size=4096)
    first = s.sample(10, [])
    assert first.processes == 2 and first.rss_bytes == 1500 * 4096 and first.cpu_pct == 0.0
    _proc(tmp_path, 10, 10, utime=300, stime=0, rss=1000)  # +200 ticks = 2 CPU-s over 1 s
    clock.t += 1.0
    assert s.sample(10, []).cpu_pct == 200.0
    assert s.sample(10, []).gpus == ()


def test_gpu_usage_counts_only_the_jobs_processes(tmp_path: Path) -> None:
    _proc(tmp_path, 10, 10, 0, 0, 1)
    mib = 1024 * 1024

    class Err(Exception):
        pass

    nvml: Any = types.SimpleNamespace(
        NVMLError=Err,
        nvmlDeviceGetHandleByUUID=lambda u: u,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=30000 * mib, total=81559 * mib),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=10, usedGpuMemory=20000 * mib),
            types.SimpleNamespace(pid=99, usedGpuMemory=10000 * mib),
        ],
    )
    usage = UsageSampler(nvml=nvml, proc_root=tmp_path).sample(10, ["GPU-a"])
    (gpu,) = usage.gpus
    assert (gpu.utilization_pct, gpu.memory_used_mib, gpu.job_memory_mib) == (87.0, 30000, 20000)
    assert usage.as_dict()["gpus"][0]["uuid"] == "GPU-a"


def test_real_proc_sees_this_process_group() -> None:
    procs = group_processes(os.getpgrp())
    assert os.getpid() in {p.pid for p in procs}
