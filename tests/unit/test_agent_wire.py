"""The wire between the control plane and its agents (``berth.domain.agent_wire``): what the control
plane writes is exactly what the agent parses, and an agent of this protocol reads a newer control
plane's answers (added fields, a directive it does not know) while a work message of another protocol
is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from berth.domain.agent_wire import (
    PROTOCOL_VERSION,
    ClaimAnswer,
    Directive,
    HeartbeatAnswer,
    RegisterAnswer,
    WorkMessage,
)
from berth.domain.workflow import HeartbeatRequest
from berth.logic.agent import HostCaller
from berth_agent.jobs import Claim
from tests.unit.test_workflow_services import World, _ref


def test_what_the_control_plane_writes_the_agent_parses() -> None:
    w = World(hosts=1)
    registered = w.agent.register(HostCaller("h0", "arn:host/h0"), w.hosts.get("h0").inventory)  # type: ignore[union-attr]
    answer = RegisterAnswer.model_validate(json.loads(json.dumps(registered)))
    assert (answer.host_id, answer.protocol) == ("h0", PROTOCOL_VERSION)
    assert answer.outage_tolerance_s == w.settings.outage_tolerance_s and answer.lease_s == w.settings.lease_s

    job = w.submit()
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    w.workflow.dispatch_onprem(job.id, 1, "d")
    (host, body), *_ = w.queues.sent
    work = WorkMessage.model_validate_json(body)
    assert (work.job_id, work.attempt, work.protocol, work.kind) == (job.id, 1, 1, "run")

    ref = _ref(w.job(job.id))
    claimed = w.agent.claim(HostCaller(host, ""), ref)
    claim = Claim.parse(json.loads(json.dumps(claimed)))  # the agent's own parse, through ClaimAnswer
    assert (claim.job_id, claim.attempt, claim.tenant) == (job.id, 1, job.tenant)
    assert claim.spec == job.spec and claim.gpu_ids == work.gpu_ids

    beat = w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[ref]))
    parsed = HeartbeatAnswer.model_validate(json.loads(json.dumps(beat)))
    assert parsed.lease_expires_at is not None and not parsed.reregister


def test_an_agent_reads_a_newer_control_planes_answers() -> None:
    """Fields a later control plane adds are ignored; a directive action it invents is kept as a
    string (the agent logs and ignores it); nothing of it is an error."""
    register = {
        "host_id": "h0",
        "queue_url": "q",
        "lease_expires_at": "2030-01-01T00:00:00Z",
        "lease_s": 90,
        "outage_tolerance_s": 300,
        "heartbeat_s": 20,
        "protocol": 1,
        "some_future_field": {"x": 1},
    }
    assert RegisterAnswer.model_validate(register).outage_tolerance_s == 300
    beat = HeartbeatAnswer.model_validate(
        {
            "lease_expires_at": None,
            "directives": [{"action": "quarantine", "job_id": "j", "attempt": 1}],
            "new": 1,
        }
    )
    assert beat.directives == (Directive(action="quarantine", job_id="j", attempt=1),)


def test_a_newer_agent_reads_an_older_control_planes_answers() -> None:
    """A control plane that predates ``outage_tolerance_s`` (and ``reregister`` in plain answers):
    the defaults are the old behaviour."""
    old = RegisterAnswer.model_validate({"host_id": "h0", "queue_url": "q", "lease_s": 90, "heartbeat_s": 20})
    assert old.outage_tolerance_s == 0 and old.protocol == 1
    assert HeartbeatAnswer.model_validate({"lease_expires_at": "2030-01-01T00:00:00Z"}).directives == ()


@pytest.mark.parametrize(
    "change",
    [{"protocol": 2}, {"kind": "drain"}, {"attempt": 0}, {"job_id": ""}],
)
def test_a_work_message_of_another_protocol_or_malformed_is_refused(change: dict[str, object]) -> None:
    good = WorkMessage(
        job_id="j",
        attempt=1,
        fencing_token="t",
        rank=0,
        world_size=1,
        gpu_ids=("GPU-0",),
        claim_by=datetime(2030, 1, 1, tzinfo=UTC),
    ).model_dump(mode="json")
    assert WorkMessage.model_validate(good).job_id == "j"
    with pytest.raises(ValidationError):
        WorkMessage.model_validate({**good, **change})


def test_a_claim_answer_round_trips() -> None:
    spec = {
        "name": "t",
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu_type": "A100", "gpus": 2},
    }
    answer = ClaimAnswer.model_validate(
        {"job_id": "j", "attempt": 2, "tenant": "vision", "spec": spec, "gpu_ids": ["a", "b"], "rank": 0}
    )
    again = ClaimAnswer.model_validate_json(answer.model_dump_json(exclude_none=True))
    assert again == answer and again.world_size == 1 and again.master_port is None


def test_a_heartbeat_tells_the_host_record_what_its_cache_holds() -> None:
    from berth.domain.agent_wire import MAX_CACHED_DATASETS, CachedDataset
    from berth.logic.snapshot import scheduler_host

    w = World(hosts=1)
    caller = HostCaller("h0", "arn:host/h0")
    entry = {"source": "s3://data/vision/imagenet/", "version": "ab12", "size_bytes": 10**9}
    # what the agent sends (its client's JSON) is what the API's model takes
    w.agent.heartbeat(caller, HeartbeatRequest.model_validate({"cached_datasets": [entry]}))
    rec = w.hosts.get("h0")
    assert rec is not None and rec.cached_datasets == (CachedDataset.model_validate(entry),)
    assert scheduler_host(rec, w.clock()).cached_datasets == frozenset({entry["source"]})
    # a beat without the field leaves it as stored; an empty list clears it
    w.agent.heartbeat(caller, HeartbeatRequest())
    assert w.hosts.get("h0").cached_datasets != ()  # type: ignore[union-attr]
    w.agent.heartbeat(caller, HeartbeatRequest(cached_datasets=[]))
    assert w.hosts.get("h0").cached_datasets == ()  # type: ignore[union-attr]
    # bounded and strict: too many entries, a non-S3 source, an unknown field are refused (422)
    for bad in (
        [entry] * (MAX_CACHED_DATASETS + 1),
        [{**entry, "source": "dataset://glue"}],
        [{**entry, "source": "s3://" + "x" * 2000}],
        [{**entry, "size_bytes": -1}],
        [{**entry, "extra": 1}],
    ):
        with pytest.raises(ValidationError):
            HeartbeatRequest.model_validate({"cached_datasets": bad})


def test_checkpoints_in_heartbeats_and_the_final_report_reach_the_job() -> None:
    from datetime import timedelta

    from berth.domain.job import iso
    from berth.domain.workflow import AttemptReport

    w = World(hosts=1)
    job = w.submit()
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    w.workflow.dispatch_onprem(job.id, 1, "d")
    (host, _), *_ = w.queues.sent
    caller = HostCaller(host, "")
    ref = _ref(w.job(job.id))
    w.agent.claim(caller, ref)
    assert w.job(job.id).public()["checkpoint"] is None
    now = w.clock()

    def beat(at: datetime, size: int, **change: object) -> None:
        ck = {**ref.model_dump(), "at": at.isoformat(), "size_bytes": size, **change}
        w.agent.heartbeat(
            caller, HeartbeatRequest.model_validate({"attempts": [ref.model_dump()], "checkpoints": [ck]})
        )

    beat(now - timedelta(seconds=30), 1000)
    assert w.job(job.id).public()["checkpoint"] == {
        "at": iso(now - timedelta(seconds=30)),
        "size_bytes": 1000,
        "attempt": 1,
    }
    version = w.job(job.id).version
    beat(now - timedelta(seconds=60), 5)  # older than the stored one: nothing written
    beat(now - timedelta(seconds=30), 1000)  # the same: nothing written either
    assert w.job(job.id).version == version and w.job(job.id).run.checkpoint_bytes == 1000
    beat(now + timedelta(hours=1), 2000)  # a host clock ahead is clamped to the control plane's
    assert w.job(job.id).run.checkpoint_at == now and w.job(job.id).run.checkpoint_bytes == 2000
    beat(now + timedelta(hours=2), 9, fencing_token="not-the-token")  # another token's: ignored
    assert w.job(job.id).run.checkpoint_bytes == 2000
    # the final report carries the checkpoint synced after the job stopped
    w.clock.now = now + timedelta(seconds=10)
    w.agent.report(
        caller,
        AttemptReport.model_validate(
            {
                **ref.model_dump(),
                "event": "failed",
                "failure": "preempted",
                "checkpoint": {"at": w.clock().isoformat(), "size_bytes": 3000},
            }
        ),
    )
    assert w.job(job.id).run.checkpoint_bytes == 3000 and w.job(job.id).public()["checkpoint"]["attempt"] == 1
    # bounded and strict on the wire
    for bad in ({"size_bytes": -1}, {"size_bytes": 2**60}, {"extra": 1}):
        with pytest.raises(ValidationError):
            AttemptReport.model_validate(
                {
                    **ref.model_dump(),
                    "event": "failed",
                    "checkpoint": {"at": now.isoformat(), "size_bytes": 1, **bad},
                }
            )


def test_gpu_fields_of_a_directive_appear_only_on_gpu_directives() -> None:
    """``clear-gpu-fault`` carries ``gpu_id`` and ``fault_id``; the other directives are written as
    before, so an older agent's view is unchanged (and it logs and ignores ``clear-gpu-fault``)."""
    assert Directive(action="drain").model_dump(mode="json") == {
        "job_id": None,
        "attempt": None,
        "action": "drain",
        "reason": "",
    }
    clear = Directive(action="clear-gpu-fault", gpu_id="GPU-a", fault_id="f1").model_dump(mode="json")
    assert (clear["gpu_id"], clear["fault_id"]) == ("GPU-a", "f1")
    assert HeartbeatAnswer.model_validate({"directives": [clear]}).directives[0].fault_id == "f1"
    # a heartbeat without gpu_faults (an agent that predates them) is what it always was
    assert HeartbeatRequest.model_validate({"healthy": True}).gpu_faults == []
