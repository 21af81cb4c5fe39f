"""GPU discovery through a fake pynvml module (every NVML path), and the simulated fallback."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from berth_agent.config import DiscoveryMode, GpuConfig, SimulatedInventory
from berth_agent.gpus import discover, gpu_type_of


class NVMLError(Exception):
    pass


@dataclass
class FakeDevice:
    name: str
    uuid: str
    total: int
    mig: tuple[int, int] | None = (0, 0)
    ecc: int | None = 0
    pending: int = 0
    minor: int | None = None


def fake_nvml(devices: list[FakeDevice], *, init_fails: bool = False) -> Any:
    m = types.SimpleNamespace()
    m.NVMLError = NVMLError
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    m.NVML_VOLATILE_ECC = 0
    m.NVML_FEATURE_ENABLED = 1
    m.calls = []

    def init() -> None:
        if init_fails:
            raise NVMLError("Driver Not Loaded")
        m.calls.append("init")

    def unsupported(value: Any) -> Any:
        if value is None:
            raise NVMLError("Not Supported")
        return value

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: "580.65"
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    m.nvmlDeviceGetName = lambda d: d.name.encode()  # older bindings return bytes
    m.nvmlDeviceGetUUID = lambda d: d.uuid
    m.nvmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(total=d.total, used=0, free=d.total)
    m.nvmlDeviceGetMigMode = lambda d: unsupported(d.mig)
    m.nvmlDeviceGetTotalEccErrors = lambda d, kind, counter: unsupported(d.ecc)
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda d: d.pending
    m.nvmlDeviceGetMinorNumber = lambda d: unsupported(d.minor)
    return m


GIB = 1024**3
NVML = GpuConfig(discovery=DiscoveryMode.NVML, simulated=SimulatedInventory(gpu_type="T4", count=2))


def test_nvml_inventory_with_health_and_mig() -> None:
    nvml = fake_nvml(
        [
            FakeDevice("NVIDIA H100 80GB HBM3", "GPU-aaa", 80 * GIB, minor=0),
            FakeDevice("NVIDIA H100 80GB HBM3", "GPU-bbb", 80 * GIB, mig=(1, 1), ecc=None, minor=3),
            FakeDevice("NVIDIA H100 80GB HBM3", "GPU-ccc", 80 * GIB, ecc=3),
            FakeDevice("NVIDIA H100 80GB HBM3", "GPU-ddd", 80 * GIB, pending=1),
        ]
    )
    inv = discover(NVML, "h1", nvml=nvml)
    assert inv.source == "nvml" and inv.gpu_type == "H100" and inv.driver_version == "580.65"
    assert [g.uuid for g in inv.gpus] == ["GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd"]
    assert inv.gpus[0].memory_mib == 80 * 1024 and inv.memory_gib == 80
    assert inv.gpus[1].mig_enabled and inv.gpus[1].ecc_uncorrected is None and inv.gpus[1].healthy
    assert not inv.gpus[2].healthy and "3 uncorrected ECC" in inv.gpus[2].reason
    assert not inv.gpus[3].healthy and "retired pages" in inv.gpus[3].reason
    assert inv.healthy_uuids == ["GPU-aaa", "GPU-bbb"]
    # the device minors (/dev/nvidia<minor>) for device rules; None where NVML does not say
    assert inv.minors == {"GPU-aaa": 0, "GPU-bbb": 3, "GPU-ccc": None, "GPU-ddd": None}
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_missing_falls_back_to_simulated_with_stable_uuids() -> None:
    inv = discover(NVML, "host-7", nvml=fake_nvml([], init_fails=True))
    assert inv.source == "simulated" and inv.gpu_type == "T4"
    assert [g.uuid for g in inv.gpus] == ["GPU-sim-host-7-0", "GPU-sim-host-7-1"]
    assert discover(NVML, "host-7", nvml=fake_nvml([], init_fails=True)) == inv


def test_simulated_mode_never_touches_nvml() -> None:
    cfg = GpuConfig(discovery=DiscoveryMode.SIMULATED, simulated=SimulatedInventory(count=3, memory_gib=24))
    inv = discover(cfg, "h", nvml=object())
    assert len(inv.gpus) == 3 and inv.memory_gib == 24


def test_gpu_type_names() -> None:
    assert gpu_type_of("NVIDIA A100-SXM4-80GB", 81920) == "A100-80G"
    assert gpu_type_of("NVIDIA A100-SXM4-40GB", 40960) == "A100"
    assert gpu_type_of("NVIDIA L40S", 46068) == "L40S"
    assert gpu_type_of("NVIDIA L4", 23034) == "L4"
    assert gpu_type_of("NVIDIA H200", 143771) == "H200"
    assert gpu_type_of("Tesla V100-SXM2-32GB", 32768) == "V100"
    assert gpu_type_of("NVIDIA A10G", 23028) == "A10G"
    assert gpu_type_of("NVIDIA RTX 6000 Ada", 49140) == "RTX 6000 Ada"


def test_nvml_session() -> None:
    from berth_agent.gpus import nvml_session

    nvml = fake_nvml([])
    calls: list[str] = nvml.calls
    with nvml_session(nvml) as m:
        assert m is nvml and calls == ["init"]
    assert calls == ["init", "shutdown"]
    with nvml_session(fake_nvml([], init_fails=True)) as m:
        assert m is None
