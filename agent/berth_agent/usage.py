"""Per-job utilisation: GPU use through NVML, CPU and resident memory of the job's process group.

``UsageSampler.sample(pgid, gpu_uuids)`` returns a ``JobUsage`` for one job: per GPU the device's
utilisation and memory, and the memory its processes hold on it (NVML's running compute
processes filtered to the job's pids); for the group, CPU % since the previous sample (from
``/proc/<pid>/stat`` utime+stime) and summed RSS. No psutil: ``/proc`` is parsed directly and its
root is injectable for tests. Without NVML (simulated GPUs) the GPU part is empty.

A GPU belongs to one job at a time, so the device's utilisation and memory are the job's. For a
job in a container the process group is the runtime CLI's (``docker run``), not the container's
processes: CPU/RSS and per-process GPU memory then cover the CLI only (container stats are the
runtime's business; not sampled here).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class GpuUsage:
    uuid: str
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    job_memory_mib: int


@dataclass(frozen=True, slots=True)
class JobUsage:
    at: float
    processes: int
    cpu_pct: float
    rss_bytes: int
    gpus: tuple[GpuUsage, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "processes": self.processes,
            "cpu_pct": round(self.cpu_pct, 1),
            "rss_bytes": self.rss_bytes,
            "gpus": [
                {
                    "uuid": g.uuid,
                    "utilization_pct": g.utilization_pct,
                    "memory_used_mib": g.memory_used_mib,
                    "memory_total_mib": g.memory_total_mib,
                    "job_memory_mib": g.job_memory_mib,
                }
                for g in self.gpus
            ],
        }


@dataclass(frozen=True, slots=True)
class _ProcStat:
    pid: int
    pgid: int
    cpu_ticks: int
    rss_pages: int


def _read_stat(path: Path) -> _ProcStat | None:
    try:
        raw = path.read_text()
    except OSError:  # the process ended between listing and reading
        return None
    # comm is in parentheses and may hold spaces or ')': split at the last ')'.
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    if not head or len(fields) < 22:
        return None
    # fields[0] is state (field 3); pgrp is field 5, utime 14, stime 15, rss 24 (1-based, man 5 proc).
    return _ProcStat(
        pid=int(head.split("(", 1)[0]),
        pgid=int(fields[2]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        rss_pages=int(fields[21]),
    )


def group_processes(pgid: int, proc_root: Path = Path("/proc")) -> list[_ProcStat]:
    out = []
    for entry in proc_root.iterdir():
        if entry.name.isdigit():
            st = _read_stat(entry / "stat")
            if st is not None and st.pgid == pgid:
                out.append(st)
    return out


@dataclass
class UsageSampler:
    """Samples jobs by process group; keeps the previous CPU reading per group for the rate."""

    nvml: Any = None  # an initialised pynvml-like module, or None
    proc_root: Path = Path("/proc")
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    ticks_per_s: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))
    page_size: int = field(default_factory=lambda: os.sysconf("SC_PAGE_SIZE"))
    _last: dict[int, tuple[float, int]] = field(default_factory=dict)

    def forget(self, pgid: int) -> None:
        self._last.pop(pgid, None)

    def sample(self, pgid: int, gpu_uuids: list[str]) -> JobUsage:
        procs = group_processes(pgid, self.proc_root)
        now = self.clock()
        ticks = sum(p.cpu_ticks for p in procs)
        prev = self._last.get(pgid)
        self._last[pgid] = (now, ticks)
        cpu_pct = 0.0
        if prev is not None and now > prev[0]:
            cpu_pct = max(0.0, (ticks - prev[1]) / self.ticks_per_s / (now - prev[0]) * 100.0)
        pids = {p.pid for p in procs}
        return JobUsage(
            at=self.wall(),
            processes=len(procs),
            cpu_pct=cpu_pct,
            rss_bytes=sum(p.rss_pages for p in procs) * self.page_size,
            gpus=tuple(self._gpu(uuid, pids) for uuid in gpu_uuids) if self.nvml is not None else (),
        )

    def _gpu(self, uuid: str, pids: set[int]) -> GpuUsage:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError:
            running = []
        job_bytes = sum(int(p.usedGpuMemory or 0) for p in running if p.pid in pids)
        mib = 1024 * 1024
        return GpuUsage(
            uuid=uuid,
            utilization_pct=float(util.gpu),
            memory_used_mib=int(mem.used) // mib,
            memory_total_mib=int(mem.total) // mib,
            job_memory_mib=job_bytes // mib,
        )
