"""GPU discovery: NVML (``pynvml`` from nvidia-ml-py) or the declared simulated inventory.

``discover(config.gpus, host_id)`` returns an ``Inventory``: the GPUs with UUID, model, memory,
health (uncorrected volatile ECC errors, pending page retirement) and MIG mode. With
``discovery: nvml`` a host without NVML (no driver, no library) falls back to the simulated
inventory and says so in ``Inventory.source`` and a warning; simulated GPUs have stable UUIDs
``GPU-sim-<host>-<i>`` so that a restart registers the same devices.

The NVML module is injectable (``nvml=``) so tests drive every path with a fake. ``nvml_session``
keeps NVML initialised for the usage sampler.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from berth_agent.config import DiscoveryMode, GpuConfig

log = logging.getLogger(__name__)

#: The model names Berth schedules by (berth.domain.job_spec.GPU_TYPES), most specific first:
#: "L40S" before "L4", "A100-80G" decided by memory, "H200" before "H100".
_MODEL_TOKENS = ("H200", "H100", "A100", "A10G", "L40S", "L4", "T4", "V100")


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    healthy: bool = True
    mig_enabled: bool = False
    ecc_uncorrected: int | None = None
    reason: str = ""
    #: The minor of its device node ``/dev/nvidia<minor>`` (NVML); None for simulated GPUs.
    minor: int | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    gpus: tuple[Gpu, ...]
    gpu_type: str
    source: str  # "nvml" | "simulated"
    driver_version: str | None = None

    @property
    def healthy_uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus if g.healthy]

    @property
    def minors(self) -> dict[str, int | None]:
        """GPU UUID -> device minor (None where unknown), every GPU of the host (device rules)."""
        return {g.uuid: g.minor for g in self.gpus}

    @property
    def memory_gib(self) -> int:
        return min((g.memory_mib for g in self.gpus), default=0) // 1024


def gpu_type_of(name: str, memory_mib: int) -> str:
    """Berth's model name for an NVML device name (``NVIDIA H100 80GB HBM3`` -> ``H100``)."""
    upper = name.upper()
    for token in _MODEL_TOKENS:
        if token in upper.replace("-", ""):
            if token == "A100" and memory_mib >= 70 * 1024:
                return "A100-80G"
            return token
    return name.removeprefix("NVIDIA ").strip() or "unknown"


def simulated(config: GpuConfig, host_id: str) -> Inventory:
    sim = config.simulated
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-sim-{host_id}-{i}",
            name=f"Simulated {sim.gpu_type}",
            memory_mib=sim.memory_gib * 1024,
        )
        for i in range(sim.count)
    )
    return Inventory(gpus=gpus, gpu_type=sim.gpu_type, source="simulated")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None where the device does not support it (NVML_ERROR_NOT_SUPPORTED etc.)."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _device(nvml: Any, index: int) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
    mig = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    mig_enabled = bool(mig and mig[0] == nvml.NVML_DEVICE_MIG_ENABLE)
    ecc = _optional(
        nvml,
        nvml.nvmlDeviceGetTotalEccErrors,
        handle,
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
    )
    pending = _optional(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    minor = _optional(nvml, nvml.nvmlDeviceGetMinorNumber, handle)
    reasons = []
    if ecc:
        reasons.append(f"{ecc} uncorrected ECC errors since boot")
    if pending == nvml.NVML_FEATURE_ENABLED:
        reasons.append("retired pages pending a reset")
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        memory_mib=memory_mib,
        healthy=not reasons,
        mig_enabled=mig_enabled,
        ecc_uncorrected=None if ecc is None else int(ecc),
        reason="; ".join(reasons),
        minor=None if minor is None else int(minor),
    )


def _load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def from_nvml(nvml: Any) -> Inventory:
    """Every device NVML sees. Raises ``nvml.NVMLError`` when NVML cannot start (no driver)."""
    nvml.nvmlInit()
    try:
        driver = _optional(nvml, nvml.nvmlSystemGetDriverVersion)
        gpus = tuple(_device(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount())))
    finally:
        nvml.nvmlShutdown()
    types = {gpu_type_of(g.name, g.memory_mib) for g in gpus}
    if len(types) > 1:
        log.warning("mixed GPU models on one host; registering the first", extra={"models": sorted(types)})
    gpu_type = gpu_type_of(gpus[0].name, gpus[0].memory_mib) if gpus else "none"
    return Inventory(gpus=gpus, gpu_type=gpu_type, source="nvml", driver_version=driver and _text(driver))


def discover(config: GpuConfig, host_id: str, nvml: Any = None) -> Inventory:
    """The host's GPUs; see the module docstring for the fallback rule."""
    if config.discovery == DiscoveryMode.SIMULATED:
        return simulated(config, host_id)
    module = nvml if nvml is not None else _load_nvml()
    if module is None:
        log.warning("nvidia-ml-py is not installed; using the simulated inventory")
        return simulated(config, host_id)
    try:
        inv = from_nvml(module)
    except module.NVMLError as exc:
        log.warning("NVML is not available; using the simulated inventory", extra={"error": str(exc)})
        return simulated(config, host_id)
    for gpu in inv.gpus:
        if not gpu.healthy:
            log.warning("unhealthy GPU withheld", extra={"uuid": gpu.uuid, "reason": gpu.reason})
    return inv


@contextlib.contextmanager
def nvml_session(nvml: Any = None) -> Iterator[Any | None]:
    """NVML initialised for the daemon's lifetime (for ``usage.UsageSampler(nvml=...)``), or None
    where there is no NVML (simulated GPUs: the sampler then reports CPU and memory only)."""
    module = nvml if nvml is not None else _load_nvml()
    if module is None:
        yield None
        return
    try:
        module.nvmlInit()
    except module.NVMLError:
        yield None
        return
    try:
        yield module
    finally:
        module.nvmlShutdown()
