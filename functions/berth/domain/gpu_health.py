"""GPU health at run time: what an agent reports of a failing GPU, and what each fault means. Pure.

The agent's watcher (``berth_agent.gpu_health``) turns NVML events and counters into
``GpuFaultReport``s that ride on its heartbeat; the control plane keeps a host's fatal faults on the
host record until an admin clears them, and never places on a GPU that has one. Severity is decided
here, once, from the fault's kind and XID (both sides import this module); the text users see is
rendered here too (``describe``), never taken from the agent.

The XID table (docs/agent.md renders it) follows NVIDIA's "XID Errors" catalogue: XIDs that mean the
GPU itself needs a reset or a repair are fatal; XIDs that are usually the application's own fault
(an illegal address, an exception in its kernel) are ``APPLICATION_XIDS`` and take no GPU out; any
other XID is a warning (shown, not acted on).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Severity(StrEnum):
    FATAL = "fatal"
    """The GPU leaves placement and the attempt on it is stopped and placed again."""
    WARNING = "warning"
    """Shown on the host (``berth capacity``); the GPU stays in placement."""


class GpuFaultKind(StrEnum):
    XID = "xid"
    """An XID critical error event (``xid`` says which)."""
    GPU_LOST = "gpu-lost"
    """NVML answered ``NVML_ERROR_GPU_IS_LOST``: the GPU is gone from the bus."""
    ECC_UNCORRECTED = "ecc-uncorrected"
    """Volatile uncorrected ECC errors rose while the agent ran (``value``: the count now)."""
    RETIRED_PAGES_PENDING = "retired-pages-pending"
    """Memory pages wait for retirement: the GPU needs a reset."""
    OVERHEATING = "overheating"
    """At or above the GPU's shutdown temperature (``value``: degrees C)."""
    THERMAL_SLOWDOWN = "thermal-slowdown"
    """At or above the GPU's slowdown temperature (``value``: degrees C)."""
    CLOCK_THROTTLE = "clock-throttle"
    """Clocks held down by a hardware slowdown (thermal or power brake)."""


#: XID -> what it means, for the XIDs that make a GPU unusable until it is reset or repaired.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (reset required)",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (reset required)",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
#: XIDs that are usually the application's own fault: the job fails as its code did; no GPU is taken out.
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (usually the application)",
    45: "preemptive cleanup after an earlier error",
}
_FATAL_KINDS = frozenset(
    {
        GpuFaultKind.GPU_LOST,
        GpuFaultKind.ECC_UNCORRECTED,
        GpuFaultKind.RETIRED_PAGES_PENDING,
        GpuFaultKind.OVERHEATING,
    }
)
#: How many cleared fault ids a host record remembers (a heartbeat naming one gets ``clear-gpu-fault``).
CLEARED_KEPT = 32


def severity_of(kind: GpuFaultKind, xid: int | None = None) -> Severity | None:
    """A fault's severity; None for an application XID (nothing to report)."""
    if kind is GpuFaultKind.XID:
        if xid in FATAL_XIDS:
            return Severity.FATAL
        return None if xid in APPLICATION_XIDS else Severity.WARNING
    return Severity.FATAL if kind in _FATAL_KINDS else Severity.WARNING


def describe(kind: GpuFaultKind, xid: int | None = None, value: float | None = None) -> str:
    """What the fault means, in Berth's words (the job event and ``berth capacity`` show it)."""
    if kind is GpuFaultKind.XID:
        meaning = FATAL_XIDS.get(xid or -1) or APPLICATION_XIDS.get(xid or -1) or "see NVIDIA's XID catalogue"
        return f"XID {xid} ({meaning})"
    shown = "" if value is None else f" ({value:g})"
    return {
        GpuFaultKind.GPU_LOST: "GPU is lost (NVML_ERROR_GPU_IS_LOST)",
        GpuFaultKind.ECC_UNCORRECTED: f"new uncorrected ECC errors{shown}",
        GpuFaultKind.RETIRED_PAGES_PENDING: "retired memory pages pending a reset",
        GpuFaultKind.OVERHEATING: f"at its shutdown temperature{shown.replace(')', ' C)')}",
        GpuFaultKind.THERMAL_SLOWDOWN: f"at its slowdown temperature{shown.replace(')', ' C)')}",
        GpuFaultKind.CLOCK_THROTTLE: "clocks throttled by a hardware slowdown",
    }[kind]


class GpuFaultReport(BaseModel):
    """One fault as an agent reports it on its heartbeat (validated strictly: unknown fields 422).

    A fatal fault is latched by the agent and reported on every heartbeat until the control plane
    answers ``clear-gpu-fault`` for its ``fault_id`` (an admin cleared it); a warning is reported while
    it lasts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
    gpu_id: Annotated[str, Field(min_length=1, max_length=96)]
    kind: GpuFaultKind
    xid: Annotated[int, Field(ge=0, le=100_000)] | None = None
    value: float | None = None

    @property
    def severity(self) -> Severity | None:
        return severity_of(self.kind, self.xid)


class GpuFault(BaseModel):
    """A fault as the host record keeps it: the report plus when the control plane first saw it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_id: str
    kind: GpuFaultKind
    xid: int | None = None
    value: float | None = None
    at: datetime

    @classmethod
    def of(cls, report: GpuFaultReport, at: datetime) -> GpuFault:
        return cls(fault_id=report.fault_id, kind=report.kind, xid=report.xid, value=report.value, at=at)

    @property
    def severity(self) -> Severity:
        return severity_of(self.kind, self.xid) or Severity.WARNING

    @property
    def reason(self) -> str:
        return describe(self.kind, self.xid, self.value)
