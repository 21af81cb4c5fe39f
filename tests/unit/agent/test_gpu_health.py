"""The GPU health watcher through a fake pynvml (each fault class) and the simulated faults file.

Tested only with fakes: no GPU is on the machines these tests run on (docs/agent.md says so).
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from berth.domain.gpu_health import FATAL_XIDS, GpuFaultKind, Severity, describe, severity_of
from berth_agent.gpu_health import (
    GpuHealthWatcher,
    NvmlHealthSource,
    Observation,
    SimulatedHealthSource,
    watcher_for,
)

LOST, TIMEOUT, NOT_SUPPORTED = 15, 10, 3
HW_SLOWDOWN, SW_POWER_CAP = 0x8, 0x4


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Dev:
    uuid: str
    ecc: int | None = 0
    pending: int = 0
    temp: int = 50
    slowdown: int | None = 90
    shutdown: int | None = 95
    throttle: int = 0
    lost: bool = False
    events_supported: bool = True


@dataclass
class Fake:
    devices: list[Dev]
    events: list[tuple[Dev, int, int]] = field(default_factory=list)  # (device, event type, xid)
    freed: bool = False
    event_set_fails: bool = False


def fake_nvml(fake: Fake) -> Any:
    m = types.SimpleNamespace()
    m.NVMLError = NVMLError
    m.NVML_ERROR_GPU_IS_LOST, m.NVML_ERROR_TIMEOUT = LOST, TIMEOUT
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC, m.NVML_FEATURE_ENABLED = 1, 0, 1
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, m.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1
    m.nvmlEventTypeXidCriticalError = 8
    m.nvmlClocksThrottleReasonHwSlowdown = HW_SLOWDOWN

    def dev(d: Dev) -> Dev:
        if d.lost:
            raise NVMLError(LOST)
        return d

    def value(v: Any) -> Any:
        if v is None:
            raise NVMLError(NOT_SUPPORTED)
        return v

    def by_uuid(u: str) -> Dev:
        return dev(next(d for d in fake.devices if d.uuid == u))

    def event_set() -> str:
        if fake.event_set_fails:
            raise NVMLError(NOT_SUPPORTED)
        return "set"

    def register(d: Dev, kind: int, s: str) -> None:
        if not d.events_supported:
            raise NVMLError(NOT_SUPPORTED)

    def wait(s: str, ms: int) -> Any:
        if not fake.events:
            raise NVMLError(TIMEOUT)
        d, kind, xid = fake.events.pop(0)
        return types.SimpleNamespace(device=d, eventType=kind, eventData=xid)

    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetUUID = lambda d: dev(d).uuid.encode()
    m.nvmlDeviceGetTotalEccErrors = lambda d, kind, counter: value(dev(d).ecc)
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda d: dev(d).pending
    m.nvmlDeviceGetTemperature = lambda d, sensor: dev(d).temp
    m.nvmlDeviceGetTemperatureThreshold = lambda d, which: value(
        dev(d).shutdown if which == 0 else dev(d).slowdown
    )
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda d: dev(d).throttle
    m.nvmlEventSetCreate = event_set
    m.nvmlDeviceRegisterEvents = register
    m.nvmlEventSetWait = wait
    m.nvmlEventSetFree = lambda s: setattr(fake, "freed", True)
    return m


def _watch(*devs: Dev) -> tuple[Fake, NvmlHealthSource, GpuHealthWatcher]:
    fake = Fake(list(devs))
    source = NvmlHealthSource(fake_nvml(fake), [d.uuid for d in devs])
    ids = iter(f"id{i}" for i in range(100))
    return fake, source, GpuHealthWatcher(source, poll_s=0.01, new_id=lambda: next(ids))


def _kinds(w: GpuHealthWatcher) -> list[tuple[str, str, int | None]]:
    return [(r.gpu_id, str(r.kind), r.xid) for r in w.reports()]


def test_the_xid_table_classifies_fatal_application_and_other_xids() -> None:
    for xid in (48, 63, 64, 74, 79, 92, 94, 95):
        assert severity_of(GpuFaultKind.XID, xid) is Severity.FATAL and xid in FATAL_XIDS
    for xid in (13, 31, 43, 45):
        assert severity_of(GpuFaultKind.XID, xid) is None
    assert severity_of(GpuFaultKind.XID, 999) is Severity.WARNING
    assert severity_of(GpuFaultKind.GPU_LOST) is Severity.FATAL
    assert severity_of(GpuFaultKind.THERMAL_SLOWDOWN) is Severity.WARNING
    assert describe(GpuFaultKind.XID, 79) == "XID 79 (GPU has fallen off the bus)"
    assert describe(GpuFaultKind.OVERHEATING, value=97) == "at its shutdown temperature (97 C)"


def test_a_fatal_xid_event_is_latched_once_per_gpu() -> None:
    a, b = Dev("GPU-a"), Dev("GPU-b")
    fake, source, w = _watch(a, b)
    fake.events += [(a, 8, 79), (a, 8, 48)]
    for _ in range(2):
        for obs in source.wait_events(0.01):
            w.observe(obs)
    assert _kinds(w) == [("GPU-a", "xid", 79)]  # the GPU's first fault stays until cleared
    assert w.reports()[0].fault_id == "xid-id0"
    assert source.wait_events(0.01) == []  # a timeout: nothing


def test_application_and_unknown_xids_take_no_gpu_out() -> None:
    a = Dev("GPU-a")
    fake, source, w = _watch(a)
    fake.events += [(a, 8, 13), (a, 8, 43), (a, 8, 999)]
    for _ in range(3):
        for obs in source.wait_events(0.01):
            w.observe(obs)
    assert w.reports() == []


def test_a_gpu_lost_on_any_call_is_fatal_and_at_start_too() -> None:
    a, b = Dev("GPU-a"), Dev("GPU-b", lost=True)
    _fake, _source, w = _watch(a, b)
    w.poll_once()
    assert _kinds(w) == [("GPU-b", "gpu-lost", None)]
    a.lost = True
    w.poll_once()
    assert sorted(_kinds(w)) == [("GPU-a", "gpu-lost", None), ("GPU-b", "gpu-lost", None)]


def test_new_uncorrected_ecc_is_fatal_but_errors_from_before_are_not() -> None:
    a, b = Dev("GPU-a", ecc=2), Dev("GPU-b", ecc=None)  # b: ECC not supported
    _fake, _source, w = _watch(a, b)
    w.poll_once()
    assert w.reports() == []
    a.ecc = 3
    w.poll_once()
    [fault] = w.reports()
    assert (fault.gpu_id, fault.kind, fault.value) == ("GPU-a", GpuFaultKind.ECC_UNCORRECTED, 3.0)


def test_retired_pages_pending_is_fatal() -> None:
    a = Dev("GPU-a", pending=1)
    _fake, _source, w = _watch(a)
    w.poll_once()
    assert _kinds(w) == [("GPU-a", "retired-pages-pending", None)]


def test_temperature_warns_at_slowdown_and_is_fatal_at_shutdown() -> None:
    a = Dev("GPU-a", temp=91)
    _fake, _source, w = _watch(a)
    w.poll_once()
    [warning] = w.reports()
    assert warning.kind is GpuFaultKind.THERMAL_SLOWDOWN and warning.severity is Severity.WARNING
    w.poll_once()
    assert w.reports()[0].fault_id == warning.fault_id  # the same warning while it lasts
    a.temp = 60
    w.poll_once()
    assert w.reports() == []  # a warning lasts only while it is seen
    a.temp = 96
    w.poll_once()
    assert _kinds(w) == [("GPU-a", "overheating", None)]
    a.temp = 60
    w.poll_once()
    assert _kinds(w) == [("GPU-a", "overheating", None)]  # fatal: latched


def test_a_hardware_slowdown_warns_and_a_power_cap_does_not() -> None:
    a = Dev("GPU-a", throttle=SW_POWER_CAP)
    _fake, _source, w = _watch(a)
    w.poll_once()
    assert w.reports() == []
    a.throttle = SW_POWER_CAP | HW_SLOWDOWN
    w.poll_once()
    assert _kinds(w) == [("GPU-a", "clock-throttle", None)]


def test_clear_forgets_the_fault_and_measures_ecc_from_now() -> None:
    a = Dev("GPU-a", ecc=0)
    _fake, _source, w = _watch(a)
    a.ecc = 5
    w.poll_once()
    [fault] = w.reports()
    assert not w.clear("GPU-a", "some-other-id")  # a newer fault of the GPU is not cleared by mistake
    assert w.reports() == [fault]
    assert w.clear("GPU-a", fault.fault_id)
    w.poll_once()
    assert w.reports() == []  # 5 is the count it is measured against now
    a.ecc = 6
    w.poll_once()
    assert _kinds(w) == [("GPU-a", "ecc-uncorrected", None)]


def test_without_event_support_the_counters_are_still_polled() -> None:
    a = Dev("GPU-a", events_supported=False, pending=1)
    _fake, _source, w = _watch(a)
    w.poll_once()
    assert _kinds(w) == [("GPU-a", "retired-pages-pending", None)]
    fake = Fake([Dev("GPU-b")], event_set_fails=True)
    source = NvmlHealthSource(fake_nvml(fake), ["GPU-b"])
    assert source.wait_events(0) == []


def test_the_watch_loop_takes_events_and_polls_until_done() -> None:
    a, b = Dev("GPU-a"), Dev("GPU-b")
    fake, _source, w = _watch(a, b)
    fake.events.append((a, 8, 79))
    b.pending = 1
    done = threading.Event()
    t = threading.Thread(target=w.run, args=(done,))
    t.start()
    try:
        for _ in range(500):
            if len(w.reports()) == 2:
                break
            threading.Event().wait(0.01)
    finally:
        done.set()
        t.join(5)
    assert sorted(_kinds(w)) == [("GPU-a", "xid", 79), ("GPU-b", "retired-pages-pending", None)]
    assert fake.freed and not t.is_alive()


def test_simulated_faults_file(tmp_path: Path) -> None:
    path = tmp_path / "gpu-faults.jsonl"
    source = SimulatedHealthSource(path, ["GPU-sim-h-0", "GPU-sim-h-1"])
    w = GpuHealthWatcher(source)
    w.poll_once()
    assert w.reports() == []  # no file: no fault
    path.write_text(
        '{"gpu": 1, "xid": 79}\nnot json\n{"gpu": 7}\n{"gpu": "GPU-sim-h-0", "kind": "gpu-lost"}\n'
        '{"gpu": 0, "xid": 13}\n'
    )
    w.poll_once()
    got = {(r.gpu_id, r.kind, r.xid, r.fault_id) for r in w.reports()}
    assert got == {
        ("GPU-sim-h-1", GpuFaultKind.XID, 79, "sim-1"),
        ("GPU-sim-h-0", GpuFaultKind.GPU_LOST, None, "sim-4"),
    }
    assert w.clear("GPU-sim-h-1", "sim-1")
    w.poll_once()
    assert [r.fault_id for r in w.reports()] == ["sim-4"]  # a cleared line is not read again
    with path.open("a") as f:
        f.write('{"gpu": 1}\n')  # a new fault of the same GPU (XID 79 by default)
    w.poll_once()
    assert {r.fault_id for r in w.reports()} == {"sim-4", "sim-6"}


@pytest.mark.parametrize(
    ("source", "faults_file", "expected"),
    [("simulated", None, None), ("simulated", "f", SimulatedHealthSource), ("nvml", None, None)],
)
def test_watcher_for_picks_the_source(
    tmp_path: Path, source: str, faults_file: str | None, expected: type | None
) -> None:
    w = watcher_for(source, ["GPU-a"], nvml=None, faults_file=faults_file and tmp_path / faults_file)
    assert (w is None) if expected is None else isinstance(w.source, expected)  # type: ignore[union-attr]


def test_watcher_for_nvml() -> None:
    w = watcher_for("nvml", ["GPU-a"], nvml=fake_nvml(Fake([Dev("GPU-a")])))
    assert w is not None and isinstance(w.source, NvmlHealthSource)
    broken = fake_nvml(Fake([]))
    broken.nvmlDeviceGetHandleByUUID = lambda u: (_ for _ in ()).throw(NVMLError(NOT_SUPPORTED))
    assert watcher_for("nvml", ["GPU-a"], nvml=broken) is None  # NVML failing: logged, not watched


def test_an_observation_of_a_warning_kind_outside_a_poll_is_not_reported() -> None:
    w = GpuHealthWatcher(SimulatedHealthSource(Path("/nonexistent"), ["GPU-a"]))
    w.observe(Observation("GPU-a", GpuFaultKind.CLOCK_THROTTLE))
    assert w.reports() == []
