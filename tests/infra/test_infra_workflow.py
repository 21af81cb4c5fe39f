"""Template assertions for the job workflow (infra/berth_infra/workflow.py): the state machine, the
scheduler's trigger path, the notifier, the bus and its policy, the example rule and HostPolicy."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from berth_infra.api import AGENT_ROUTES, API_STAGE_NAME
from tests.infra.conftest import Synthesized

REPO_ROOT = Path(__file__).resolve().parents[2]
ASL_VALIDATOR = REPO_ROOT / "node_modules" / ".bin" / "asl-validator"

#: Placeholders for what CloudFormation fills in at deploy time.
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012"}


def _function(s: Synthesized, handler: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (fn_id, fn)
        for fn_id, fn in s.resources("AWS::Lambda::Function").items()
        if fn["Properties"]["Handler"] == handler
    ]
    return found


def _output_ref(s: Synthesized, output_id: str) -> str:
    return str(s.json["Outputs"][output_id]["Value"]["Ref"])


def _state_machine(s: Synthesized) -> dict[str, Any]:
    (machine,) = s.resources("AWS::StepFunctions::StateMachine").values()
    return machine["Properties"]


def _resolve(value: Any) -> str:
    """A definition fragment with placeholder values for Refs and GetAtts (deploy-time values)."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return PSEUDO.get(value["Ref"], f"placeholder-{value['Ref']}")
    if "Fn::GetAtt" in value:
        logical, _attribute = value["Fn::GetAtt"]
        return f"arn:aws:lambda:us-east-1:123456789012:function:{logical}"
    raise AssertionError(f"unexpected intrinsic in the definition: {value}")


def _definition(s: Synthesized) -> dict[str, Any]:
    body = _state_machine(s)["DefinitionString"]
    if isinstance(body, str):
        return json.loads(body)
    separator, parts = body["Fn::Join"]
    return json.loads(separator.join(_resolve(p) for p in parts))


def _states(s: Synthesized) -> dict[str, dict[str, Any]]:
    return _definition(s)["States"]


# -- the state machine --------------------------------------------------------------------------------


def test_state_machine_is_standard_named_logged_and_traced(synthesized: Synthesized) -> None:
    props = _state_machine(synthesized)
    assert props["StateMachineType"] == "STANDARD"
    # Named, so an execution named after its job makes a duplicate start harmless, and so the
    # functions can name its ARN (the StateMachineArn output) without a reference cycle.
    assert props["StateMachineName"] == "berth-jobs-Berth"
    arn = synthesized.json["Outputs"]["StateMachineArn"]["Value"]["Fn::Join"][1]
    assert arn[-1].endswith(":stateMachine:" + props["StateMachineName"])
    logging = props["LoggingConfiguration"]
    assert logging["Level"] == "ALL"
    # Execution data carries job payloads: never into the logs.
    assert logging["IncludeExecutionData"] is False
    (destination,) = logging["Destinations"]
    log_group = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert synthesized.json["Resources"][log_group]["Type"] == "AWS::Logs::LogGroup"
    assert props["TracingConfiguration"] == {"Enabled": True}


def _validate(definition: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "definition.asl.json"
    path.write_text(json.dumps(definition))
    return subprocess.run(
        [str(ASL_VALIDATOR), "--json-path", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not ASL_VALIDATOR.exists(), reason="node_modules absent (npm ci installs asl-validator)")
def test_definition_passes_asl_validator(synthesized: Synthesized, tmp_path: Path) -> None:
    result = _validate(_definition(synthesized), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not ASL_VALIDATOR.exists(), reason="node_modules absent (npm ci installs asl-validator)")
def test_asl_validator_rejects_a_broken_definition(synthesized: Synthesized, tmp_path: Path) -> None:
    """Guards the check itself: a transition to a state that does not exist must fail."""
    definition = _definition(synthesized)
    definition["States"]["Backoff"]["Next"] = "NoSuchState"
    result = _validate(definition, tmp_path)
    assert result.returncode != 0, result.stdout + result.stderr


def test_definition_resolves_only_known_intrinsics(synthesized: Synthesized) -> None:
    body = _state_machine(synthesized)["DefinitionString"]
    intrinsics = [p for p in body["Fn::Join"][1] if not isinstance(p, str)]
    workflow_fn, _ = _function(synthesized, "berth.handlers.workflow.lambda_handler")
    for part in intrinsics:
        assert part in ({"Ref": "AWS::Partition"}, {"Fn::GetAtt": [workflow_fn, "Arn"]}), part


def test_dispatch_onprem_catches_timeouts_and_heartbeat_loss(synthesized: Synthesized) -> None:
    dispatch = _states(synthesized)["DispatchOnPrem"]
    caught = {error for catch in dispatch["Catch"] for error in catch["ErrorEquals"]}
    assert "States.ALL" in caught or {"States.Timeout", "States.HeartbeatTimeout"} <= caught
    # Every catch classifies the failure (nothing ends the execution unclassified).
    assert {catch["Next"] for catch in dispatch["Catch"]} == {"ClassifyFailure"}
    assert all(catch["ResultPath"] == "$.failure" for catch in dispatch["Catch"])
    assert dispatch["HeartbeatSecondsPath"] == "$.heartbeat_s"
    assert dispatch["TimeoutSecondsPath"] == "$.placed.timeout_s"


def test_an_on_prem_attempt_the_agent_api_completed_skips_finalize(synthesized: Synthesized) -> None:
    """The last rank's report completes the job and answers ``completed: true``: straight to Done.
    Any other success (``completed`` false or absent: an older agent API) runs Finalize."""
    states = _states(synthesized)
    choice = states[states["DispatchOnPrem"]["Next"]]
    assert choice["Type"] == "Choice" and choice["Default"] == "Finalize"
    (rule,) = choice["Choices"]
    assert rule["Next"] == "Done" and states["Done"]["Type"] == "Succeed"
    assert rule["And"] == [
        {"Variable": "$.result.completed", "IsPresent": True},
        {"Variable": "$.result.completed", "BooleanEquals": True},
    ]


def test_placement_and_dispatch_wait_for_a_task_token(synthesized: Synthesized) -> None:
    states = _states(synthesized)
    for name in ("WaitForPlacement", "DispatchOnPrem"):
        state = states[name]
        assert state["Type"] == "Task"
        assert state["Resource"].endswith(":states:::lambda:invoke.waitForTaskToken"), name
        assert state["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token", name
    # The other tasks are plain request/response invocations.
    for name in ("ClassifyFailure", "Requeue", "Finalize"):
        assert states[name]["Resource"].endswith(":states:::lambda:invoke"), name
    assert _definition(synthesized)["StartAt"] == "WaitForPlacement"


def test_retry_loop_backs_off_requeues_and_waits_for_placement_again(synthesized: Synthesized) -> None:
    states = _states(synthesized)
    retry_or_end = states[states["ClassifyFailure"]["Next"]]
    assert retry_or_end["Type"] == "Choice"
    to_backoff = [c for c in retry_or_end["Choices"] if c["Next"] == "Backoff"]
    assert to_backoff == [{"Variable": "$.decision.action", "StringEquals": "retry", "Next": "Backoff"}]
    assert states[retry_or_end["Default"]]["Type"] == "Fail"

    backoff = states["Backoff"]
    assert backoff["Type"] == "Wait"
    assert backoff["SecondsPath"] == "$.decision.backoff_s"
    assert backoff["Next"] == "Requeue"

    requeue = states["Requeue"]
    assert requeue["Parameters"]["Payload"]["action"] == "requeue"
    requeued = states[requeue["Next"]]
    assert requeued["Type"] == "Choice"
    assert {c["Next"] for c in requeued["Choices"]} == {"WaitForPlacement"}

    # The cloud branch: a wait for the Batch outcome, finishing and failing like the on-prem one.
    cloud = states["DispatchCloud"]
    assert cloud["Resource"].endswith(":states:::lambda:invoke.waitForTaskToken")
    assert cloud["Parameters"]["Payload"]["action"] == "dispatch_cloud"
    assert cloud["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert cloud["TimeoutSecondsPath"] == "$.placed.timeout_s"
    assert "HeartbeatSecondsPath" not in cloud  # Batch has no heartbeat; the sweep watches instead
    assert cloud["Next"] == "Finalize"
    (catch,) = cloud["Catch"]
    assert catch == {"ErrorEquals": ["States.ALL"], "ResultPath": "$.failure", "Next": "ClassifyFailure"}


# -- the scheduler and its trigger queue ---------------------------------------------------------------


def test_scheduler_runs_one_pass_at_a_time_from_batched_triggers(synthesized: Synthesized) -> None:
    fn_id, fn = _function(synthesized, "berth.handlers.scheduler.lambda_handler")
    assert fn["Properties"]["ReservedConcurrentExecutions"] == 1
    queue = _output_ref(synthesized, "SchedulerQueueUrl")
    (mapping,) = [
        m["Properties"]
        for m in synthesized.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": fn_id}
    ]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [queue, "Arn"]}
    assert mapping["MaximumBatchingWindowInSeconds"] >= 1
    assert mapping["BatchSize"] > 10
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    # A lost execution start is repaired by the pass: it must know the state machine.
    outputs = synthesized.json["Outputs"]
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["BERTH_STATE_MACHINE_ARN"] == outputs["StateMachineArn"]["Value"]
    assert env["BERTH_SCHEDULER_QUEUE_URL"] == {"Ref": queue}


def test_trigger_queue_has_a_dlq_and_the_timer_fills_it(synthesized: Synthesized) -> None:
    resources = synthesized.json["Resources"]
    queue = _output_ref(synthesized, "SchedulerQueueUrl")
    props = resources[queue]["Properties"]
    dlq = props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
    assert resources[dlq]["Type"] == "AWS::SQS::Queue"
    assert dlq != queue
    assert props["RedrivePolicy"]["maxReceiveCount"] >= 1
    # Longer than the scheduler's timeout, so a message is not redelivered while a pass runs.
    _, fn = _function(synthesized, "berth.handlers.scheduler.lambda_handler")
    assert props["VisibilityTimeout"] >= 6 * fn["Properties"]["Timeout"]

    (timer_id, timer), *others = [
        (rule_id, rule)
        for rule_id, rule in synthesized.resources("AWS::Events::Rule").items()
        if "ScheduleExpression" in rule["Properties"]
    ]
    assert not others
    assert timer["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    (target,) = timer["Properties"]["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [queue, "Arn"]}
    assert json.loads(target["Input"]) == {"reason": "timer"}
    # The queue admits EventBridge's deliveries from this rule only.
    (policy,) = [
        p["Properties"]
        for p in synthesized.resources("AWS::SQS::QueuePolicy").values()
        if p["Properties"]["Queues"] == [{"Ref": queue}]
    ]
    (allow,) = [st for st in policy["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"}
    assert allow["Condition"] == {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [timer_id, "Arn"]}}}


# -- notifications --------------------------------------------------------------------------------------


def test_notifier_reads_the_job_events_stream(synthesized: Synthesized) -> None:
    fn_id, _ = _function(synthesized, "berth.handlers.notifier.lambda_handler")
    (mapping,) = [
        m["Properties"]
        for m in synthesized.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": fn_id}
    ]
    events_table = _output_ref(synthesized, "JobEventsTableName")
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [events_table, "StreamArn"]}
    table = synthesized.json["Resources"][events_table]["Properties"]
    assert table["StreamSpecification"] == {"StreamViewType": "NEW_IMAGE"}
    assert mapping["StartingPosition"] == "TRIM_HORIZON"
    # A second of state changes per invocation (issue 18): fewer invocations and PutEvents per job.
    assert mapping["MaximumBatchingWindowInSeconds"] == 1 and mapping["BatchSize"] == 100
    # The only stream in the stack, read by the notifier only.
    streams = [
        m
        for m in synthesized.resources("AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" in m["Properties"]
    ]
    assert len(streams) == 1


def _runtime_history_grants(s: Synthesized, handler: str) -> list[dict[str, Any]]:
    """The statements of the function's role on the Tenants table's RUNTIMES# items."""
    role = _function(s, handler)[1]["Properties"]["Role"]["Fn::GetAtt"][0]
    tenants = _output_ref(s, "TenantsTableName")
    return [
        st
        for policy in s.resources("AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if tenants in json.dumps(st["Resource"]) and "RUNTIMES#*" in json.dumps(st.get("Condition"))
    ]


def test_the_stream_consumer_learns_completed_runs_and_finalize_no_longer_does(
    synthesized: Synthesized,
) -> None:
    # issue 18: a batch's completed runs are learnt by the job-events stream's consumer, one
    # read-modify-write of each tenant's RUNTIMES# item per batch, instead of one per job in Finalize.
    (grant,) = _runtime_history_grants(synthesized, "berth.handlers.notifier.lambda_handler")
    assert sorted(grant["Action"]) == ["dynamodb:GetItem", "dynamodb:PutItem"]
    assert grant["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["RUNTIMES#*"]}}
    assert grant["Resource"] == {"Fn::GetAtt": [_output_ref(synthesized, "TenantsTableName"), "Arn"]}
    assert _runtime_history_grants(synthesized, "berth.handlers.workflow.lambda_handler") == []


def _trigger_grants(s: Synthesized, handler: str) -> list[dict[str, Any]]:
    """The statements of the function's role on the scheduler's trigger queue."""
    role = _function(s, handler)[1]["Properties"]["Role"]["Fn::GetAtt"][0]
    queue = {"Fn::GetAtt": [_output_ref(s, "SchedulerQueueUrl"), "Arn"]}
    return [
        st
        for policy in s.resources("AWS::IAM::Policy").values()
        if {"Ref": role} in policy["Properties"]["Roles"]
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if queue == st["Resource"] or queue in (st["Resource"] if isinstance(st["Resource"], list) else [])
    ]


def test_the_stream_consumer_asks_for_passes_and_the_workflow_no_longer_does(
    synthesized: Synthesized,
) -> None:
    # issue 18: one pass request per batch of job state changes (berth.logic.pass_triggers), from the
    # job-events stream's consumer, instead of about two per job from the workflow's tasks.
    (grant,) = _trigger_grants(synthesized, "berth.handlers.notifier.lambda_handler")
    assert grant["Action"] == "sqs:SendMessage" and grant["Effect"] == "Allow"
    _, notifier = _function(synthesized, "berth.handlers.notifier.lambda_handler")
    env = notifier["Properties"]["Environment"]["Variables"]
    assert env["BERTH_SCHEDULER_QUEUE_URL"] == {"Ref": _output_ref(synthesized, "SchedulerQueueUrl")}
    assert _trigger_grants(synthesized, "berth.handlers.workflow.lambda_handler") == []


def test_bus_policy_lets_only_the_notifier_put_berth_events(synthesized: Synthesized) -> None:
    bus = _output_ref(synthesized, "EventBusName")
    assert synthesized.json["Resources"][bus]["Properties"]["Name"] == "berth-Berth"
    # (The other statement, OnlyForwardersPutBatchEvents, is tests/infra/test_infra_cloud.py's.)
    (policy,) = [
        p
        for p in synthesized.resources("AWS::Events::EventBusPolicy").values()
        if p["Properties"]["StatementId"] == "OnlyBerthPublishes"
    ]
    props = policy["Properties"]
    assert props["EventBusName"] == {"Ref": bus}
    statement = props["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == "*"
    assert statement["Action"] == "events:PutEvents"
    assert statement["Resource"] == {"Fn::GetAtt": [bus, "Arn"]}
    notifier_role = _function(synthesized, "berth.handlers.notifier.lambda_handler")[1]["Properties"]["Role"]
    assert statement["Condition"] == {
        "StringEquals": {"events:source": "berth"},
        "StringNotEquals": {"aws:PrincipalArn": notifier_role},
    }


def test_example_rule_routes_job_state_changes_to_the_output_queue(synthesized: Synthesized) -> None:
    bus = _output_ref(synthesized, "EventBusName")
    queue = _output_ref(synthesized, "JobEventsQueueUrl")
    (rule_id, rule), *others = [
        (rule_id, rule)
        for rule_id, rule in synthesized.resources("AWS::Events::Rule").items()
        if "EventPattern" in rule["Properties"]
        and rule["Properties"]["EventPattern"]["source"] != ["aws.batch"]
    ]
    assert not others
    props = rule["Properties"]
    assert props["EventBusName"] == {"Ref": bus}
    assert props["EventPattern"] == {"source": ["berth"], "detail-type": ["Berth Job State Change"]}
    (target,) = props["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [queue, "Arn"]}
    (policy,) = [
        p["Properties"]
        for p in synthesized.resources("AWS::SQS::QueuePolicy").values()
        if p["Properties"]["Queues"] == [{"Ref": queue}]
    ]
    (allow,) = [st for st in policy["PolicyDocument"]["Statement"] if st["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"}
    assert allow["Condition"] == {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [rule_id, "Arn"]}}}


def test_batch_events_reach_their_queue_and_function(synthesized: Synthesized) -> None:
    bus = _output_ref(synthesized, "EventBusName")
    queue = _output_ref(synthesized, "BatchEventsQueueUrl")
    (rule,) = [
        r["Properties"]
        for r in synthesized.resources("AWS::Events::Rule").values()
        if r["Properties"].get("EventPattern", {}).get("source") == ["aws.batch"]
    ]
    assert rule["EventBusName"] == {"Ref": bus}
    assert rule["EventPattern"] == {
        "source": ["aws.batch"],
        "detail-type": ["Batch Job State Change"],
        "detail": {"status": ["RUNNING", "SUCCEEDED", "FAILED"]},
    }
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [queue, "Arn"]}
    fn_id, _ = _function(synthesized, "berth.handlers.batch_events.lambda_handler")
    (mapping,) = [
        m["Properties"]
        for m in synthesized.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": fn_id}
    ]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [queue, "Arn"]}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert "RedrivePolicy" in synthesized.json["Resources"][queue]["Properties"]


def test_submit_queue_is_fifo_throttled_and_never_drops(synthesized: Synthesized) -> None:
    queue_id = _output_ref(synthesized, "BatchSubmitQueueUrl")
    queue = synthesized.json["Resources"][queue_id]["Properties"]
    assert queue["FifoQueue"] is True
    assert queue["RedrivePolicy"]["maxReceiveCount"] == 100
    fn_id, fn = _function(synthesized, "berth.handlers.batch_submit.lambda_handler")
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["BERTH_BATCH_SUBMIT_RATE"] == "40"
    assert env["BERTH_BATCH_SUBMIT_CONCURRENCY"] == str(fn["Properties"]["ReservedConcurrentExecutions"])
    (mapping,) = [
        m["Properties"]
        for m in synthesized.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": fn_id}
    ]
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    # Every workflow function knows the queue (dispatch, the sweep's resubmits).
    _wf_id, wf = _function(synthesized, "berth.handlers.workflow.lambda_handler")
    assert wf["Properties"]["Environment"]["Variables"]["BERTH_BATCH_SUBMIT_QUEUE_URL"] == {"Ref": queue_id}


# -- on-prem hosts --------------------------------------------------------------------------------------


def _host_policy(s: Synthesized) -> dict[str, dict[str, Any]]:
    policy = s.json["Resources"][_output_ref(s, "HostPolicyArn")]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    return {st["Sid"]: st for st in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_host_policy_reads_only_the_hosts_own_queue(synthesized: Synthesized) -> None:
    statements = _host_policy(synthesized)
    assert set(statements) == {"OwnWorkQueue", "AgentApi"}
    own = statements["OwnWorkQueue"]
    assert own["Effect"] == "Allow" and "Condition" not in own
    assert set(own["Action"]) == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueUrl",
    }
    parts = own["Resource"]["Fn::Join"][1]
    # Exactly one queue: the one named after the caller's own berth:host principal tag.
    assert parts[-1] == ":berth-host-${aws:PrincipalTag/berth:host}"
    assert "*" not in json.dumps(own["Resource"])
    # No host statement grants anything on SQS beyond that queue.
    for statement in statements.values():
        if any(a.startswith("sqs:") for a in statement["Action"]):
            assert statement is own


def test_host_policy_invokes_only_the_agent_routes(synthesized: Synthesized) -> None:
    agent = _host_policy(synthesized)["AgentApi"]
    assert agent["Effect"] == "Allow"
    assert agent["Action"] == "execute-api:Invoke"
    api_id = _output_ref(synthesized, "ApiId")
    paths = set()
    for resource in agent["Resource"]:
        parts = resource["Fn::Join"][1]
        assert parts[-2] == {"Ref": api_id}
        paths.add(parts[-1])
    assert paths == {
        f"/{API_STAGE_NAME}/{verb}{path}" for path, verbs in AGENT_ROUTES.items() for verb in verbs
    }
