"""The one capacity test: do these free resources hold this much (with float slack on CPU and memory)."""

from __future__ import annotations

EPS = 1e-9


def fits(
    free_gpus: float, free_cpu: float, free_memory_gib: float, gpus: float, cpu: float, memory_gib: float
) -> bool:
    return free_gpus >= gpus and free_cpu >= cpu - EPS and free_memory_gib >= memory_gib - EPS
