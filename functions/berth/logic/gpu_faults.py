"""GPU health at run time, the control plane's side (docs/agent.md, "GPU health at run time").

An agent's heartbeat carries its GPU faults (``berth.domain.gpu_health``). ``GpuFaultService``:

- keeps a fatal fault on the host record (the first one per GPU, until an admin clears it): the GPU
  leaves placement (``HostRecord.free_gpu_ids`` leaves it out);
- stops the attempt holding a faulted GPU with ``stop_failure = GpuFailed``: the workflow places it
  again without using one of the job's attempts, and the job's event names the GPU and the fault.
  This is level-triggered (every heartbeat of a degraded host looks again), so an attempt placed on
  the GPU by a pass that read the host just before the fault is stopped too;
- answers ``clear-gpu-fault`` when an agent still reports a fault an admin cleared;
- keeps the host's current warnings (shown by ``berth capacity``, never acted on).

``clear_gpu_fault`` is the admin's route (``POST /v1/hosts/{host}/gpus/{gpu}/clear``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from berth.domain.agent_wire import Directive
from berth.domain.errors import Conflict, Forbidden, NotFound
from berth.domain.fleet import HostRecord
from berth.domain.gpu_health import GpuFault, GpuFaultReport, Severity
from berth.domain.ports import HostRepository, JobRepository
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller
from berth.domain.workflow import Failure

log = logging.getLogger(__name__)

CLEAR_ACTION = "clear-gpu-fault"


class NoGpuFault(Conflict):
    """The GPU has no fault to clear."""

    code = "NoGpuFault"


def gpu_label(rec: HostRecord, gpu_id: str) -> str:
    """``GPU 1 (GPU-…)``: its index on the host where it is registered, and its UUID."""
    ids = rec.inventory.gpu_ids
    return f"GPU {ids.index(gpu_id)} ({gpu_id})" if gpu_id in ids else f"GPU {gpu_id}"


def gpu_fault_rows(rec: HostRecord) -> list[dict[str, Any]]:
    """The host's faults and warnings as ``GET /v1/capacity`` shows them, fatal first."""
    rows = []
    for faults in (rec.gpu_faults, rec.gpu_warnings):
        for gpu_id in sorted(faults):
            f = faults[gpu_id]
            ids = rec.inventory.gpu_ids
            rows.append(
                {
                    "gpu_id": gpu_id,
                    "index": ids.index(gpu_id) if gpu_id in ids else None,
                    "severity": str(f.severity),
                    "kind": str(f.kind),
                    "xid": f.xid,
                    "reason": f.reason,
                    "fault_id": f.fault_id,
                    "at": f.at.isoformat(),
                }
            )
    return rows


def resolve_gpu(rec: HostRecord, gpu: str) -> str:
    """The UUID ``gpu`` names on this host: a UUID it registered or has a fault for, or an index."""
    if gpu.isdigit():
        index = int(gpu)
        if index < len(rec.inventory.gpu_ids):
            return rec.inventory.gpu_ids[index]
    elif gpu in rec.inventory.gpu_ids or gpu in rec.gpu_faults:
        return gpu
    raise NotFound(f"host {rec.host_id!r} has no GPU {gpu!r}")


def clear_gpu_fault(caller: Caller, hosts: HostRepository, host_id: str, gpu: str) -> dict[str, Any]:
    """An admin's clear of a GPU's fault: the GPU is placeable again (its agent forgets the fault on
    its next heartbeat, and reports the GPU again only if it fails again). Forbidden for members,
    NotFound for an unknown host or GPU, ``NoGpuFault`` (409) when it has none."""
    if not caller.is_admin:
        raise Forbidden("only admins may clear GPU faults")
    rec = hosts.get(host_id)
    if rec is None:
        raise NotFound(f"host {host_id!r} is not registered")
    gpu_id = resolve_gpu(rec, gpu)
    cleared = hosts.clear_gpu_fault(host_id, gpu_id)
    if cleared is None:
        raise NoGpuFault(f"{gpu_label(rec, gpu_id)} of host {host_id} has no fault to clear")
    log.info("GPU fault cleared", extra={"host_id": host_id, "gpu_id": gpu_id, "by": caller.name})
    return {"host_id": host_id, "gpu_id": gpu_id, "cleared": cleared.reason, "fault_id": cleared.fault_id}


@dataclass(frozen=True)
class GpuFaultService:
    jobs: JobRepository
    hosts: HostRepository
    clock: Callable[[], datetime]

    def on_heartbeat(self, rec: HostRecord, reports: Sequence[GpuFaultReport]) -> list[Directive]:
        """Record the heartbeat's faults, stop the attempts on faulted GPUs; the directives to answer."""
        if not reports and not rec.gpu_faults and not rec.gpu_warnings:
            return []
        now = self.clock()
        known = set(rec.inventory.gpu_ids)
        directives: list[Directive] = []
        fresh: dict[str, GpuFault] = {}
        warnings: dict[str, GpuFault] = {}
        for r in reports:
            severity = r.severity
            if r.gpu_id not in known or severity is None:
                continue  # not one of the GPUs it registered, or an application's own XID
            if severity is Severity.WARNING:
                prev = rec.gpu_warnings.get(r.gpu_id)
                warnings[r.gpu_id] = prev if prev is not None and prev.kind is r.kind else GpuFault.of(r, now)
            elif r.fault_id in rec.cleared_faults:
                directives.append(
                    Directive(
                        action=CLEAR_ACTION,
                        gpu_id=r.gpu_id,
                        fault_id=r.fault_id,
                        reason="an admin cleared this fault",
                    )
                )
            elif r.gpu_id not in rec.gpu_faults:
                fresh.setdefault(r.gpu_id, GpuFault.of(r, now))
        if fresh:
            rec = self.hosts.add_gpu_faults(rec.host_id, fresh)
            for gpu_id, f in fresh.items():
                log.warning(
                    "GPU fault: out of placement",
                    extra={"host_id": rec.host_id, "gpu_id": gpu_id, "reason": f.reason},
                )
        if warnings != rec.gpu_warnings:
            self.hosts.set_gpu_warnings(rec.host_id, warnings)
        self.stop_attempts(rec)
        return directives

    def stop_attempts(self, rec: HostRecord) -> list[str]:
        """Stop every current attempt that holds a faulted GPU of ``rec``; the jobs stopped now."""
        faulted = rec.faulted_gpu_ids
        stopped: list[str] = []
        for key, hold in rec.holds.items():
            bad = [g for g in hold.gpu_ids if g in faulted]
            if not bad:
                continue
            job_id, _, attempt = key.rpartition("#")
            job = self.jobs.get(job_id)
            if (
                job is None
                or str(job.attempts) != attempt
                or job.status not in (JobStatus.STARTING, JobStatus.RUNNING)
                or job.run.attempt.stop
            ):
                continue
            fault = rec.gpu_faults[bad[0]]
            reason = f"{gpu_label(rec, bad[0])} of host {rec.host_id} failed: {fault.reason}"
            run = job.run.with_attempt(stop=reason, stop_failure=Failure.GPU_FAILED)
            try:
                self.jobs.update(job.updated(job.updated_at, run=run))
            except Conflict:
                continue  # it changed meanwhile: the host's next heartbeat looks again
            stopped.append(job_id)
        return stopped
