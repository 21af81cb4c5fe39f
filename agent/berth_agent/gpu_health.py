"""GPU health at run time: the watcher that tells the control plane a GPU started failing.

At registration ``gpus.discover`` withholds GPUs that are already unhealthy; this module watches the
registered ones while the agent runs, from a ``HealthSource``:

- ``NvmlHealthSource`` (GPUs found by NVML): XID critical-error events (``nvmlEventSetCreate``,
  ``nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError)``, ``nvmlEventSetWait``) and counters
  polled every ``gpus.health_poll_s``: volatile uncorrected ECC errors above the count at start,
  retired pages pending, the temperature against the GPU's slowdown and shutdown thresholds, and the
  clock throttle reasons of a hardware slowdown. ``NVML_ERROR_GPU_IS_LOST`` from any call is a lost GPU.
- ``SimulatedHealthSource`` (simulated GPUs): the JSON lines of ``gpus.simulated.faults_file``, one
  injected fault each (``{"gpu": 0, "xid": 79}`` or ``{"gpu": "GPU-…", "kind": "gpu-lost"}``);
  ``berth local fault gpu-error`` appends them.

``GpuHealthWatcher`` classifies what it sees (``berth.domain.gpu_health.severity_of``): a fatal
fault is latched (one per GPU) and reported on every heartbeat until the control plane answers
``clear-gpu-fault`` for it (an admin cleared it); warnings are the last poll's; application XIDs and
other non-fatal XIDs are only logged. The NVML module is injected (``nvml=``), as in ``gpus``, so
tests drive every path with a fake.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from berth.domain.gpu_health import GpuFaultKind, GpuFaultReport, Severity, describe, severity_of

log = logging.getLogger(__name__)

#: Clock throttle reasons that mean the hardware slowed the GPU down (pynvml's values, used where an
#: older binding lacks the names).
_HW_SLOWDOWN_REASONS = (
    ("nvmlClocksThrottleReasonHwSlowdown", 0x8),
    ("nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
    ("nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
    ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
)


@dataclass(frozen=True, slots=True)
class Observation:
    """One thing a source saw of one GPU; ``fault_id`` where the source names it (else the watcher)."""

    gpu_id: str
    kind: GpuFaultKind
    xid: int | None = None
    value: float | None = None
    fault_id: str | None = None


class HealthSource(Protocol):
    #: Whether ``wait_events`` blocks for events (else the watcher sleeps between polls).
    has_events: bool

    def poll(self) -> list[Observation]: ...

    def wait_events(self, timeout_s: float) -> list[Observation]: ...

    def reset(self, gpu_id: str) -> None:
        """Forget what the GPU's last fault was measured against (an admin cleared it)."""

    def close(self) -> None: ...


class NvmlHealthSource:
    """NVML's view of the registered GPUs; ``nvml`` is initialised by the caller (``nvml_session``)."""

    has_events = True

    def __init__(self, nvml: Any, gpu_ids: Sequence[str]) -> None:
        self.nvml = nvml
        self._handles: dict[str, Any] = {}
        self._lost: set[str] = set()
        self._ecc_start: dict[str, int | None] = {}
        self._events: Any = None
        for gpu_id in gpu_ids:
            try:
                self._handles[gpu_id] = nvml.nvmlDeviceGetHandleByUUID(gpu_id)
            except nvml.NVMLError as exc:
                if not self._is_lost(exc):
                    raise
                self._lost.add(gpu_id)
                continue
            self._ecc_start[gpu_id] = self._ecc(gpu_id)
        self._register_events()

    # -- NVML calls ------------------------------------------------------------------------------
    def _is_lost(self, exc: BaseException) -> bool:
        return getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_GPU_IS_LOST", 15)

    def _optional(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, None where unsupported; a lost GPU is raised to the caller."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if self._is_lost(exc):
                raise
            return None

    def _ecc(self, gpu_id: str) -> int | None:
        n = self.nvml
        try:
            count = self._optional(
                n.nvmlDeviceGetTotalEccErrors,
                self._handles[gpu_id],
                n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                n.NVML_VOLATILE_ECC,
            )
        except n.NVMLError:
            return None
        return None if count is None else int(count)

    def _register_events(self) -> None:
        n = self.nvml
        try:
            self._events = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("NVML events unavailable: XID errors are not watched", extra={"error": str(exc)})
            return
        for gpu_id, handle in self._handles.items():
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError, self._events)
            except n.NVMLError as exc:
                log.warning("XID events not supported", extra={"gpu_id": gpu_id, "error": str(exc)})

    # -- HealthSource ----------------------------------------------------------------------------
    def poll(self) -> list[Observation]:
        seen = [Observation(g, GpuFaultKind.GPU_LOST) for g in sorted(self._lost)]
        for gpu_id in self._handles:
            try:
                seen.extend(self._poll_gpu(gpu_id))
            except self.nvml.NVMLError as exc:
                if self._is_lost(exc):
                    seen.append(Observation(gpu_id, GpuFaultKind.GPU_LOST))
                else:
                    log.warning("GPU health not read", extra={"gpu_id": gpu_id, "error": str(exc)})
        return seen

    def _poll_gpu(self, gpu_id: str) -> list[Observation]:
        n, handle = self.nvml, self._handles[gpu_id]
        seen: list[Observation] = []
        ecc, start = self._ecc(gpu_id), self._ecc_start.get(gpu_id)
        if ecc is not None and start is not None and ecc > start:
            seen.append(Observation(gpu_id, GpuFaultKind.ECC_UNCORRECTED, value=float(ecc)))
        if self._optional(n.nvmlDeviceGetRetiredPagesPendingStatus, handle) == n.NVML_FEATURE_ENABLED:
            seen.append(Observation(gpu_id, GpuFaultKind.RETIRED_PAGES_PENDING))
        temp = self._optional(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU)
        shutdown = self._optional(
            n.nvmlDeviceGetTemperatureThreshold, handle, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        )
        slowdown = self._optional(
            n.nvmlDeviceGetTemperatureThreshold, handle, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
        if temp is not None and shutdown and temp >= shutdown:
            seen.append(Observation(gpu_id, GpuFaultKind.OVERHEATING, value=float(temp)))
        elif temp is not None and slowdown and temp >= slowdown:
            seen.append(Observation(gpu_id, GpuFaultKind.THERMAL_SLOWDOWN, value=float(temp)))
        reasons = self._optional(n.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        mask = 0
        for name, default in _HW_SLOWDOWN_REASONS:
            mask |= int(getattr(n, name, default))
        if reasons is not None and int(reasons) & mask:
            seen.append(Observation(gpu_id, GpuFaultKind.CLOCK_THROTTLE, value=float(int(reasons) & mask)))
        return seen

    def wait_events(self, timeout_s: float) -> list[Observation]:
        n = self.nvml
        if self._events is None:
            time.sleep(timeout_s)
            return []
        try:
            data = n.nvmlEventSetWait(self._events, max(0, int(timeout_s * 1000)))
        except n.NVMLError as exc:
            if getattr(exc, "value", None) != getattr(n, "NVML_ERROR_TIMEOUT", 10):
                # A lost GPU shows in the next poll (the event does not say which GPU it was).
                log.warning("NVML event wait failed", extra={"error": str(exc)})
                time.sleep(min(timeout_s, 1.0))
            return []
        if data.eventType != n.nvmlEventTypeXidCriticalError:
            return []
        gpu_id = next((g for g, h in self._handles.items() if h == data.device), None)
        if gpu_id is None:
            try:
                gpu_id = _text(n.nvmlDeviceGetUUID(data.device))
            except n.NVMLError:
                return []
        return [Observation(gpu_id, GpuFaultKind.XID, xid=int(data.eventData))]

    def reset(self, gpu_id: str) -> None:
        if gpu_id in self._handles:
            self._ecc_start[gpu_id] = self._ecc(gpu_id)
        self._lost.discard(gpu_id)

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self._events)
            self._events = None


class SimulatedHealthSource:
    """Faults injected into simulated GPUs: JSON lines in ``path`` (``{"gpu": INDEX|UUID, "xid": N}``
    or ``{"gpu": …, "kind": "gpu-lost"}``); line ``n`` is fault ``sim-<n>`` (the same after a restart)."""

    has_events = False

    def __init__(self, path: Path, gpu_ids: Sequence[str]) -> None:
        self.path = path
        self.gpu_ids = tuple(gpu_ids)
        self._bad: set[int] = set()

    def poll(self) -> list[Observation]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("simulated GPU faults not read", extra={"path": str(self.path), "error": str(exc)})
            return []
        seen = []
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            obs = self._parse(n, line)
            if obs is not None:
                seen.append(obs)
        return seen

    def _parse(self, n: int, line: str) -> Observation | None:
        try:
            doc = json.loads(line)
            gpu = doc["gpu"]
            gpu_id = self.gpu_ids[gpu] if isinstance(gpu, int) else str(gpu)
            kind = GpuFaultKind(doc.get("kind", "xid"))
            xid = doc.get("xid", 79) if kind is GpuFaultKind.XID else None
            if gpu_id not in self.gpu_ids or not (xid is None or isinstance(xid, int)):
                raise ValueError(f"no GPU {gpu!r} here, or a bad xid")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            if n not in self._bad:
                self._bad.add(n)
                log.warning("bad simulated GPU fault ignored", extra={"line": n, "error": str(exc)})
            return None
        return Observation(gpu_id, kind, xid=xid, fault_id=f"sim-{n}")

    def wait_events(self, timeout_s: float) -> list[Observation]:
        return []

    def reset(self, gpu_id: str) -> None:
        return None

    def close(self) -> None:
        return None


class GpuHealthWatcher:
    """Latches fatal faults, keeps the last poll's warnings; ``reports()`` is what a heartbeat sends."""

    def __init__(
        self,
        source: HealthSource,
        poll_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex[:16],
    ) -> None:
        self.source, self.poll_s, self._clock, self._new_id = source, poll_s, clock, new_id
        self._lock = threading.Lock()
        self._fatal: dict[str, GpuFaultReport] = {}
        self._warnings: dict[str, GpuFaultReport] = {}
        self._cleared: set[str] = set()

    def reports(self) -> list[GpuFaultReport]:
        with self._lock:
            return [*self._fatal.values(), *(w for g, w in self._warnings.items() if g not in self._fatal)]

    def observe(self, obs: Observation) -> None:
        """One event or poll result: a fatal fault is latched (the GPU's first until cleared)."""
        severity = severity_of(obs.kind, obs.xid)
        what = describe(obs.kind, obs.xid, obs.value)
        if severity is not Severity.FATAL:
            # Application XIDs (the job's own fault) and other non-fatal XIDs: the log only.
            if obs.kind is GpuFaultKind.XID:
                log.warning("GPU XID (not a GPU fault)", extra={"gpu_id": obs.gpu_id, "xid": obs.xid})
            return
        with self._lock:
            if obs.gpu_id in self._fatal or (obs.fault_id is not None and obs.fault_id in self._cleared):
                return
            fault_id = obs.fault_id or f"{obs.kind.value}-{self._new_id()}"
            self._fatal[obs.gpu_id] = GpuFaultReport(
                fault_id=fault_id, gpu_id=obs.gpu_id, kind=obs.kind, xid=obs.xid, value=obs.value
            )
        log.error("GPU fault", extra={"gpu_id": obs.gpu_id, "fault": what, "fault_id": fault_id})

    def poll_once(self) -> None:
        warnings: dict[str, GpuFaultReport] = {}
        for obs in self.source.poll():
            if severity_of(obs.kind, obs.xid) is Severity.WARNING and obs.kind is not GpuFaultKind.XID:
                prev = self._warnings.get(obs.gpu_id)
                fault_id = prev.fault_id if prev is not None and prev.kind is obs.kind else None
                warnings[obs.gpu_id] = GpuFaultReport(
                    fault_id=fault_id or f"{obs.kind.value}-{self._new_id()}",
                    gpu_id=obs.gpu_id,
                    kind=obs.kind,
                    xid=obs.xid,
                    value=obs.value,
                )
            else:
                self.observe(obs)
        with self._lock:
            self._warnings = warnings

    def clear(self, gpu_id: str, fault_id: str) -> bool:
        """The control plane's ``clear-gpu-fault``: forget this fault (not a newer one of the GPU)."""
        with self._lock:
            self._cleared.add(fault_id)
            current = self._fatal.get(gpu_id)
            if current is None or current.fault_id != fault_id:
                return False
            del self._fatal[gpu_id]
        self.source.reset(gpu_id)
        log.info("GPU fault cleared by an admin", extra={"gpu_id": gpu_id, "fault_id": fault_id})
        return True

    def run(self, done: threading.Event) -> None:
        """Poll every ``poll_s`` and wait for events in between, until ``done``."""
        next_poll = self._clock()
        try:
            while not done.is_set():
                if self._clock() >= next_poll:
                    try:
                        self.poll_once()
                    except Exception as exc:  # a health read failing must not end the watch
                        log.warning("GPU health poll failed", extra={"error": str(exc)})
                    next_poll = self._clock() + self.poll_s
                wait = max(0.0, min(1.0, next_poll - self._clock()))
                if self.source.has_events:
                    for obs in self.source.wait_events(wait):
                        self.observe(obs)
                else:
                    done.wait(wait)
        finally:
            self.source.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def watcher_for(
    inventory_source: str,
    gpu_ids: Sequence[str],
    nvml: Any = None,
    faults_file: Path | None = None,
    poll_s: float = 5.0,
) -> GpuHealthWatcher | None:
    """The watcher for this host: NVML's where the inventory came from NVML, the injected faults'
    file for simulated GPUs that declare one, else None (nothing to watch)."""
    source: HealthSource | None = None
    if inventory_source == "nvml" and nvml is not None:
        try:
            source = NvmlHealthSource(nvml, gpu_ids)
        except nvml.NVMLError as exc:
            log.warning("GPU health is not watched: NVML failed", extra={"error": str(exc)})
    elif inventory_source == "simulated" and faults_file is not None:
        source = SimulatedHealthSource(faults_file, gpu_ids)
    return None if source is None else GpuHealthWatcher(source, poll_s=poll_s)
