"""Workload traces: CSV ``job_id, submit_s, tenant, gpus, gpu_type, duration_s[, model, estimate_s,
dataset, dataset_gib]``."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class TraceJob:
    job_id: str
    submit_s: float
    tenant: str
    gpus: int
    gpu_type: str
    duration_s: float
    model: str = ""
    estimate_s: float | None = None
    """The user's estimate of the run time, when the trace has one (column ``estimate_s``)."""
    dataset: str = ""
    """The data source it reads (column ``dataset``); absent: ``berth sim --data-locality`` assigns one."""
    dataset_gib: float | None = None


REQUIRED = ("job_id", "submit_s", "tenant", "gpus", "gpu_type", "duration_s")


def parse_trace(text: str) -> list[TraceJob]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"trace lacks columns: {', '.join(missing)}")
    jobs = []
    seen: set[str] = set()
    for n, row in enumerate(reader, start=2):
        try:
            job = TraceJob(
                job_id=row["job_id"],
                submit_s=float(row["submit_s"]),
                tenant=row["tenant"],
                gpus=int(row["gpus"]),
                gpu_type=row["gpu_type"],
                duration_s=float(row["duration_s"]),
                model=row.get("model") or "",
                estimate_s=float(row["estimate_s"]) if row.get("estimate_s") else None,
                dataset=row.get("dataset") or "",
                dataset_gib=float(row["dataset_gib"]) if row.get("dataset_gib") else None,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"trace line {n}: {exc}") from exc
        if job.gpus < 1 or job.duration_s < 0 or job.submit_s < 0:
            raise ValueError(f"trace line {n}: gpus must be >= 1 and times >= 0")
        if job.job_id in seen:
            raise ValueError(f"trace line {n}: duplicate job_id {job.job_id}")
        seen.add(job.job_id)
        jobs.append(job)
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return jobs


def load_trace(path: str | Path) -> list[TraceJob]:
    return parse_trace(Path(path).read_text(encoding="utf-8"))


def split_nodes(gpus: int, max_per_host: int) -> int:
    """Fewest nodes that split ``gpus`` evenly with at most ``max_per_host`` GPUs each."""
    nodes = max(1, -(-gpus // max_per_host))
    while gpus % nodes:
        nodes += 1
    return nodes
