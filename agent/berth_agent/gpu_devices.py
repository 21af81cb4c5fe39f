"""GPU device rules for process jobs: a job can open only its own GPUs' device nodes.

A process job sees its GPUs through ``CUDA_VISIBLE_DEVICES``, which its own code can change. Where
the host has a cgroup v1 ``devices`` hierarchy the agent may write to, each attempt also gets a
devices cgroup of its own that denies the device nodes of every other GPU of the host
(``c 195:<minor> rwm``; ``/dev/nvidia<minor>``, the minor from NVML), so the kernel refuses
``open()`` on them (EPERM) whatever the job sets. ``nvidiactl``, ``nvidia-uvm`` and the rest stay
open: CUDA needs them, and they give no access to another GPU's memory. The job's process joins the
cgroup before it execs (``ProcessRun``), so everything it forks is inside::

    /sys/fs/cgroup/devices/<agent's own devices cgroup>/berth-jobs/<attempt>/devices.deny

cgroup v2 has no ``devices`` files: device rules there are an eBPF program attached to the cgroup,
which the agent does not load. ``detect`` then returns None and why; the host reports
``berth/gpu-isolation: none`` for process jobs (docs/security.md), and untrusted tenants belong on
container hosts. Rules are also impossible without device minors (simulated GPUs, NVML without them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

V1_ROOT = Path("/sys/fs/cgroup/devices")
#: The character-device major of ``/dev/nvidia<N>`` (and of nvidiactl, 255, and nvidia-modeset, 254).
NVIDIA_MAJOR = 195
JOBS_DIR = "berth-jobs"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def deny_rules(minors: Iterable[int]) -> list[str]:
    """The ``devices.deny`` lines that close the GPUs of these minors: read, write and mknod."""
    return [f"c {NVIDIA_MAJOR}:{m} rwm" for m in sorted(set(minors))]


def own_devices_cgroup(self_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's path in the v1 ``devices`` hierarchy (``5:devices:/x`` -> ``/x``), or None."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "devices" in controllers.split(","):
            return path
    return None


@dataclass(frozen=True, slots=True)
class DeviceCgroup:
    """One attempt's devices cgroup."""

    path: Path

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def members(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self, timeout_s: float = 5.0) -> None:
        """rmdir once its processes are gone (the kernel refuses a busy group: EBUSY); a group still
        busy after ``timeout_s`` is left, logged, for the next agent start to remove."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    log.warning("devices cgroup still busy; left", extra={"cgroup": str(self.path)})
                    return
                time.sleep(0.05)


@dataclass(frozen=True, slots=True)
class DeviceRules:
    """Makes each attempt's devices cgroup under ``jobs`` (``<own devices cgroup>/berth-jobs``)."""

    jobs: Path
    #: GPU UUID -> device minor, for every GPU of this host.
    minors: dict[str, int]

    def create(self, name: str, gpu_uuids: Iterable[str]) -> DeviceCgroup:
        """The attempt's cgroup, denying every GPU of the host but ``gpu_uuids``. Raises OSError."""
        own = set(gpu_uuids)
        path = self.jobs / name
        path.mkdir(exist_ok=True)
        group = DeviceCgroup(path)
        try:
            for rule in deny_rules(m for uuid, m in self.minors.items() if uuid not in own):
                _write(path / "devices.deny", rule)
        except OSError:
            group.remove(timeout_s=0)
            raise
        return group


def detect(
    minors: dict[str, int | None],
    *,
    enabled: bool = True,
    v1_root: Path = V1_ROOT,
    self_cgroup: Path = Path("/proc/self/cgroup"),
) -> tuple[DeviceRules | None, str]:
    """Device rules for this host's GPUs (UUID -> minor), or None and why not."""
    if not enabled:
        return None, "off in the config (limits.gpu_device_rules)"
    if not minors:
        return None, "this host has no GPUs"
    if any(m is None for m in minors.values()):
        return None, "the GPUs' device minors are unknown (simulated GPUs, or NVML did not say)"
    if not (v1_root / "devices.deny").is_file():
        return None, (
            f"no cgroup v1 devices hierarchy at {v1_root} (on cgroup v2 device rules are an eBPF "
            "program, which the agent does not load)"
        )
    own = own_devices_cgroup(self_cgroup)
    base = v1_root / (own or "/").lstrip("/")
    jobs = base / JOBS_DIR
    try:
        jobs.mkdir(exist_ok=True)
        for left in sorted(p for p in jobs.iterdir() if p.is_dir()):
            # a previous agent's attempts: their processes are killed by the ledger's reaping; the
            # empty groups go now, busy ones when a later start finds them empty
            with contextlib.suppress(OSError):
                left.rmdir()
        probe = jobs / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        try:
            _write(probe / "devices.deny", deny_rules([255])[0])  # nvidiactl: a rule every host takes
        finally:
            probe.rmdir()
    except OSError as exc:
        return None, f"could not write device rules under {jobs}: {exc}"
    known = {uuid: m for uuid, m in minors.items() if m is not None}
    return DeviceRules(jobs, known), f"devices cgroup per attempt under {jobs}"
