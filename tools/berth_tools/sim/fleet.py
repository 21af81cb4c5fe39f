"""The simulated on-prem fleet: hosts of the cluster file and what is free on each."""

from __future__ import annotations

from berth.scheduler.fits import fits
from berth.scheduler.snapshot import Host
from berth_tools.sim.cluster import ClusterSpec


class OnPremFleet:
    def __init__(self, cluster: ClusterSpec) -> None:
        self.specs: dict[str, Host] = {}
        for pool in cluster.pools:
            for i in range(pool.hosts):
                hid = f"{pool.name}-{i:04d}"
                g, c, m = pool.gpus_per_host, pool.cpu, pool.memory_gib
                self.specs[hid] = Host(hid, pool.name, pool.gpu_type, g, g, c, c, m, m)
        self.free: dict[str, list[float]] = {
            hid: [h.gpus, h.cpu, h.memory_gib] for hid, h in self.specs.items()
        }
        self._view: tuple[Host, ...] | None = None
        #: What each host's object cache holds (``sim/data.py``), as its agent would report it.
        self.cached: dict[str, frozenset[str]] = {}

    @property
    def max_gpus_per_host(self) -> int:
        return max((h.gpus for h in self.specs.values()), default=8)

    def hosts(self) -> tuple[Host, ...]:
        """The hosts as their agents would report them (rebuilt only after a change)."""
        if self._view is None:
            self._view = tuple(
                Host(
                    h.host_id,
                    h.pool,
                    h.gpu_type,
                    h.gpus,
                    int(f[0]),
                    h.cpu,
                    f[1],
                    h.memory_gib,
                    f[2],
                    cached_datasets=self.cached.get(hid, frozenset()),
                )
                for hid, h, f in ((hid, h, self.free[hid]) for hid, h in self.specs.items())
            )
        return self._view

    def has_room(self, host_id: str, gpus: int, cpu: float, memory_gib: float) -> bool:
        f = self.free[host_id]
        return fits(f[0], f[1], f[2], gpus, cpu, memory_gib)

    def set_cached(self, host_id: str, sources: frozenset[str]) -> None:
        self.cached[host_id] = sources
        self._view = None

    def largest_free_block(self) -> float:
        return max((f[0] for f in self.free.values()), default=0)

    def take(self, hosts: tuple[tuple[str, int], ...], cpu: float, memory_gib: float, job_id: str) -> None:
        for hid, g in hosts:
            f = self.free[hid]
            if not fits(f[0], f[1], f[2], g, cpu, memory_gib):
                raise AssertionError(f"over-allocation of {hid} for {job_id}")
            f[0] -= g
            f[1] -= cpu
            f[2] -= memory_gib
        self._view = None

    def give_back(self, hosts: tuple[tuple[str, int], ...], cpu: float, memory_gib: float) -> None:
        for hid, g in hosts:
            f = self.free[hid]
            f[0] += g
            f[1] += cpu
            f[2] += memory_gib
        self._view = None
