"""The real job state machine on the local cloud (moto executing the synthesised definition, every
function in the in-process runtime), driven by scripted agents speaking the dispatch protocol.

Each test starts its own hosts (agents with their own IAM identities) with a GPU model no other test
uses at the same time, and removes them at the end, so placements never land on another test's
hosts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from berth_tools.localcloud.cloud import LocalCloud, load_template
from berth_tools.localcloud.scripted_agent import AgentApiError, ScriptedAgent

from .conftest import REAL_TEMPLATE
from .test_real_template import _cold_start_handlers

pytestmark = pytest.mark.usefixtures("real_template")  # missing: an error that says `make synth`

TIMINGS = {
    "BERTH_HEARTBEAT_S": "6",
    "BERTH_LEASE_S": "8",
    "BERTH_OUTAGE_TOLERANCE_S": "4",
    "BERTH_FENCE_MARGIN_S": "2",
    "BERTH_CLAIM_S": "30",
    "BERTH_BACKOFF_BASE_S": "1",
    "BERTH_BACKOFF_CAP_S": "2",
    "BERTH_ORPHAN_GRACE_S": "5",
}
TERMINAL = {"COMPLETED", "FAILED", "CANCELED"}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    _cold_start_handlers()
    with LocalCloud(
        template=load_template(REAL_TEMPLATE),
        state_dir=tmp_path_factory.mktemp("state"),
        function_timings=TIMINGS,
        timer_interval_s=1.0,
        example_hosts=False,
    ) as lc:
        yield lc
    _cold_start_handlers()


class Hosts:
    def __init__(self, cloud: LocalCloud, prefix: str) -> None:
        self.cloud, self.prefix = cloud, prefix
        self.agents: list[ScriptedAgent] = []

    def add(self, n: int = 1, gpus: int = 8, start: bool = True) -> list[ScriptedAgent]:
        out = []
        for _ in range(n):
            agent = self.cloud.scripted_agent(f"{self.prefix}-{len(self.agents)}", gpus=gpus, start=start)
            self.agents.append(agent)
            out.append(agent)
        return out

    def close(self) -> None:
        hosts = (
            self.cloud.session()
            .resource("dynamodb", endpoint_url=self.cloud.endpoint_url)
            .Table(self.cloud.output("HostsTableName"))
        )
        for agent in self.agents:
            agent.kill()
            hosts.delete_item(Key={"host_id": agent.identity.host_id})


@pytest.fixture
def hosts(cloud: LocalCloud, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    h = Hosts(cloud, request.node.name.replace("test_", "")[:24].replace("_", "-"))
    yield h
    h.close()


def spec(gpus: int = 1, env: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "wf",
        "image": "python:3.11",
        "command": ["python", "train.py"],
        "resources": {"gpu_type": "A100", "gpus": gpus},
        "env": env or {},
    }
    body.update(extra)
    return body


def submit(cloud: LocalCloud, body: dict[str, Any]) -> str:
    status, answer = cloud.request("POST", "/v1/jobs", "alice", body)
    assert status == 201, answer
    assert isinstance(answer, dict)
    return str(answer["id"])


def job(cloud: LocalCloud, job_id: str) -> dict[str, Any]:
    status, body = cloud.request("GET", f"/v1/jobs/{job_id}", "alice")
    assert status == 200 and isinstance(body, dict), body
    return body


def wait_for(
    cloud: LocalCloud, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 40
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        current = job(cloud, job_id)
        if done(current):
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} never got there: {current['status']} {current['reason']}")
        time.sleep(0.25)


def status_in(*statuses: str) -> Callable[[dict[str, Any]], bool]:
    return lambda j: j["status"] in statuses


def transitions(cloud: LocalCloud, job_id: str) -> list[str]:
    status, body = cloud.request("GET", f"/v1/jobs/{job_id}/events", "alice")
    assert status == 200 and isinstance(body, dict)
    return [e["to"] for e in body["events"]]


def execution_status(cloud: LocalCloud, job_id: str) -> str:
    sfn = cloud.session().client("stepfunctions", endpoint_url=cloud.endpoint_url)
    arn = cloud.output("StateMachineArn").replace(":stateMachine:", ":execution:") + ":" + job_id
    return str(sfn.describe_execution(executionArn=arn)["status"])


def wait_execution(cloud: LocalCloud, job_id: str, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while (state := execution_status(cloud, job_id)) == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    return state


def test_happy_path_with_events_on_the_bus(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(1)
    sqs = cloud.session().client("sqs", endpoint_url=cloud.endpoint_url)
    queue = cloud.output("JobEventsQueueUrl")
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "0.5"}))
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "COMPLETED" and done["attempts"] == 1
    assert done["placement"]["hosts"][0]["host_id"] == hosts.agents[0].identity.host_id
    assert transitions(cloud, job_id) == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert wait_execution(cloud, job_id) == "SUCCEEDED"
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while len(seen) < 4 and time.monotonic() < deadline:
        for m in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            event = json.loads(m["Body"])
            if event["detail"]["job_id"] == job_id:
                seen.append(event)
    seen.sort(key=lambda e: e["detail"]["seq"])
    assert [e["detail"]["to"] for e in seen] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert all(e["detail-type"] == "Berth Job State Change" and e["source"] == "berth" for e in seen)
    last = seen[-1]["detail"]
    assert last["tenant"] == "vision" and last["site"] == "onprem" and last["attempt"] == 1
    assert "spec" not in last and "env" not in json.dumps(last) and "run_observation" not in last
    # The stream's consumer learnt the completed run into the team's run-time history (issue 18:
    # not Finalize; berth.logic.runtimes)
    tenants = (
        cloud.session()
        .resource("dynamodb", endpoint_url=cloud.endpoint_url)
        .Table(cloud.output("TenantsTableName"))
    )
    deadline = time.monotonic() + 10
    while "Item" not in (learnt := tenants.get_item(Key={"pk": "RUNTIMES#vision"}, ConsistentRead=True)):
        assert time.monotonic() < deadline, "the completed run was never learnt"
        time.sleep(0.2)
    assert json.loads(learnt["Item"]["history"])["observed"] >= 1  # a JSONAttribute: a JSON string
    # ... and asked for the job's passes, one per batch (issue 18: not WaitForPlacement or Finalize;
    # berth.logic.pass_triggers), with the permission and queue URL the template gives it
    deadline = time.monotonic() + 10
    while not any(m.get("pass_requested") for m in _log_messages(cloud, "WorkflowNotifierFunction")):
        assert time.monotonic() < deadline, "the stream's consumer never asked for a pass"
        time.sleep(0.2)
    messages = _log_messages(cloud, "WorkflowNotifierFunction")
    assert not [m for m in messages if "could not ask for a scheduling pass" in str(m.get("message"))]


def test_transient_failure_retries_on_another_host(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(2)
    job_id = submit(cloud, spec(env={"SCRIPTED_FAIL_ATTEMPTS": "1", "SCRIPTED_RUN_S": "0.2"}))
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "COMPLETED" and done["attempts"] == 2
    assert transitions(cloud, job_id) == [
        "QUEUED",
        "STARTING",
        "RUNNING",
        "RETRYING",
        "QUEUED",
        "STARTING",
        "RUNNING",
        "COMPLETED",
    ]
    ran_on = {
        (a.identity.host_id, e[2])
        for a in hosts.agents
        for e in a.log
        if e[0] == "claimed" and e[1] == job_id
    }
    assert len({h for h, _ in ran_on}) == 2  # the failed host was avoided
    _, events = cloud.request("GET", f"/v1/jobs/{job_id}/events", "alice")
    assert isinstance(events, dict)
    retrying = next(e for e in events["events"] if e["to"] == "RETRYING")
    assert "AgentError (transient)" in retrying["reason"] and "retrying in" in retrying["reason"]


def test_permanent_failure_is_not_retried(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(1)
    job_id = submit(cloud, spec(env={"SCRIPTED_EXIT": "3", "SCRIPTED_RUN_S": "0.2"}))
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "FAILED" and done["attempts"] == 1
    assert "NonZeroExit (permanent)" in done["reason"] and "exited with code 3" in done["reason"]
    assert wait_execution(cloud, job_id) == "FAILED"


def test_retries_exhausted(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(2)
    job_id = submit(
        cloud, spec(env={"SCRIPTED_FAIL_ATTEMPTS": "9", "SCRIPTED_RUN_S": "0.1"}, retry={"max_attempts": 2})
    )
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "FAILED" and done["attempts"] == 2
    assert "retries exhausted (2 of 2 attempts failed)" in done["reason"]


def test_heartbeat_loss_fails_the_attempt_as_transient(cloud: LocalCloud, hosts: Hosts) -> None:
    (silent,) = hosts.add(1)

    def beat_without_attempts() -> dict[str, Any]:  # the host lives, the job hangs silently
        return silent.call("heartbeat", {"healthy": True, "attempts": []})

    silent.heartbeat = beat_without_attempts  # type: ignore[method-assign]
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "60"}))
    wait_for(cloud, job_id, status_in("RUNNING"))
    replacement = hosts.add(1)[0]
    done = wait_for(
        cloud, job_id, lambda j: j["attempts"] == 2 and j["status"] in ("STARTING", "RUNNING", *TERMINAL), 30
    )
    assert done["placement"]["hosts"][0]["host_id"] == replacement.identity.host_id
    _, events = cloud.request("GET", f"/v1/jobs/{job_id}/events", "alice")
    assert isinstance(events, dict)
    retrying = next(e for e in events["events"] if e["to"] == "RETRYING")
    assert "HeartbeatTimeout (transient)" in retrying["reason"]
    cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "alice")


def test_host_lease_expiry_replaces_the_job_and_fences_the_stale_host(
    cloud: LocalCloud, hosts: Hosts
) -> None:
    first = hosts.add(1)[0]
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "3"}))
    running = wait_for(cloud, job_id, status_in("RUNNING"))
    stale = {"job_id": job_id, "attempt": 1, "fencing_token": first.running[(job_id, 1)].fencing_token}
    first.kill()  # SIGKILL: no more heartbeats
    second = hosts.add(1)[0]
    done = wait_for(cloud, job_id, status_in(*TERMINAL), 40)
    assert running["placement"]["hosts"][0]["host_id"] == first.identity.host_id
    assert done["status"] == "COMPLETED" and done["attempts"] == 2
    assert done["placement"]["hosts"][0]["host_id"] == second.identity.host_id
    _, events = cloud.request("GET", f"/v1/jobs/{job_id}/events", "alice")
    assert isinstance(events, dict)
    reasons = " ".join(e["reason"] for e in events["events"] if e["to"] == "RETRYING")
    assert "HostLost (transient)" in reasons or "HeartbeatTimeout (transient)" in reasons
    # The host comes back and reports on the attempt that was re-placed: refused.
    with pytest.raises(AgentApiError) as refused:
        first.call("report", {**stale, "event": "succeeded", "exit_code": 0})
    assert refused.value.status in (404, 409)
    assert job(cloud, job_id)["status"] == "COMPLETED"


def test_cancel_while_queued(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(1, gpus=2)
    blocker = submit(cloud, spec(gpus=2, env={"SCRIPTED_RUN_S": "30"}))
    wait_for(cloud, blocker, status_in("RUNNING"))
    job_id = submit(cloud, spec(gpus=2))
    time.sleep(1.5)
    assert job(cloud, job_id)["status"] == "QUEUED"
    status, body = cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "alice")
    assert status == 202 and isinstance(body, dict) and body["status"] == "CANCELED"
    assert wait_execution(cloud, job_id) == "SUCCEEDED"  # its placement wait was answered at once
    status, again = cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "alice")
    assert status == 202 and isinstance(again, dict) and again["status"] == "CANCELED"  # idempotent
    cloud.request("POST", f"/v1/jobs/{blocker}/cancel", "alice")
    wait_for(cloud, blocker, status_in("CANCELED"))


def test_cancel_while_placed(cloud: LocalCloud, hosts: Hosts) -> None:
    (agent,) = hosts.add(1, start=False)
    agent.register()  # registered, not polling yet: the job stays placed, unclaimed
    job_id = submit(cloud, spec())
    wait_for(cloud, job_id, status_in("STARTING"))
    status, body = cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "alice")
    assert status == 202 and isinstance(body, dict) and body["status"] == "CANCELING"
    agent.start()
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "CANCELED"
    assert not any(e[0] == "started" for e in agent.log)


def test_cancel_while_running_stops_it(cloud: LocalCloud, hosts: Hosts) -> None:
    (agent,) = hosts.add(1)
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "60"}))
    wait_for(cloud, job_id, status_in("RUNNING"))
    status, body = cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "alice")
    assert status == 202 and isinstance(body, dict) and body["status"] == "CANCELING"
    done = wait_for(cloud, job_id, status_in(*TERMINAL), 20)
    assert done["status"] == "CANCELED"
    assert ("canceled", job_id, 1) in agent.log and not agent.running
    assert transitions(cloud, job_id)[-2:] == ["CANCELING", "CANCELED"]


def test_a_work_message_delivered_twice_runs_once(cloud: LocalCloud, hosts: Hosts) -> None:
    (agent,) = hosts.add(1, start=False)
    agent.register()
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "0.3"}))
    wait_for(cloud, job_id, status_in("STARTING"))
    sqs = agent.sqs
    deadline = time.monotonic() + 10
    messages: list[dict[str, Any]] = []
    while not messages and time.monotonic() < deadline:
        messages = sqs.receive_message(QueueUrl=agent.queue_url, WaitTimeSeconds=1).get("Messages", [])
    assert messages
    sqs.send_message(QueueUrl=agent.queue_url, MessageBody=messages[0]["Body"])  # the duplicate
    sqs.change_message_visibility(
        QueueUrl=agent.queue_url, ReceiptHandle=messages[0]["ReceiptHandle"], VisibilityTimeout=0
    )
    agent.start()
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "COMPLETED" and done["attempts"] == 1
    # wait (by condition) until the agent has answered the second delivery too; on a loaded machine
    # that can come well after the job has ended
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        e[1] == job_id and e[0].startswith("refused:") for e in list(agent.log)
    ):
        time.sleep(0.1)
    claims = [e for e in agent.log if e[1] == job_id]
    assert [e[0] for e in claims].count("claimed") == 1
    # the second delivery is refused: AlreadyClaimed while the attempt runs, Fenced once it has ended
    # (which of the two depends on whether both copies came in one receive)
    refused = [e[0] for e in claims if e[0].startswith("refused:")]
    assert len(refused) == 1 and refused[0] in ("refused:AlreadyClaimed", "refused:Fenced"), claims


def test_agent_api_answers_hosts_only(cloud: LocalCloud, hosts: Hosts) -> None:
    status, body = cloud.request("POST", "/v1/agent/heartbeat", "alice", {"attempts": []})
    assert status == 403, body
    (agent,) = hosts.add(1, start=False)
    with pytest.raises(AgentApiError) as forged:
        agent.call("register", {"inventory": {**agent.inventory.as_dict(), "host_id": "someone-else"}})
    assert forged.value.status == 409
    status, body = cloud.request("GET", "/v1/jobs", None)
    assert status == 403


def test_agent_credentials_are_the_attempts_and_fenced(cloud: LocalCloud, hosts: Hosts) -> None:
    """POST /v1/agent/credentials through the front door and the deployed template: the claiming
    host gets STS credentials of the job role scoped to the attempt; another host and a forged token
    are refused."""
    first, other = hosts.add(2)
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "5"}))
    running = wait_for(cloud, job_id, status_in("RUNNING"))
    placed = running["placement"]["hosts"][0]["host_id"]
    owner, stranger = (first, other) if first.identity.host_id == placed else (other, first)
    ref = {"job_id": job_id, "attempt": 1, "fencing_token": owner.running[(job_id, 1)].fencing_token}
    creds = owner.call("credentials", ref)
    assert set(creds) == {"AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"}
    sts = cloud.session().client(
        "sts",
        endpoint_url=cloud.endpoint_url,
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )
    assert ":assumed-role/" in sts.get_caller_identity()["Arn"]
    with pytest.raises(AgentApiError) as refused:
        stranger.call("credentials", ref)
    assert refused.value.status == 404
    with pytest.raises(AgentApiError) as forged:
        owner.call("credentials", {**ref, "fencing_token": "guess"})
    assert forged.value.status == 409


def _log_group(cloud: LocalCloud, function_prefix: str) -> str:
    stack = cloud.stack
    assert stack is not None
    (group,) = [
        physical
        for logical, (kind, physical) in stack.resources.items()
        if kind == "AWS::Logs::LogGroup" and logical.startswith(function_prefix + "LogGroup")
    ]
    return str(group)


def _log_messages(cloud: LocalCloud, function_prefix: str) -> list[dict[str, Any]]:
    """The structured (JSON) log lines of the function whose logical id starts so."""
    logs = cloud.session().client("logs", endpoint_url=cloud.endpoint_url)
    out = []
    for page in logs.get_paginator("filter_log_events").paginate(
        logGroupName=_log_group(cloud, function_prefix)
    ):
        for event in page["events"]:
            message = event["message"].strip()
            if message.startswith("{"):
                out.append(json.loads(message))
    return out


def _emf_points(cloud: LocalCloud, function_prefix: str, metric: str) -> list[dict[str, Any]]:
    """The EMF blobs of ``metric`` in the log group of the function whose logical id starts so."""
    stack = cloud.stack
    assert stack is not None
    (group,) = [
        physical
        for logical, (kind, physical) in stack.resources.items()
        if kind == "AWS::Logs::LogGroup" and logical.startswith(function_prefix + "LogGroup")
    ]
    session = cloud.session()
    logs = session.client("logs", endpoint_url=cloud.endpoint_url)
    blobs = []
    for page in logs.get_paginator("filter_log_events").paginate(logGroupName=group, filterPattern=metric):
        for event in page["events"]:
            message = event["message"].strip()
            if message.startswith("{") and '"_aws"' in message:
                blob = json.loads(message)
                if any(m["Name"] == metric for d in blob["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]):
                    blobs.append(blob)
    return blobs


def test_operational_metrics_land_in_the_functions_log_groups(cloud: LocalCloud, hosts: Hosts) -> None:
    """The dashboard's and alarms' metrics, as the deployed functions print them (EMF)."""
    hosts.add(2)
    job_id = submit(cloud, spec(env={"SCRIPTED_FAIL_ATTEMPTS": "1", "SCRIPTED_RUN_S": "0.2"}))
    assert wait_for(cloud, job_id, status_in(*TERMINAL))["status"] == "COMPLETED"
    deadline = time.monotonic() + 20
    while True:  # log delivery follows the invocation
        retried = _emf_points(cloud, "WorkflowWorkflowFunction", "AttemptsRetried")
        placed = [b for b in _emf_points(cloud, "WorkflowSchedulerFunction", "JobsPlaced") if "Site" in b]
        requests = _emf_points(cloud, "ApiFunction", "Requests")
        if (retried and placed and requests) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {(b["service"], b["Cause"]) for b in retried} >= {("berth-workflow", "AgentError")}
    assert {(b["service"], b["Site"]) for b in placed} >= {("berth-scheduler", "onprem")}
    assert ("berth-api", "POST /v1/jobs", "2xx") in {
        (b["service"], b["Route"], b["StatusClass"]) for b in requests
    }
    assert all("/v1/jobs/" + job_id not in b["Route"] for b in requests)  # routes are templates
