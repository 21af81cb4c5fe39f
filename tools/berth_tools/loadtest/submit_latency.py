"""Submit latency over HTTP: N sequential signed submits against a running API, percentiles out."""

from __future__ import annotations

import math
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from berth_tools.client import BerthClient

SPEC: dict[str, Any] = {
    "name": "latency-probe",
    "image": "busybox",
    "command": ["true"],
    "resources": {"gpu_type": "T4", "gpus": 1},
}


@dataclass(frozen=True)
class LatencyReport:
    requests: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    total_s: float


def percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_ms), math.ceil(q / 100 * len(sorted_ms))))
    return sorted_ms[rank - 1]


def measure(client: BerthClient, requests: int, cancel_after: bool = True) -> LatencyReport:
    samples: list[float] = []
    ids: list[str] = []
    t_start = time.perf_counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        job = client.submit(SPEC, idempotency_key=str(uuid.uuid4()))
        samples.append((time.perf_counter() - t0) * 1000)
        ids.append(job["id"])
    total = time.perf_counter() - t_start
    if cancel_after:  # leave the tenant's quota as it was
        for job_id in ids:
            client.cancel(job_id)
    s = sorted(samples)
    return LatencyReport(
        requests=requests,
        p50_ms=round(percentile(s, 50), 1),
        p90_ms=round(percentile(s, 90), 1),
        p99_ms=round(percentile(s, 99), 1),
        max_ms=round(s[-1], 1),
        mean_ms=round(statistics.fmean(s), 1),
        total_s=round(total, 2),
    )


def as_dict(report: LatencyReport) -> dict[str, Any]:
    return asdict(report)
