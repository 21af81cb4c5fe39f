"""A gang (``resources.nodes`` > 1) in the cloud: one AWS Batch multi-node parallel job, submitted
with one SubmitJob (a ``multinode`` definition, ``nodeOverrides``), ended as soon as one node fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from berth.dal.batch import BotoBatchGateway, RateLimiter
from berth.domain.cloud import (
    GANG_NODE_FAILED,
    BatchJob,
    BatchStatus,
    batch_job_task,
    node_job_id,
    parse_node_job_id,
)
from berth.domain.placement import CloudPlacement
from berth.domain.workflow import Failure
from berth.logic.batch_events import parse_event
from tests.unit.test_cloud_dispatch import CloudWorld

GANG = {"resources": {"gpu_type": "A100", "gpus": 16, "nodes": 2}}


class RecordingBatchClient:
    """A boto3 Batch client that records what the adapter sends."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def describe_job_definitions(self, **kw: Any) -> dict[str, Any]:
        return {"jobDefinitions": []}

    def register_job_definition(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("register_job_definition", kw))
        return {"jobDefinitionArn": f"arn:aws:batch:us-east-1:1:job-definition/{kw['jobDefinitionName']}:1"}

    def submit_job(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("submit_job", kw))
        return {"jobId": f"b-{len(self.calls)}"}


def _submitted(w: CloudWorld, **spec: Any) -> tuple[str, str, str]:
    job = w.place(**spec)
    token = w.dispatch(job)
    w.deliver()
    return job.id, token, w.batch_id(job.id)


def test_a_gang_is_one_multi_node_submission_of_its_nodes_on_on_demand_instances() -> None:
    w = CloudWorld()
    job_id, _, _ = _submitted(w, **GANG)
    placement = w.job(job_id).placement
    assert isinstance(placement, CloudPlacement)
    assert placement.instance_type == "p4d.24xlarge" and placement.instances == 2 and not placement.spot
    (request,) = w.batch.submitted
    assert request.num_nodes == 2 and request.gpus == 8 and request.definition.endswith("-mnp")
    client = RecordingBatchClient()
    gateway = BotoBatchGateway("", RateLimiter(1000.0), log_region="us-east-1")
    gateway._clients[("", request.region)] = gateway._clients[("", request.region, "submit")] = client
    assert gateway.submit(request) == "b-2"
    (_, definition), (_, kw) = client.calls
    assert definition["type"] == "multinode" and "containerProperties" not in definition
    nodes = definition["nodeProperties"]
    assert (nodes["numNodes"], nodes["mainNode"]) == (2, 0)
    (node_range,) = nodes["nodeRangeProperties"]
    assert (
        node_range["targetNodes"] == "0:"
        and node_range["container"]["logConfiguration"]["logDriver"] == "awslogs"
    )
    assert "containerOverrides" not in kw and "arrayProperties" not in kw
    overrides = kw["nodeOverrides"]
    assert overrides["numNodes"] == 2
    (per_node,) = overrides["nodePropertyOverrides"]
    assert per_node["targetNodes"] == "0:"
    assert {"type": "GPU", "value": "8"} in per_node["containerOverrides"]["resourceRequirements"]


def test_a_single_node_job_keeps_its_container_definition_and_overrides() -> None:
    w = CloudWorld()
    _submitted(w, resources={"gpu_type": "A100", "gpus": 8})
    (request,) = w.batch.submitted
    client = RecordingBatchClient()
    gateway = BotoBatchGateway("", RateLimiter(1000.0), log_region="us-east-1")
    gateway._clients[("", request.region)] = gateway._clients[("", request.region, "submit")] = client
    gateway.submit(request)
    (_, definition), (_, kw) = client.calls
    assert definition["type"] == "container" and "containerOverrides" in kw and "nodeOverrides" not in kw
    assert not request.definition.endswith("-mnp") and request.num_nodes == 1


def _node(w: CloudWorld, bid: str, index: int, status: BatchStatus, exit_code: int | None = None) -> str:
    node = node_job_id(bid, index)
    w.batch.jobs[node] = BatchJob(node, w.batch.jobs[bid].name, status, exit_code=exit_code)
    return node


def test_a_failing_child_node_ends_the_gang_as_its_nonzero_exit() -> None:
    w = CloudWorld()
    _, token, bid = _submitted(w, **GANG)
    name = w.batch.jobs[bid].name
    w.batch.set(bid, BatchStatus.RUNNING)
    assert w.cloud.on_event(bid, name) == "running"
    assert w.cloud.on_event(_node(w, bid, 1, BatchStatus.RUNNING), name) == "node"
    assert w.cloud.on_event(_node(w, bid, 1, BatchStatus.FAILED, exit_code=3), name) == "gang-failed"
    ((terminated, reason),) = w.batch.terminated
    assert terminated == bid and reason == f"{GANG_NODE_FAILED}1 exited with code 3"
    assert w.cloud.on_event(bid, name) == "failed"
    assert w.failures_of(token) == [Failure.NONZERO_EXIT.error_name]
    assert w.cloud.on_event(node_job_id(bid, 1), name) == "node"  # the gang has ended: nothing more
    assert len(w.batch.terminated) == 1


def test_node_states_that_end_nothing() -> None:
    w = CloudWorld()
    job_id, _, bid = _submitted(w, **GANG)
    name = w.batch.jobs[bid].name
    w.batch.set(bid, BatchStatus.RUNNING)
    # the main node's failure ends the Batch job by itself; a child that succeeded ends nothing
    assert w.cloud.on_event(_node(w, bid, 0, BatchStatus.FAILED, exit_code=1), name) == "node"
    assert w.cloud.on_event(_node(w, bid, 1, BatchStatus.SUCCEEDED, exit_code=0), name) == "node"
    # a node of another Batch job of the same name, or of an earlier attempt
    assert w.cloud.on_event(node_job_id("other", 1), name) == "stale"
    assert w.cloud.on_event(node_job_id(bid, 1), f"{job_id}-a9") == "stale"
    assert w.batch.terminated == []
    assert parse_node_job_id("abc#2") == ("abc", 2) and parse_node_job_id("abc:2") is None


def test_a_child_nodes_instance_going_away_is_the_clouds_failure_not_the_jobs() -> None:
    w = CloudWorld()
    _, token, bid = _submitted(w, **GANG)
    name = w.batch.jobs[bid].name
    w.batch.set(bid, BatchStatus.RUNNING)
    node = node_job_id(bid, 1)
    w.batch.jobs[node] = BatchJob(node, name, BatchStatus.FAILED, "Host EC2 (instance i-0abc) terminated.")
    assert w.cloud.on_event(node, name) == "gang-failed"
    ((_, reason),) = w.batch.terminated
    assert reason == f"{GANG_NODE_FAILED}1 ended without an exit code: Host EC2 (instance i-0abc) terminated."
    assert w.cloud.on_event(bid, name) == "failed"
    assert w.failures_of(token) == [Failure.SPOT_INTERRUPTION.error_name]  # re-placed, not counted


def test_the_main_nodes_stream_is_the_gangs_when_the_gang_names_none() -> None:
    w = CloudWorld()
    job_id, _, bid = _submitted(w, **GANG)
    name = w.batch.jobs[bid].name
    w.batch.set(bid, BatchStatus.RUNNING)  # the gang itself names no stream
    w.cloud.on_event(bid, name)
    stream = "batch/default/" + "a" * 32
    main = node_job_id(bid, 0)
    w.batch.jobs[main] = BatchJob(main, name, BatchStatus.RUNNING, log_stream=stream)
    assert w.cloud.on_event(main, name) == "node"
    assert w.job(job_id).run.log_stream_of(1) == stream


def test_a_node_event_as_aws_sends_it_names_the_node_and_the_attempt() -> None:
    sample = (Path(__file__).parents[2] / "events" / "eventbridge_batch_node_state_change.json").read_text()
    event = parse_event(sample)
    assert event is not None and event.reported is BatchStatus.FAILED
    assert parse_node_job_id(event.batch_job_id) == ("7d3b8f0e-51c4-4b0a-8f6e-2c9d1a4e6b73", 1)
    assert batch_job_task(event.batch_job_id, event.name) == ("j-01m8rqkqg02mkvssy862k6h083", 1)
