"""GPU faults on the control plane (berth.logic.gpu_faults) over the in-memory fakes: a fatal fault
takes the GPU out of placement, stops the attempt on it as ``GpuFailed`` (retried without using an
attempt, the event naming the GPU), and an admin's clear puts it back."""

from __future__ import annotations

from typing import Any

import pytest

from berth.domain.errors import Forbidden, NotFound
from berth.domain.gpu_health import GpuFaultKind, GpuFaultReport
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller, Role
from berth.domain.workflow import AttemptReport, HeartbeatRequest, ReportEvent
from berth.logic.agent import HostCaller
from berth.logic.gpu_faults import NoGpuFault, clear_gpu_fault
from berth.logic.snapshot import scheduler_host
from tests.unit.test_workflow_services import World, _ref

ADMIN = Caller(tenant="platform", principal="arn:aws:iam::1:user/admin", role=Role.ADMIN)
MEMBER = Caller(tenant="vision", principal="arn:aws:iam::1:user/alice", role=Role.MEMBER)


def _xid(gpu: str, xid: int = 79, fault_id: str = "f1") -> GpuFaultReport:
    return GpuFaultReport(fault_id=fault_id, gpu_id=gpu, kind=GpuFaultKind.XID, xid=xid)


def _beat(w: World, host: str, *faults: GpuFaultReport, attempts: Any = ()) -> dict[str, Any]:
    return w.agent.heartbeat(
        HostCaller(host, ""), HeartbeatRequest(attempts=list(attempts), gpu_faults=list(faults))
    )


def test_a_fatal_fault_takes_the_gpu_out_of_placement() -> None:
    w = World(hosts=1, gpus=2)
    _beat(w, "h0", _xid("GPU-h0-1"))
    rec = w.hosts.get("h0")
    assert rec is not None and rec.degraded and rec.faulted_gpu_ids == {"GPU-h0-1"}
    assert rec.free_gpu_ids == ("GPU-h0-0",)
    host = scheduler_host(rec, w.clock())
    # the host still takes work on its other GPU; its size stays 2 (a 2-GPU job is not infeasible:
    # the GPU comes back once repaired and cleared)
    assert (host.gpus, host.free_gpus, host.healthy) == (2, 1, True)
    # a two-GPU job no longer fits; a one-GPU job lands on the healthy GPU
    two, one = w.submit(gpus=2), w.submit(gpus=1)
    for job in (two, one):
        w.workflow.await_placement(job.id, f"place-{job.id}")
    w.scheduler.run_pass()
    assert w.job(two.id).status is JobStatus.QUEUED
    assert w.held() == ["GPU-h0-0"]


def test_the_job_on_a_failed_gpu_is_stopped_and_retried_without_using_an_attempt() -> None:
    w = World(hosts=2, gpus=1)
    job, host = w.run_to_running(w.submit(retry={"max_attempts": 1}))
    gpu = f"GPU-{host}-0"
    beat = _beat(w, host, _xid(gpu), attempts=[_ref(w.job(job.id))])
    # the stop is in the very answer that reported the fault
    [stop] = beat["directives"]
    assert stop["action"] == "stop" and f"GPU 0 ({gpu}) of host {host} failed: XID 79" in stop["reason"]
    ref = _ref(w.job(job.id))
    w.agent.report(HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.CANCELED))
    result = w.workflow.classify_failure(job.id, 1, "Berth.Canceled", "stopped")
    after = w.job(job.id)
    # max_attempts is 1, yet a GPU's failure is not the job's: it is placed again
    assert result["action"] == "retry" and after.status is JobStatus.RETRYING
    assert after.run.counted_failures == 0 and after.reason.startswith("GpuFailed (transient): GPU 0")
    assert "XID 79 (GPU has fallen off the bus)" in after.reason and "not counted" in after.reason
    assert w.jobs.events(job.id)[-1].reason == after.reason
    assert after.run.excluded_hosts == ()  # only the GPU is out, not its host
    assert w.workflow.requeue(job.id) == {"outcome": "queued"}
    w.workflow.await_placement(job.id, "place-again")
    w.scheduler.run_pass()
    other = "h1" if host == "h0" else "h0"
    assert w.held() == [f"GPU-{other}-0"]  # the failed GPU is never given again


def test_faults_are_level_triggered_an_attempt_placed_on_a_faulted_gpu_is_stopped_too() -> None:
    w = World(hosts=1, gpus=1)
    job, host = w.run_to_running(w.submit())
    w.hosts.add_gpu_faults(host, {"GPU-h0-0": _stored("GPU-h0-0", w)})  # recorded, nothing stopped yet
    beat = _beat(w, host, attempts=[_ref(w.job(job.id))])  # the next heartbeat, with no report
    assert [d["action"] for d in beat["directives"]] == ["stop"]
    assert w.job(job.id).run.attempt.stop_failure is not None


def _stored(gpu: str, w: World) -> Any:
    from berth.domain.gpu_health import GpuFault

    return GpuFault.of(_xid(gpu, 48, "f0"), w.clock())


def test_the_first_fault_of_a_gpu_is_kept_and_unknown_gpus_and_application_xids_ignored() -> None:
    w = World(hosts=1, gpus=2)
    _beat(
        w, "h0", _xid("GPU-h0-0", 79, "a"), _xid("GPU-h0-0", 48, "b"), _xid("GPU-x-9"), _xid("GPU-h0-1", 13)
    )
    _beat(w, "h0", _xid("GPU-h0-0", 95, "c"))
    rec = w.hosts.get("h0")
    assert rec is not None and set(rec.gpu_faults) == {"GPU-h0-0"}
    assert rec.gpu_faults["GPU-h0-0"].fault_id == "a" and rec.gpu_faults["GPU-h0-0"].xid == 79


def test_warnings_are_shown_while_reported_and_never_take_a_gpu_out() -> None:
    w = World(hosts=1, gpus=1)
    hot = GpuFaultReport(fault_id="t1", gpu_id="GPU-h0-0", kind=GpuFaultKind.THERMAL_SLOWDOWN, value=91)
    _beat(w, "h0", hot)
    rec = w.hosts.get("h0")
    assert rec is not None and not rec.degraded and rec.free_gpu_ids == ("GPU-h0-0",)
    assert set(rec.gpu_warnings) == {"GPU-h0-0"}
    _beat(w, "h0")
    rec = w.hosts.get("h0")
    assert rec is not None and rec.gpu_warnings == {}


def test_an_admin_clears_a_fault_and_the_agent_is_told_to_forget_it() -> None:
    w = World(hosts=1, gpus=2)
    _beat(w, "h0", _xid("GPU-h0-1"))
    with pytest.raises(Forbidden):
        clear_gpu_fault(MEMBER, w.hosts, "h0", "1")
    with pytest.raises(NotFound):
        clear_gpu_fault(ADMIN, w.hosts, "nowhere", "1")
    with pytest.raises(NotFound):
        clear_gpu_fault(ADMIN, w.hosts, "h0", "7")
    with pytest.raises(NoGpuFault):
        clear_gpu_fault(ADMIN, w.hosts, "h0", "GPU-h0-0")
    rec = w.hosts.get("h0")
    assert rec is not None and rec.degraded  # the refusals changed nothing
    out = clear_gpu_fault(ADMIN, w.hosts, "h0", "1")  # by index
    assert out == {
        "host_id": "h0",
        "gpu_id": "GPU-h0-1",
        "cleared": "XID 79 (GPU has fallen off the bus)",
        "fault_id": "f1",
    }
    rec = w.hosts.get("h0")
    assert rec is not None and not rec.degraded and rec.free_gpu_ids == ("GPU-h0-0", "GPU-h0-1")
    # an agent that still reports the cleared fault is told to forget it, and it is not recorded again
    beat = _beat(w, "h0", _xid("GPU-h0-1"))
    assert beat["directives"] == [
        {
            "job_id": None,
            "attempt": None,
            "action": "clear-gpu-fault",
            "reason": "an admin cleared this fault",
            "gpu_id": "GPU-h0-1",
            "fault_id": "f1",
        }
    ]
    rec = w.hosts.get("h0")
    assert rec is not None and not rec.degraded
    # a new fault of the same GPU takes it out again
    _beat(w, "h0", _xid("GPU-h0-1", 48, "f2"))
    rec = w.hosts.get("h0")
    assert rec is not None and rec.faulted_gpu_ids == {"GPU-h0-1"}


def test_faults_survive_a_registration() -> None:
    w = World(hosts=1, gpus=2)
    _beat(w, "h0", _xid("GPU-h0-0"))
    w.register("h0", 2)
    rec = w.hosts.get("h0")
    assert rec is not None and rec.faulted_gpu_ids == {"GPU-h0-0"}


def test_capacity_shows_the_degraded_host_and_its_gpu() -> None:
    from berth.logic.fleet import FleetService

    w = World(hosts=1, gpus=2)
    _beat(w, "h0", _xid("GPU-h0-1"))
    cap = FleetService(w.source).capacity(ADMIN)
    [host] = cap["hosts"]
    assert host["degraded"] and host["free_gpus"] == 1 and host["used_gpus"] == 0
    [row] = host["gpu_faults"]
    assert (row["gpu_id"], row["index"], row["severity"], row["xid"]) == ("GPU-h0-1", 1, "fatal", 79)
    assert cap["totals"]["faulted_gpus"] == 1 and cap["totals"]["free_gpus"] == 1


def test_a_heartbeat_with_an_unknown_fault_kind_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        HeartbeatRequest.model_validate({"gpu_faults": [{"fault_id": "x", "gpu_id": "g", "kind": "smoke"}]})
    with pytest.raises(ValidationError):
        HeartbeatRequest.model_validate(
            {"gpu_faults": [{"fault_id": "x y", "gpu_id": "g", "kind": "xid", "xid": 79}]}
        )


def test_a_host_whose_every_gpu_failed_takes_nothing_and_the_pass_goes_on() -> None:
    w = World(hosts=1, gpus=1)
    _beat(w, "h0", _xid("GPU-h0-0"))
    job = w.submit()
    w.workflow.await_placement(job.id, "place")
    w.scheduler.run_pass()
    assert w.job(job.id).status is JobStatus.QUEUED and w.held() == []
    clear_gpu_fault(ADMIN, w.hosts, "h0", "GPU-h0-0")
    w.scheduler.run_pass()
    assert w.job(job.id).status is JobStatus.STARTING and w.held() == ["GPU-h0-0"]
