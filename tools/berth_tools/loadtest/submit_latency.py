"""`berth bench api`: N signed submits from C concurrent clients against a running API.

Reports throughput and latency percentiles, checks that no submit was lost or duplicated (every submit
answered 201 with its own job id, and listing the tenant's jobs finds each of them exactly once), and,
against the local cloud, the RSS and CPU time of its process before and after the submits: the
per-submit growth is what `docs/local-cloud.md` bounds.

Each submit carries a fresh `Idempotency-Key`, so the client's retries (429, 5xx, connection errors)
never make a second job. The loop is bounded: exactly N submits, then (unless `keep`) N cancels.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import os
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from berth_tools.client import BerthClient, ClientError, every_job

SPEC: dict[str, Any] = {
    "name": "latency-probe",
    "image": "busybox",
    "command": ["true"],
    "resources": {"gpu_type": "V100", "gpus": 1},
}
#: Where the local cloud's front door answers with its process id (outside any stage; 127.0.0.1 only).
LOCAL_STATS_PATH = "/_local/stats"


@dataclass(frozen=True)
class ProcessSample:
    """Resident memory and CPU time of a process and its descendants (Linux /proc)."""

    pid: int
    rss_bytes: int
    cpu_s: float


@dataclass
class LatencyReport:
    requests: int
    concurrency: int
    ok: int
    failed: int
    lost: int | None
    duplicated: int | None
    submits_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    total_s: float
    errors: dict[str, int] = field(default_factory=dict)
    local_cloud_pid: int | None = None
    rss_before_mib: float | None = None
    rss_after_mib: float | None = None
    rss_growth_per_submit_kib: float | None = None
    server_cpu_ms_per_submit: float | None = None


def percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_ms), math.ceil(q / 100 * len(sorted_ms))))
    return sorted_ms[rank - 1]


# -- the local cloud's process ------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
    return found


def sample_process(pid: int) -> ProcessSample | None:
    """RSS (VmRSS) and user+system CPU time of `pid` and its descendants; None where /proc is unreadable."""
    rss = 0
    cpu = 0.0
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        for member in _descendants(pid):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None
    return ProcessSample(pid=pid, rss_bytes=rss, cpu_s=cpu)


def local_cloud_pid(api_url: str, timeout_s: float = 5.0) -> int | None:
    """The pid of the local cloud serving `api_url` (its front door says), or None for any other API."""
    parts = urllib.parse.urlsplit(api_url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    url = f"{parts.scheme}://{parts.netloc}{LOCAL_STATS_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            pid = json.loads(response.read()).get("pid")
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return pid if isinstance(pid, int) else None


# -- the load ----------------------------------------------------------------------------------------
def measure(
    client_factory: Callable[[], BerthClient],
    requests: int,
    concurrency: int = 1,
    cancel_after: bool = True,
    pid: int | None = None,
    warmup: int = 0,
    list_tenant_jobs: bool = True,
) -> LatencyReport:
    """`requests` submits spread over `concurrency` clients (one per thread), then checks and cleans up.

    `warmup` submits go first and are not counted (imports and caches of a fresh server); `pid` is the
    server's process whose RSS/CPU is sampled around the counted submits.
    """
    run = uuid.uuid4().hex[:8]
    local = threading.local()

    def client() -> BerthClient:
        if not hasattr(local, "client"):
            local.client = client_factory()
        c: BerthClient = local.client
        return c

    def submit(i: int) -> tuple[float, str | None, str | None]:
        spec = {**SPEC, "name": f"bench-{run}-{i}"}
        t0 = time.perf_counter()
        try:
            job = client().submit(spec, idempotency_key=str(uuid.uuid4()))
        except ClientError as exc:
            return (time.perf_counter() - t0) * 1000, None, f"{exc.status} {exc.code}"
        return (time.perf_counter() - t0) * 1000, str(job["id"]), None

    workers = max(1, min(concurrency, requests))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench") as pool:
        warm_ids = [r[1] for r in pool.map(submit, range(-warmup, 0)) if r[1] is not None]
        before = sample_process(pid) if pid is not None else None
        t_start = time.perf_counter()
        results = list(pool.map(submit, range(requests)))
        total = time.perf_counter() - t_start
        after = sample_process(pid) if pid is not None else None

        ids = [job_id for _, job_id, _ in results if job_id is not None]
        errors: dict[str, int] = {}
        for _, _, error in results:
            if error is not None:
                errors[error] = errors.get(error, 0) + 1
        lost = duplicated = None
        if list_tenant_jobs:
            listed = _listed_names(client(), f"bench-{run}-")
            expected = {f"bench-{run}-{i}" for i in range(requests)}
            lost = len(expected - set(listed))
            duplicated = len(listed) - len(set(listed))
        if cancel_after:  # leave the tenant's active-job counter as it was
            list(pool.map(lambda job_id: _cancel(client(), job_id), ids + warm_ids))

    samples = sorted(ms for ms, _, _ in results)
    report = LatencyReport(
        requests=requests,
        concurrency=workers,
        ok=len(ids),
        failed=requests - len(ids),
        lost=lost,
        duplicated=None if duplicated is None else duplicated + (len(ids) - len(set(ids))),
        submits_per_s=round(len(ids) / total, 2) if total > 0 else 0.0,
        p50_ms=round(percentile(samples, 50), 1),
        p90_ms=round(percentile(samples, 90), 1),
        p99_ms=round(percentile(samples, 99), 1),
        max_ms=round(samples[-1], 1),
        mean_ms=round(statistics.fmean(samples), 1),
        total_s=round(total, 2),
        errors=errors,
        local_cloud_pid=pid,
    )
    if before is not None and after is not None:
        report.rss_before_mib = round(before.rss_bytes / 2**20, 1)
        report.rss_after_mib = round(after.rss_bytes / 2**20, 1)
        report.rss_growth_per_submit_kib = round((after.rss_bytes - before.rss_bytes) / 1024 / requests, 1)
        report.server_cpu_ms_per_submit = round((after.cpu_s - before.cpu_s) * 1000 / requests, 1)
    return report


def _listed_names(client: BerthClient, prefix: str) -> list[str]:
    """Names of the caller's jobs starting with `prefix`, one entry per listed job (duplicates kept)."""
    names = (str(job.get("spec", {}).get("name", "")) for job in every_job(client))
    return [name for name in names if name.startswith(prefix)]


def _cancel(client: BerthClient, job_id: str) -> None:
    with contextlib.suppress(ClientError):  # already finished or canceled: nothing to give back
        client.cancel(job_id)


def as_dict(report: LatencyReport) -> dict[str, Any]:
    return asdict(report)
