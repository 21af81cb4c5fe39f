"""On-prem gang placement with best-fit bin packing.

Hosts are indexed by (pool, GPU model) and, within that, bucketed by free GPUs, so a fit is
found by looking at the smallest bucket that can hold the job (best fit) instead of scanning
the fleet. Best fit keeps whole free hosts intact for 8-GPU and multi-node jobs. A multi-node
job takes ``nodes`` hosts of one pool, each with ``gpus_per_node`` free GPUs, or nothing.

Data locality: ``find(..., prefer=hosts)`` takes the hosts that hold the job's data first among
those with room now (``ties_only``: only among hosts of the same fit). It never makes a job wait for
a busy caching host.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from berth.scheduler.snapshot import Host

# How many hosts of one bucket are tried for CPU/memory before moving to the next bucket.
_SCAN_LIMIT = 256


class _Group:
    __slots__ = ("buckets", "pool", "size")

    def __init__(self, pool: str, size: int) -> None:
        self.pool = pool
        self.size = size
        self.buckets: list[dict[str, None]] = [{} for _ in range(size + 1)]


class OnPremIndex:
    """Mutable free-capacity view of the healthy hosts of a snapshot, for one pass."""

    __slots__ = (
        "_groups",
        "_pools_by_model",
        "capacity",
        "free_cpu",
        "free_gpus",
        "free_mem",
        "free_total",
        "group_of",
        "holders",
        "hosts",
    )

    def __init__(self, hosts: Iterable[Host]) -> None:
        self.hosts: dict[str, Host] = {}
        self.free_gpus: dict[str, int] = {}
        self.free_cpu: dict[str, float] = {}
        self.free_mem: dict[str, float] = {}
        self.group_of: dict[str, _Group] = {}
        self.capacity: dict[str, float] = {"cpu": 0.0, "memory": 0.0}
        self.free_total: dict[str, int] = {}
        self._groups: dict[tuple[str, str], _Group] = {}
        self._pools_by_model: dict[str, list[str]] = {}
        self.holders: dict[str, list[str]] = {}
        """Data source -> healthy hosts whose cache holds it (data locality)."""
        sizes: dict[tuple[str, str], int] = {}
        healthy = [h for h in hosts if h.healthy]
        for h in healthy:
            key = (h.pool, h.gpu_type)
            sizes[key] = max(sizes.get(key, 0), h.gpus)
        for (pool, model), size in sorted(sizes.items()):
            self._groups[(pool, model)] = _Group(pool, size)
            self._pools_by_model.setdefault(model, []).append(pool)
        for h in healthy:
            free = max(0, min(h.free_gpus, h.gpus))
            group = self._groups[(h.pool, h.gpu_type)]
            self.hosts[h.host_id] = h
            self.free_gpus[h.host_id] = free
            self.free_cpu[h.host_id] = max(0.0, min(h.free_cpu, h.cpu))
            self.free_mem[h.host_id] = max(0.0, min(h.free_memory_gib, h.memory_gib))
            self.group_of[h.host_id] = group
            group.buckets[free][h.host_id] = None
            gkey = "gpu:" + h.gpu_type
            self.capacity[gkey] = self.capacity.get(gkey, 0.0) + h.gpus
            self.capacity["cpu"] += h.cpu
            self.capacity["memory"] += h.memory_gib
            self.free_total[h.gpu_type] = self.free_total.get(h.gpu_type, 0) + free
            for source in h.cached_datasets:
                self.holders.setdefault(source, []).append(h.host_id)

    def holding(self, datasets: Iterable[str]) -> tuple[str, ...]:
        """The healthy hosts whose cache holds any of ``datasets`` (sorted, no repeats)."""
        if not self.holders:
            return ()
        found = {hid for d in datasets for hid in self.holders.get(d, ())}
        return tuple(sorted(found))

    def _room(self, hid: str, gpus: int, cpu: float, memory_gib: float) -> bool:
        return self.free_gpus[hid] >= gpus and self.free_cpu[hid] >= cpu and self.free_mem[hid] >= memory_gib

    @property
    def pools_by_model(self) -> dict[str, list[str]]:
        return self._pools_by_model

    def pools(self, gpu_type: str) -> list[str]:
        return self._pools_by_model.get(gpu_type, [])

    def group_hosts(self, pool: str, gpu_type: str) -> list[str]:
        """Every host of one (pool, model), whatever its free GPUs."""
        group = self._groups.get((pool, gpu_type))
        if group is None:
            return []
        return [hid for bucket in group.buckets for hid in bucket]

    def largest_block(self, gpu_type: str, pool: str | None = None) -> int:
        """The most free GPUs on one host of this model (and pool)."""
        best = 0
        for p in self.pools(gpu_type):
            if pool is not None and p != pool:
                continue
            group = self._groups[(p, gpu_type)]
            for b in range(group.size, best, -1):
                if group.buckets[b]:
                    best = b
                    break
        return best

    def find(
        self,
        gpu_types: Iterable[str],
        gpus_per_node: int,
        nodes: int,
        cpu: float,
        memory_gib: float,
        pools: Collection[str] | None = None,
        avoid: Collection[str] = (),
        prefer: Collection[str] = (),
        ties_only: bool = False,
    ) -> tuple[str, str, tuple[str, ...]] | None:
        """Best fit: (pool, model, host ids) for ``nodes`` hosts with room, or None.

        Models are tried in the given order of preference; within a model the pool whose
        chosen hosts have the least free GPUs wins (tightest fit). ``prefer``: hosts that hold the
        job's data, taken first among those with room (tightest first), the rest of a gang by best
        fit, and the pool with more of them wins; with ``ties_only`` they only break best fit's
        ties (same free GPUs; between pools of equal fit, more of them wins)."""
        need_total = gpus_per_node * nodes
        for model in gpu_types:
            if self.free_total.get(model, 0) < need_total:
                continue
            best: tuple[int, int, str, tuple[str, ...]] | None = None
            for pool in self._pools_by_model.get(model, ()):
                if pools is not None and pool not in pools:
                    continue
                group = self._groups[(pool, model)]
                if group.size < gpus_per_node:
                    continue
                first = self._local(group, prefer, gpus_per_node, cpu, memory_gib, avoid)
                chosen: list[str] = []
                slack = local = 0
                if not ties_only:  # the caching hosts with room first, whatever their fit
                    for b in sorted(first):
                        for hid in first[b][: nodes - len(chosen)]:
                            chosen.append(hid)
                            slack += b - gpus_per_node
                            local += 1
                taken = set(chosen)
                for b in range(gpus_per_node, group.size + 1):
                    if len(chosen) == nodes:
                        break
                    bucket = group.buckets[b]
                    if not bucket:
                        continue
                    mine = first.get(b, ()) if ties_only else ()
                    for hid in mine:
                        chosen.append(hid)
                        taken.add(hid)
                        slack += b - gpus_per_node
                        local += 1
                        if len(chosen) == nodes:
                            break
                    if len(chosen) == nodes:
                        break
                    tried = 0
                    for hid in bucket:
                        tried += 1
                        if tried > _SCAN_LIMIT:
                            break
                        if self.free_cpu[hid] < cpu or self.free_mem[hid] < memory_gib or hid in avoid:
                            continue
                        if hid in taken:
                            continue
                        chosen.append(hid)
                        slack += b - gpus_per_node
                        if len(chosen) == nodes:
                            break
                    if len(chosen) == nodes:
                        break
                rank = (slack, -local) if ties_only else (-local, slack)
                if len(chosen) == nodes and (best is None or rank < (best[0], best[1])):
                    best = (*rank, pool, tuple(chosen))
                    if slack == 0 and (not prefer or local == nodes):
                        break
            if best is not None:
                return best[2], model, best[3]
        return None

    def _local(
        self,
        group: _Group,
        prefer: Collection[str],
        gpus_per_node: int,
        cpu: float,
        memory_gib: float,
        avoid: Collection[str],
    ) -> dict[int, list[str]]:
        """The preferred hosts of ``group`` with room now, by free GPUs."""
        out: dict[int, list[str]] = {}
        for hid in sorted(prefer):
            if (
                self.group_of.get(hid) is group
                and hid not in avoid
                and self._room(hid, gpus_per_node, cpu, memory_gib)
            ):
                out.setdefault(self.free_gpus[hid], []).append(hid)
        return out

    def _move(self, hid: str, new_free: int) -> None:
        group = self.group_of[hid]
        old = self.free_gpus[hid]
        del group.buckets[old][hid]
        group.buckets[new_free][hid] = None
        self.free_gpus[hid] = new_free
        model = self.hosts[hid].gpu_type
        self.free_total[model] += new_free - old

    def allocate(self, host_ids: Iterable[str], gpus_per_node: int, cpu: float, memory_gib: float) -> None:
        for hid in host_ids:
            free = self.free_gpus[hid]
            if free < gpus_per_node:
                raise ValueError(f"host {hid} has {free} free GPUs, cannot give {gpus_per_node}")
            self._move(hid, free - gpus_per_node)
            self.free_cpu[hid] -= cpu
            self.free_mem[hid] -= memory_gib

    def release(self, hosts: Iterable[tuple[str, int]], cpu: float, memory_gib: float) -> None:
        for hid, gpus in hosts:
            if hid not in self.hosts:
                continue
            h = self.hosts[hid]
            self._move(hid, min(h.gpus, self.free_gpus[hid] + gpus))
            self.free_cpu[hid] = min(h.cpu, self.free_cpu[hid] + cpu)
            self.free_mem[hid] = min(h.memory_gib, self.free_mem[hid] + memory_gib)
