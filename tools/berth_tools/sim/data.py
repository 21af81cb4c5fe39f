"""Training data in the simulator: which dataset each job reads, the hosts' object caches, and the
bytes and time spent staging it (data locality, docs/scheduling.md "Data locality").

The public traces carry no dataset column, so unless a trace has ``dataset`` (and optionally
``dataset_gib``) columns, datasets are assigned synthetically and deterministically: each tenant
owns ``datasets_per_tenant`` datasets, each of a size drawn once from a lognormal (median
``median_gib``, sigma ``size_sigma``); a job reads one of its tenant's datasets chosen by a Zipf law
of exponent ``zipf_s`` (teams retrain on their favourite corpora), seeded per job id, so every policy
sees the same assignment. On-prem, each node of a job stages the whole dataset through its host's
cache (LRU, ``cache_gib`` per host): a hit costs ``hit_s`` (listing and HeadObject calls, hard
links), a miss ``hit_s + size / s3_gbps``. Cloud instances start empty: every cloud node stages in
full. Staging time is reported, not added to run times (the replay's timings stay those of the
trace).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from berth_tools.sim.trace import TraceJob

GIB = 1024**3


class DataSpec(BaseModel):
    """The ``data:`` section of a cluster file (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache_gib: Annotated[float, Field(ge=0)] = 2048.0
    """Each host's object cache (the agent's ``cache_max_bytes``)."""
    s3_gbps: Annotated[float, Field(gt=0)] = 10.0
    """Download bandwidth from S3 to one host, Gbit/s."""
    hit_s: Annotated[float, Field(ge=0)] = 5.0
    """Staging a cached dataset: listing, HeadObject, hard links."""
    datasets_per_tenant: Annotated[int, Field(ge=1)] = 8
    zipf_s: Annotated[float, Field(ge=0)] = 1.1
    median_gib: Annotated[float, Field(gt=0)] = 100.0
    size_sigma: Annotated[float, Field(ge=0)] = 1.0
    seed: int = 0


def _unit(*parts: object) -> float:
    """A deterministic uniform in [0, 1) from its arguments."""
    h = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


@dataclass(slots=True)
class _Cache:
    capacity: float
    used: float = 0.0
    entries: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def stage(self, source: str, size: float) -> bool:
        """Read ``source`` through the cache: True on a hit."""
        if source in self.entries:
            self.entries.move_to_end(source)
            return True
        if size > self.capacity:
            return False
        self.entries[source] = size
        self.used += size
        while self.used > self.capacity:
            _, gone = self.entries.popitem(last=False)
            self.used -= gone
        return False


@dataclass(slots=True)
class _First:
    """The first and second staging of one dataset on-prem (for the second-job ratio)."""

    first_s: float
    second_s: float | None = None
    holder_free: bool = False


class DataModel:
    """Datasets of the trace's jobs and the on-prem hosts' caches during one replay."""

    def __init__(self, spec: DataSpec, trace: list[TraceJob]) -> None:
        self.spec = spec
        self.source: dict[str, str] = {}
        self.size: dict[str, float] = {}
        self.synthetic = not any(t.dataset for t in trace)
        weights = [1.0 / (k + 1) ** spec.zipf_s for k in range(spec.datasets_per_tenant)]
        total = sum(weights)
        cdf = [sum(weights[: k + 1]) / total for k in range(len(weights))]
        for t in trace:
            if t.dataset:
                src = t.dataset
                gib = t.dataset_gib if t.dataset_gib is not None else spec.median_gib
            else:
                u = _unit(spec.seed, "pick", t.job_id)
                k = next(i for i, c in enumerate(cdf) if u <= c)
                src = f"s3://data/{t.tenant}/dataset-{k}/"
                z = random.Random(f"{spec.seed}:{src}").gauss(0.0, 1.0)
                gib = spec.median_gib * math.exp(spec.size_sigma * z)
            self.source[t.job_id] = src
            self.size.setdefault(src, gib * GIB)
        self.caches: dict[str, _Cache] = {}
        self.bytes_onprem = 0.0
        self.bytes_cloud = 0.0
        self.hits = 0
        self.misses = 0
        self.staging_s = 0.0
        self._firsts: dict[str, _First] = {}

    def datasets(self, job_id: str) -> tuple[str, ...]:
        return (self.source[job_id],)

    def cached(self, host_id: str) -> frozenset[str]:
        cache = self.caches.get(host_id)
        return frozenset() if cache is None else frozenset(cache.entries)

    def _time(self, size: float, hit: bool) -> float:
        return self.spec.hit_s + (0.0 if hit else size * 8 / (self.spec.s3_gbps * 1e9))

    def stage_onprem(self, job_id: str, host_ids: list[str], holder_free: bool) -> None:
        """Each node stages the job's dataset through its host's cache. ``holder_free``: some host
        holding the dataset had room for one node of the job when it was placed."""
        src = self.source[job_id]
        size = self.size[src]
        slowest = 0.0
        for hid in host_ids:
            cache = self.caches.setdefault(hid, _Cache(self.spec.cache_gib * GIB))
            hit = cache.stage(src, size)
            self.hits += hit
            self.misses += not hit
            self.bytes_onprem += 0.0 if hit else size
            slowest = max(slowest, self._time(size, hit))
        self.staging_s += slowest
        first = self._firsts.get(src)
        if first is None:
            self._firsts[src] = _First(slowest)
        elif first.second_s is None:
            first.second_s, first.holder_free = slowest, holder_free

    def stage_cloud(self, job_id: str, nodes: int) -> None:
        size = self.size[self.source[job_id]]
        self.bytes_cloud += size * nodes
        self.staging_s += self._time(size, False)

    def summary(self) -> dict[str, Any]:
        pairs = [f for f in self._firsts.values() if f.second_s is not None]
        free = [
            f.second_s / f.first_s
            for f in pairs
            if f.holder_free and f.first_s > 0 and f.second_s is not None
        ]
        free.sort()
        return {
            "datasets": "synthetic" if self.synthetic else "trace",
            "distinct_datasets": len(self.size),
            "bytes_staged_onprem": int(self.bytes_onprem),
            "bytes_staged_cloud": int(self.bytes_cloud),
            "bytes_staged": int(self.bytes_onprem + self.bytes_cloud),
            "cache_hits": self.hits,
            "cache_misses": self.misses,
            "staging_hours": round(self.staging_s / 3600.0, 1),
            "second_job_pairs": len(pairs),
            "second_job_holder_free": len(free),
            "second_job_staging_ratio_p50": round(free[len(free) // 2], 4) if free else None,
            "second_job_staging_ratio_p90": round(free[int(len(free) * 0.9)], 4) if free else None,
        }
