"""The local cloud's fault state and endpoint, the fault CLI's requests, the Batch runner's helpers."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from berth_tools.cli import fault_cmd
from berth_tools.localcloud import faults, local_batch
from berth_tools.localcloud.faults import FaultState, instance_type_matches
from berth_tools.localcloud.metering import ObservedRequest
from berth_tools.localcloud.state_dir import StateDir

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("configured", "faulted", "matches"),
    [
        ("g5.xlarge", "g5.xlarge", True),
        ("g5.xlarge", "g5.2xlarge", False),
        ("g5", "g5.12xlarge", True),
        ("g5.xlarge", "g5", True),
        ("g6", "g5.xlarge", False),
        ("optimal", "g5.xlarge", False),
    ],
)
def test_instance_type_matching(configured: str, faulted: str, matches: bool) -> None:
    assert instance_type_matches(configured, faulted) is matches


def test_capacity_blocks_only_when_every_type_of_the_environment_is_faulted() -> None:
    state = FaultState()
    state.apply({"kind": "capacity", "region": "us-east-1", "instance_type": "g5.xlarge"})
    assert state.capacity_blocked("us-east-1", ["g5.xlarge"]) == "g5.xlarge"
    assert state.capacity_blocked("us-east-1", ["g5.xlarge", "g6.xlarge"]) is None  # another type has room
    assert state.capacity_blocked("us-west-2", ["g5.xlarge"]) is None
    state.apply({"kind": "clear"})
    assert state.capacity_blocked("us-east-1", ["g5.xlarge"]) is None


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ([], 400),
        ({"kind": "melt"}, 400),
        ({"kind": "region-outage"}, 400),
        ({"kind": "region-outage", "region": "../etc"}, 400),
        ({"kind": "capacity", "region": "us-east-1"}, 400),
        ({"kind": "spot-interrupt", "job_id": "j-1"}, 404),  # no runner knows the job
        ({"kind": "partition"}, 400),
        ({"kind": "partition", "host_id": "../h"}, 400),
        ({"kind": "heal", "host_id": 7}, 400),
        ({"kind": "ddb-throttle"}, 400),
        ({"kind": "ddb-throttle", "fraction": 0}, 400),
        ({"kind": "ddb-throttle", "fraction": 1.5}, 400),
        ({"kind": "ddb-throttle", "fraction": "0.5"}, 400),
        ({"kind": "ddb-throttle", "fraction": True}, 400),
        ({"kind": "ddb-throttle", "fraction": 0.5, "seed": "x"}, 400),
        ({"kind": "sqs-duplicate", "fraction": -0.1}, 400),
        ({"kind": "agent-kill"}, 400),
        ({"kind": "agent-kill", "host_id": "h1"}, 404),  # no process agents
        ({"kind": "lambda-kill", "function": ""}, 400),
        ({"kind": "lambda-kill", "function": "a b"}, 400),
        ({"kind": "lambda-kill", "function": "Scheduler"}, 404),  # no runtime
    ],
)
def test_bad_requests_are_refused_and_change_nothing(body: object, status: int) -> None:
    state = FaultState()
    with pytest.raises(faults.FaultError) as caught:
        state.apply(body)
    assert caught.value.status == status
    assert state.snapshot() == {
        "region_outages": [],
        "capacity": [],
        "control_plane_outage": False,
        "partitions": [],
        "ddb_throttle": None,
        "sqs_duplicate": None,
    }


def test_spot_interrupt_goes_to_the_runner() -> None:
    state = FaultState()
    state.spot_interrupt_handler = lambda job_id: "batch-1" if job_id == "j-1" else None
    assert state.apply({"kind": "spot-interrupt", "job_id": "j-1"})["batch_job_id"] == "batch-1"


def test_the_endpoint_answers_only_locally_and_only_json() -> None:
    assert faults.handle_http("POST", "10.0.0.5", b"{}")[0] == 403
    assert faults.handle_http("POST", "127.0.0.1", b"not json")[0] == 400
    assert faults.handle_http("DELETE", "127.0.0.1", b"")[0] == 405
    assert faults.handle_http("GET", "127.0.0.1", b"")[0] == 200


def _signed(service: str, region: str) -> ObservedRequest:
    auth = f"AWS4-HMAC-SHA256 Credential=AKIA/20260101/{region}/{service}/aws4_request, SignedHeaders=host"
    return ObservedRequest("POST", "/", "", [("Authorization", auth)], b"")


def test_an_outage_answers_503_for_batch_and_ec2_of_its_region_only() -> None:
    state = FaultState()
    state.apply({"kind": "region-outage", "region": "eu-west-1"})
    batch = faults.outage_answer(_signed("batch", "eu-west-1"), state)
    assert batch is not None and batch[0] == 503
    assert json.loads(batch[2])["__type"] == "ServiceUnavailable"
    ec2 = faults.outage_answer(_signed("ec2", "eu-west-1"), state)
    assert ec2 is not None and b"<Code>ServiceUnavailable</Code>" in ec2[2]
    assert faults.outage_answer(_signed("sqs", "eu-west-1"), state) is None
    assert faults.outage_answer(_signed("batch", "us-east-1"), state) is None


def test_a_control_plane_outage_lasts_until_cleared() -> None:
    state = FaultState()
    assert not state.control_plane_down()
    answer = state.apply({"kind": "control-plane-outage"})
    assert state.control_plane_down() and answer["faults"]["control_plane_outage"] is True
    state.apply({"kind": "clear"})
    assert not state.control_plane_down() and state.snapshot()["control_plane_outage"] is False


def test_a_partition_lasts_until_healed_or_cleared() -> None:
    state = FaultState()
    answer = state.apply({"kind": "partition", "host_id": "h1"})
    assert answer["host_id"] == "h1" and answer["faults"]["partitions"] == ["h1"]
    state.apply({"kind": "partition", "host_id": "h2"})
    assert state.partitioned("h1") and state.partitioned("h2") and not state.partitioned("h3")
    assert state.apply({"kind": "heal", "host_id": "h1"})["faults"]["partitions"] == ["h2"]
    state.apply({"kind": "heal", "host_id": "h9"})  # healing a host not partitioned is no error
    state.apply({"kind": "clear"})
    assert not state.partitioned("h2") and state.snapshot()["partitions"] == []


def test_host_of_a_principal() -> None:
    assert faults.host_of("arn:aws:iam::123456789012:user/host-gpu-01") == "gpu-01"
    assert faults.host_of("arn:aws:iam::123456789012:user/alice") is None
    assert faults.host_of("arn:aws:iam::123456789012:user/host-") is None
    assert faults.host_of("arn:aws:sts::123456789012:assumed-role/host-x/s") is None


def _ddb(operation: str = "GetItem", target: str = "DynamoDB_20120810") -> ObservedRequest:
    auth = "AWS4-HMAC-SHA256 Credential=AKIA/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host"
    return ObservedRequest(
        "POST", "/", "", [("Authorization", auth), ("X-Amz-Target", f"{target}.{operation}")], b""
    )


def test_ddb_throttle_answers_dynamodbs_error_for_the_seeded_fraction_of_calls() -> None:
    state = FaultState()
    assert faults.fault_answer(_ddb(), state) is None
    answer = state.apply({"kind": "ddb-throttle", "fraction": 0.5, "seed": 7})
    assert (answer["fraction"], answer["seed"]) == (0.5, 7)
    hits = [faults.fault_answer(_ddb(), state) for _ in range(200)]
    throttled = [h for h in hits if h is not None]
    assert 60 < len(throttled) < 140
    status, headers, payload = throttled[0]
    assert status == 400
    assert json.loads(payload)["__type"].endswith("#ProvisionedThroughputExceededException")
    assert ("x-amzn-ErrorType", "ProvisionedThroughputExceededException") in headers
    assert state.snapshot()["ddb_throttle"] == {
        "fraction": 0.5,
        "seed": 7,
        "calls": 200,
        "hits": len(throttled),
    }
    # the same seed, the same calls throttled
    again = FaultState()
    again.apply({"kind": "ddb-throttle", "fraction": 0.5, "seed": 7})
    assert [faults.fault_answer(_ddb(), again) is not None for _ in range(200)] == [
        h is not None for h in hits
    ]
    # other services and DynamoDB Streams are never throttled; every DynamoDB call is at 1
    state.apply({"kind": "ddb-throttle", "fraction": 1})
    assert faults.fault_answer(_signed("sqs", "us-east-1"), state) is None
    assert faults.fault_answer(_ddb("GetRecords", "DynamoDBStreams_20120810"), state) is None
    assert all(faults.fault_answer(_ddb(op), state) for op in ("PutItem", "Query", "TransactWriteItems"))
    state.apply({"kind": "clear"})
    assert faults.fault_answer(_ddb(), state) is None and state.snapshot()["ddb_throttle"] is None


def test_botocore_reads_the_throttle_answer_as_dynamodbs_error() -> None:
    import botocore.session
    from botocore.model import ServiceModel
    from botocore.parsers import create_parser

    state = FaultState()
    state.apply({"kind": "ddb-throttle", "fraction": 1})
    answer = faults.fault_answer(_ddb(), state)
    assert answer is not None
    loader = botocore.session.get_session().get_component("data_loader")
    model = ServiceModel(loader.load_service_model("dynamodb", "service-2"), "dynamodb")
    parsed = create_parser("json").parse(
        {"status_code": answer[0], "headers": dict(answer[1]), "body": answer[2]},
        model.operation_model("GetItem").output_shape,
    )
    assert parsed["Error"]["Code"] == "ProvisionedThroughputExceededException"


def test_sqs_duplicate_draws_a_seeded_fraction_until_cleared() -> None:
    state = FaultState()
    assert not state.duplicate_sqs_delivery()
    state.apply({"kind": "sqs-duplicate", "fraction": 0.25, "seed": 1})
    draws = [state.duplicate_sqs_delivery() for _ in range(400)]
    assert 50 < sum(draws) < 150
    snapshot = state.snapshot()["sqs_duplicate"]
    assert snapshot == {"fraction": 0.25, "seed": 1, "calls": 400, "hits": sum(draws)}
    state.apply({"kind": "clear"})
    assert not state.duplicate_sqs_delivery() and state.snapshot()["sqs_duplicate"] is None


def test_agent_kill_and_lambda_kill_go_to_their_owners() -> None:
    state = FaultState()
    state.agent_kill_handler = lambda host: 4242 if host == "h1" else None
    assert state.apply({"kind": "agent-kill", "host_id": "h1"}) | {"faults": None} == {
        "kind": "agent-kill",
        "host_id": "h1",
        "killed_pid": 4242,
        "faults": None,
    }
    with pytest.raises(faults.FaultError) as caught:
        state.apply({"kind": "agent-kill", "host_id": "h2"})
    assert caught.value.status == 404
    state.lambda_kill_handler = lambda name: (
        ("Berth-SchedulerFunction-X", 77) if name == "Scheduler" else None
    )
    answer = state.apply({"kind": "lambda-kill", "function": "Scheduler"})
    assert (answer["kind"], answer["function"], answer["pid"]) == (
        "lambda-kill",
        "Berth-SchedulerFunction-X",
        77,
    )
    with pytest.raises(faults.FaultError) as caught:
        state.apply({"kind": "lambda-kill", "function": "Nothing"})
    assert caught.value.status == 404


def test_lambda_kill_picks_the_function_one_means() -> None:
    from berth_tools.localcloud.lambda_runtime import functions_named

    names = [
        "Berth-WorkflowWorkflowFunctionE21C4BD9-a1",
        "Berth-WorkflowSchedulerFunction170207D4-b2",
        "Berth-WorkflowAgentApiFunctionC7A1911E-c3",
        "Berth-ApiFunction685AAB5B-d4",
    ]
    assert functions_named(names, "Workflow") == [names[0]]
    assert functions_named(names, "Scheduler") == [names[1]]
    assert functions_named(names, "Api") == [names[3]]
    assert functions_named(names, "AgentApi") == [names[2]]
    assert functions_named(names, "Berth") == names  # contained in every name: any of them
    assert functions_named(names, "E21C4BD9") == [names[0]]
    assert functions_named(names, "Nothing") == []


def test_cli_request_bodies() -> None:
    assert fault_cmd.request_body("capacity", ["us-east-1", "g5.xlarge"]) == {
        "kind": "capacity",
        "region": "us-east-1",
        "instance_type": "g5.xlarge",
    }
    assert fault_cmd.request_body("clear", []) == {"kind": "clear"}
    assert fault_cmd.request_body("control-plane-outage", []) == {"kind": "control-plane-outage"}
    with pytest.raises(ValueError, match="usage"):
        fault_cmd.request_body("control-plane-outage", ["now"])
    assert fault_cmd.request_body("show", []) is None
    with pytest.raises(ValueError, match="usage"):
        fault_cmd.request_body("spot-interrupt", [])
    assert fault_cmd.request_body("partition", ["h1"]) == {"kind": "partition", "host_id": "h1"}
    assert fault_cmd.request_body("heal", ["h1"]) == {"kind": "heal", "host_id": "h1"}
    assert fault_cmd.request_body("ddb-throttle", ["0.2"]) == {"kind": "ddb-throttle", "fraction": 0.2}
    assert fault_cmd.request_body("sqs-duplicate", ["1", "42"]) == {
        "kind": "sqs-duplicate",
        "fraction": 1.0,
        "seed": 42,
    }
    assert fault_cmd.request_body("agent-kill", ["h1"]) == {"kind": "agent-kill", "host_id": "h1"}
    assert fault_cmd.request_body("lambda-kill", ["Scheduler"]) == {
        "kind": "lambda-kill",
        "function": "Scheduler",
    }
    for kind, args in (("ddb-throttle", []), ("ddb-throttle", ["half"]), ("sqs-duplicate", ["0.5", "x"])):
        with pytest.raises(ValueError, match="usage"):
            fault_cmd.request_body(kind, args)
    with pytest.raises(ValueError, match="usage"):
        fault_cmd.request_body("partition", [])


def test_cli_summary_names_every_fault_in_force() -> None:
    state = FaultState()
    state.apply({"kind": "partition", "host_id": "h1"})
    state.apply({"kind": "ddb-throttle", "fraction": 0.5, "seed": 1})
    line = fault_cmd.summary(None, {"faults": state.snapshot()})
    assert "partitioned: h1" in line and "ddb-throttle 0.5 (0/0 hit)" in line
    killed = {"kind": "agent-kill", "host_id": "h1", "killed_pid": 9, "faults": state.snapshot()}
    assert fault_cmd.summary("agent-kill", killed).startswith("agent-kill: agent of h1 (pid 9) killed")


def test_cli_finds_the_front_door_from_the_state_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="berth local up"):
        fault_cmd.fault_url(tmp_path)
    state = StateDir(tmp_path)
    state.write_env({"BERTH_API_URL": "http://127.0.0.1:4321/api"})
    assert fault_cmd.fault_url(tmp_path) == "http://127.0.0.1:4321/_berth/fault"


def test_time_factor() -> None:
    assert local_batch.time_factor({}) == 1.0
    assert local_batch.time_factor({"BERTH_TIME_FACTOR": "60"}) == 60.0
    assert local_batch.time_factor({"BERTH_TIME_FACTOR": "-1"}) == 1.0
    assert local_batch.time_factor({"BERTH_TIME_FACTOR": "fast"}) == 1.0


def test_job_vcpus_prefers_the_submit_overrides() -> None:
    definition = SimpleNamespace(_get_resource_requirement=lambda req, default: "4")
    job = SimpleNamespace(container_overrides={}, job_definition=definition)
    assert local_batch.job_vcpus(job) == 4
    job.container_overrides = {"resourceRequirements": [{"type": "VCPU", "value": "2"}]}
    assert local_batch.job_vcpus(job) == 2


def test_the_state_dir_is_found_without_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from berth_tools.localcloud.state_dir import STATE_DIR_ENV, locate

    explicit, sourced, here = tmp_path / "explicit", tmp_path / "sourced", tmp_path / "clone"
    monkeypatch.chdir(tmp_path)
    assert locate(explicit, {STATE_DIR_ENV: str(sourced)}) == explicit.resolve()  # the flag first
    assert locate(None, {STATE_DIR_ENV: str(sourced)}) == sourced  # then the sourced env file
    (here / ".berth" / "local").mkdir(parents=True)
    StateDir(here / ".berth" / "local").write_env({"BERTH_API_URL": "http://127.0.0.1:1/api"})
    monkeypatch.chdir(here)
    assert locate(None, {}) == (here / ".berth" / "local").resolve()  # then .berth/local here
    monkeypatch.chdir(tmp_path)
    # nothing here: the repository's .berth/local if a local cloud runs there, else this directory's
    assert locate(None, {}) in ((tmp_path / ".berth" / "local").resolve(), REPO / ".berth" / "local")


def test_gpu_error_reaches_the_agent_process_faults_file(tmp_path: Path) -> None:
    """`gpu-error HOST [GPU]`: validated here, written by the host's agent process into the file its
    simulated GPU health source polls (berth_agent.gpu_health, tested there)."""
    from berth_tools.localcloud.process_agents import AgentProcess

    agent = AgentProcess(
        host_id="h1",
        gpu_type="H100",
        gpus=2,
        home=tmp_path,
        api_url="http://x",
        endpoint_url="http://y",
        region="us-east-1",
        artifacts_bucket="a",
        data_bucket="d",
    )
    assert agent.config()["gpus"]["simulated"]["faults_file"] == str(tmp_path / "gpu-faults.jsonl")
    state = FaultState()
    state.gpu_error_handler = lambda host, gpu, xid: (
        agent.inject_gpu_error(gpu, xid) if host == "h1" else None
    )
    for body, status in [
        ({"kind": "gpu-error"}, 400),
        ({"kind": "gpu-error", "host_id": "h1", "gpu": "a b"}, 400),
        ({"kind": "gpu-error", "host_id": "h1", "xid": "79"}, 400),
        ({"kind": "gpu-error", "host_id": "h2"}, 404),  # no agent process of h2
        ({"kind": "gpu-error", "host_id": "h1", "gpu": "5"}, 404),  # h1 has 2 GPUs
    ]:
        with pytest.raises(faults.FaultError) as caught:
            state.apply(body)
        assert caught.value.status == status, body
    assert not agent.gpu_faults_file.exists()
    answer = state.apply({"kind": "gpu-error", "host_id": "h1", "gpu": "1"})
    assert (answer["host_id"], answer["gpu_id"], answer["xid"]) == ("h1", "GPU-sim-h1-1", 79)
    state.apply({"kind": "gpu-error", "host_id": "h1", "gpu": "GPU-sim-h1-0", "xid": 48})
    assert agent.gpu_faults_file.read_text().splitlines() == [
        '{"gpu": "GPU-sim-h1-1", "xid": 79}',
        '{"gpu": "GPU-sim-h1-0", "xid": 48}',
    ]
    assert fault_cmd.request_body("gpu-error", ["h1"]) == {"kind": "gpu-error", "host_id": "h1"}
    assert fault_cmd.request_body("gpu-error", ["h1", "1"]) == {
        "kind": "gpu-error",
        "host_id": "h1",
        "gpu": "1",
    }
    with pytest.raises(ValueError, match="usage"):
        fault_cmd.request_body("gpu-error", [])
    line = fault_cmd.summary("gpu-error", answer)
    assert line.startswith("gpu-error: GPU-sim-h1-1 of h1 reports XID 79")
