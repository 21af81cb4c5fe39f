"""`LocalCloud`: moto, the Lambda runtime (worker processes), the deployed stack, users, the front door."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import boto3

from berth_tools.localcloud import (
    cloudformation_deploy,
    event_sources,
    faults,
    gateway_config,
    lambda_runtime,
    local_activity,
    local_batch,
    moto_streams,
    process_tree,
    seed,
    session_tokens,
)
from berth_tools.localcloud.agent_supervisor import AgentSupervisor
from berth_tools.localcloud.cloudformation_deploy import DeployedStack
from berth_tools.localcloud.front_door import FrontDoor
from berth_tools.localcloud.moto_server import MotoServer
from berth_tools.localcloud.process_agents import STOP_TIMEOUT_S as AGENT_DRAIN_S
from berth_tools.localcloud.process_agents import AgentProcess, AgentStartError, wait_registered
from berth_tools.localcloud.scripted_agent import HostIdentity, Inventory, ScriptedAgent
from berth_tools.localcloud.sigv4 import signed_headers
from berth_tools.localcloud.state_dir import Profile, StateDir

DEFAULT_REGION = "us-east-1"
#: The CDK app's per-region Batch stacks (infra/berth_infra/batch.py): ``Berth-batch-<region>``.
BATCH_STACK_PREFIX = "Berth-batch-"
#: Where the readiness probe sends its signed request (any answer but 403 means routing, SigV4 and the
#: Lambda path work; a 5xx is reported as a warning: the handler itself is broken).
READINESS_PATH = "/v1/jobs"
#: The workflow's timings in the local cloud (function environment overrides): seconds, not minutes.
#: The heartbeat window and the host lease are a third of AWS's (60 s, 90 s), not a sixth: with 10 s and
#: 15 s a local cloud on a machine loaded to 6x its cores and more failed 26 of 60 on-prem jobs as
#: HeartbeatTimeout (the claim and first heartbeat queue behind the job flow); with 20 s and 20 s, side
#: by side under the same load, none failed (docs/local-cloud.md, "Under load").
LOCAL_TIMINGS: dict[str, str] = {
    "BERTH_HEARTBEAT_S": "20",
    "BERTH_LEASE_S": "20",
    "BERTH_OUTAGE_TOLERANCE_S": "20",
    "BERTH_FENCE_MARGIN_S": "10",
    "BERTH_CLAIM_S": "60",
    "BERTH_BACKOFF_BASE_S": "1",
    "BERTH_BACKOFF_CAP_S": "4",
    "BERTH_ORPHAN_GRACE_S": "10",
}
#: The local maximum of sandboxes (worker processes) per function, by handler: a laptop has a few
#: cores, AWS has many. The API and the workflow's task function carry the job flow; the rest keep the
#: default (`lambda_runtime.ProcessLambdaRuntime.max_sandboxes_per_function`). A function's reserved
#: concurrency lowers it (the scheduler runs one pass at a time).
SANDBOX_CONCURRENCY: dict[str, int] = {
    "berth.handlers.api.lambda_handler": 4,
    "berth.handlers.workflow.lambda_handler": 4,
}
#: How often the local cloud fires scheduled rules (the scheduler's safety-net timer): the lease
#: reaper runs in that pass, so it must be short next to the lease.
LOCAL_TIMER_S = 2.0
#: With no job in flight (nothing to reap, place or retry) the timer fires this often instead.
LOCAL_IDLE_TIMER_S = 10.0
#: The example rule's queue (output JobEventsQueueUrl) has no consumer: in the local cloud it keeps
#: this many seconds of events (AWS keeps the template's 4 days), so it does not grow for the life of
#: the local cloud (moto_sqs drops expired messages as new ones arrive).
LOCAL_EVENTS_RETENTION_S = 300


#: Ctrl-C of `berth local up` stops everything within this (issue 19: 10 s); the agents get most of it
#: (they report their canceled attempts through the API, which stays up meanwhile).
SHUTDOWN_S = 10.0
AGENT_STOP_S = 7.0
#: An agent that failed (a crash, `berth local fault agent-kill`, any SIGKILL) is started again this
#: long after it died: agent/packaging/berth-agent.service's ``Restart=on-failure``, with a local
#: ``RestartSec`` (agent_supervisor.py).
AGENT_RESTART_S = 1.0


class LocalCloudError(RuntimeError):
    pass


@dataclass
class LocalCloud:
    """The whole local cloud in this process. Use as a context manager or call start()/stop()."""

    template: dict[str, Any]
    state_dir: Path | None = None
    api_port: int = 0
    moto_port: int = 0
    region: str = DEFAULT_REGION
    stack_name: str = cloudformation_deploy.DEFAULT_STACK_NAME
    users: tuple[seed.SeedUser, ...] = seed.DEFAULT_USERS
    console: TextIO | None = None  # progress, access log and handler logs (None: quiet)
    echo_handler_logs: bool = False
    seed_writer: seed.PutMember | None = None  # tests may replace Berth's tenants repository
    agents: int = 0
    example_hosts: bool = True
    """With no agents: seed the example fleet as static hosts (no agent runs their jobs)."""
    """Scripted on-prem agents to start (each a host with its own IAM identity)."""
    gpus_per_agent: int = 8
    gpu_type: str | None = None
    agent_kind: str = "scripted"
    """``scripted`` (in-process protocol clients, SCRIPTED_* behaviours) or ``process`` (real
    ``berth-agent`` processes running the jobs' commands on simulated GPUs)."""
    process_agents: list[AgentProcess] = field(default_factory=list)
    function_timings: dict[str, str] = field(default_factory=lambda: dict(LOCAL_TIMINGS))
    timer_interval_s: float | None = LOCAL_TIMER_S
    """Scheduled rules fire this often (None: at their own rate)."""
    idle_timer_interval_s: float | None = LOCAL_IDLE_TIMER_S
    """While no job is in flight, scheduled rules fire this often (None: always at timer_interval_s)."""
    scheduled_rules: bool = True
    """False: scheduled rules never fire (a benchmark that runs the passes itself)."""
    batch_templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Region -> the ``Berth-batch-<region>`` template (Batch queues and event forwarding), each
    deployed into moto in its region (``load_batch_templates``)."""
    batch_stacks: dict[str, DeployedStack] = field(default_factory=dict)
    pollers: list[Any] = field(default_factory=list)
    scripted_agents: list[ScriptedAgent] = field(default_factory=list)
    moto: MotoServer | None = None
    runtime: lambda_runtime.ProcessLambdaRuntime | None = None
    worker_hooks: list[tuple[str, list[Any]]] = field(default_factory=list)
    """Called in every Lambda sandbox before its handler is imported (`ProcessLambdaRuntime.worker_hooks`)."""
    stack: DeployedStack | None = None
    front_door: FrontDoor | None = None
    seeded: list[seed.SeededUser] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    ready_seconds: float = 0.0
    probe_status: int | None = None
    _state: StateDir | None = None
    _agents_lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> LocalCloud:
        started = time.monotonic()
        try:
            self._start(started)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def _step(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.timings[name] = round(now - since, 3)
        return now

    def _start(self, t: float) -> None:
        if self.state_dir is not None:
            state = StateDir(self.state_dir)  # absolute from here on
            previous = state.prepare()  # credentials and attempts of an earlier run removed first
            self._state = state  # (not before: a state dir in use by another run is not touched)
            if previous is not None:
                print(f"berth local: {previous.describe()}", file=self.console or sys.stderr, flush=True)
        self.moto = MotoServer(port=self.moto_port).start()
        batch_runner = local_batch.current()
        if batch_runner is not None:  # its jobs' work dirs: this run's job root, outside the state dir
            batch_runner.work_root = local_batch.DEFAULT_WORK_ROOT
            if self._state is not None:
                batch_runner.work_root = self._state.jobs_root() / "batch"
        t = self._step("moto", t)
        self.runtime = lambda_runtime.ProcessLambdaRuntime(
            endpoint_url=self.moto.endpoint_url,
            echo_logs=self.console if self.echo_handler_logs else None,
            concurrency=dict(SANDBOX_CONCURRENCY),
            worker_hooks=list(self.worker_hooks),
        )
        lambda_runtime.install(self.runtime)
        faults.FAULTS.lambda_kill_handler = self.runtime.kill_sandbox  # `berth local fault lambda-kill`
        session_tokens.install()
        session = self.session()
        self.stack = cloudformation_deploy.deploy_stack(
            session,
            self.moto.endpoint_url,
            self.template,
            stack_name=self.stack_name,
            environment=self.function_timings,
        )
        cloudformation_deploy.verify_stack(session, self.moto.endpoint_url, self.template, self.stack)
        if "JobEventsQueueUrl" in self.stack.outputs:
            session.client("sqs", endpoint_url=self.moto.endpoint_url).set_queue_attributes(
                QueueUrl=self.stack.outputs["JobEventsQueueUrl"],
                Attributes={"MessageRetentionPeriod": str(LOCAL_EVENTS_RETENTION_S)},
            )
        t = self._step("deploy", t)
        self._deploy_batch_stacks()
        if self.batch_templates:
            t = self._step("deploy_batch", t)
        self._say(
            f"deployed stack {self.stack_name}: {len(self.stack.resources)} resources, "
            f"fixes: {', '.join(self.stack.applied_fixes) or 'none'}"
            + (f"; not emulated: {', '.join(self.stack.skipped_types)}" if self.stack.skipped_types else "")
        )
        rest_api_id = self.output("ApiId")
        hosts = seed.example_agents(self.agents, self.gpus_per_agent, self.gpu_type)
        users = self.users + tuple(seed.SeedUser(f"host-{h}", h, "host") for h, _, _ in hosts)
        self.seeded = seed.create_iam_users(session, self.moto.endpoint_url, rest_api_id, users)
        seed.seed_tenants(
            self.seeded,
            self.output("TenantsTableName"),
            self.moto.endpoint_url,
            self.region,
            self.seed_writer,
            # Templates without a hosts table (the local cloud's own test fixtures) get no fleet.
            hosts_table=self.stack.outputs.get("HostsTableName") if self.example_hosts else None,
        )
        t = self._step("seed", t)
        self._start_event_sources()
        self.front_door = FrontDoor(
            endpoint_url=self.moto.endpoint_url,
            rest_api_id=rest_api_id,
            stage=self._stage_name(rest_api_id),
            region=self.region,
            account_id=cloudformation_deploy.DEFAULT_ACCOUNT_ID,
            port=self.api_port,
            access_log=self.console,
            gateway=self._gateway_config(rest_api_id),
        ).start()
        if self._state is not None:
            self._state.write_profiles(
                [Profile(u.profile, u.access_key_id, u.secret_access_key) for u in self.seeded],
                self.region,
                self.moto.endpoint_url,
            )
        t = self._step("front_door", t)
        self.probe_status = self._probe()
        t = self._step("probe", t)
        self._start_agents(hosts)
        faults.FAULTS.agent_kill_handler = self.kill_process_agent  # `berth local fault agent-kill`
        faults.FAULTS.gpu_error_handler = self.inject_gpu_error  # `berth local fault gpu-error`
        if self.process_agents:
            self.supervise_agents()
        self._step("agents", t)
        if self._state is not None:
            self._state.write_json("outputs.json", self.stack.outputs)
            self._state.write_json(
                "batch-stacks.json", {region: st.outputs for region, st in self.batch_stacks.items()}
            )
            self._write_agents_json()
            self._state.write_env(self.exports)

    def _write_agents_json(self) -> None:
        if self._state is None:
            return
        self._state.write_json(
            "agents.json",
            [
                {
                    "host_id": a.identity.host_id,
                    "pid": os.getpid(),
                    "gpus": list(a.inventory.gpu_ids),
                    "kind": "scripted",
                }
                for a in self.scripted_agents
            ]
            + [a.as_json() for a in self.process_agents if a.process is not None],
        )

    def supervise_agents(self) -> AgentSupervisor:
        """Restart process agents that fail, as systemd would (agent_supervisor.py), until stop()."""
        return AgentSupervisor(
            agents=lambda: list(self.process_agents),
            lock=self._agents_lock,
            stopping=self._stopping,
            restart_s=AGENT_RESTART_S,
            say=self._say,
            on_restart=lambda agent: self._write_agents_json(),
        ).start()

    # -- `berth local fault agent-kill` -------------------------------------------------------------
    def kill_process_agent(self, host_id: str) -> int | None:
        """SIGKILL the running agent process of `host_id` (its jobs die with it: PR_SET_PDEATHSIG); the
        supervisor starts it again `AGENT_RESTART_S` after it died, as systemd would, and agents.json
        names the new pid. The killed pid, or None when no agent process of that host runs."""
        with self._agents_lock:
            if self._stopping.is_set():
                return None
            agent = next((a for a in self.process_agents if a.host_id == host_id and a.alive()), None)
            if agent is None or agent.process is None:
                return None
            agent.process.kill()
            return agent.process.pid

    def inject_gpu_error(self, host_id: str, gpu: str, xid: int) -> dict[str, Any] | None:
        """`berth local fault gpu-error`: GPU `gpu` of host `host_id`'s agent process reports XID
        `xid` (AgentProcess.inject_gpu_error); None when no agent process of that host runs."""
        with self._agents_lock:
            agent = next((a for a in self.process_agents if a.host_id == host_id and a.alive()), None)
            return None if agent is None else agent.inject_gpu_error(gpu, xid)

    def stop(self, *, exiting: bool = False) -> None:
        """Stop everything this local cloud started. `exiting` (Ctrl-C of `berth local up`): stop now,
        jobs included, within SHUTDOWN_S, without freeing moto's memory first (the process ends)."""
        started = time.monotonic()
        with self._agents_lock:  # no agent is restarted from here on (AgentSupervisor)
            self._stopping.set()
        if faults.FAULTS.agent_kill_handler == self.kill_process_agent:
            faults.FAULTS.agent_kill_handler = None
        if faults.FAULTS.gpu_error_handler == self.inject_gpu_error:
            faults.FAULTS.gpu_error_handler = None
        if self.runtime is not None and faults.FAULTS.lambda_kill_handler == self.runtime.kill_sandbox:
            faults.FAULTS.lambda_kill_handler = None
        if self._state is not None:
            self._state.remove_env()
        # What is still running at the end is killed, so nothing outlives the local cloud: exiting,
        # everything below this process (agents, their jobs, Batch job processes, Lambda workers);
        # otherwise (a test's process may run other things) the agents and what they started.
        roots = [os.getpid()] if exiting else [a.pid for a in self.process_agents if a.alive()]
        below = process_tree.identify(
            [p for root in roots for p in process_tree.descendants(root) if p != os.getpid()]
        )
        batch_jobs = threading.Thread(target=local_batch.stop_all, name="stop-batch-jobs", daemon=True)
        batch_jobs.start()  # the local Batch's jobs are killed while the agents stop theirs
        for agent in self.scripted_agents:
            agent.stop()
        self.scripted_agents = []
        self._stop_process_agents(started, now=exiting)
        for poller in self.pollers:
            poller.stop()
        self.pollers = []
        if self.front_door is not None:
            self.front_door.stop()
            self.front_door = None
        if self.runtime is not None:
            lambda_runtime.uninstall(self.runtime)
            self.runtime = None
        batch_jobs.join(timeout=max(0.1, SHUTDOWN_S - (time.monotonic() - started)))
        if self.moto is not None:
            self.moto.stop(reset=not exiting)
            self.moto = None
        left = process_tree.kill(process_tree.still_running(below))
        if left:
            self._say(f"killed {left} process(es) still running at shutdown")
        if self._state is not None:
            self._state.remove_jobs_root()  # the attempts' files, their credentials among them
            self._state.release()
        self.timings["stop"] = round(time.monotonic() - started, 3)

    def _stop_process_agents(self, started: float, *, now: bool) -> None:
        """SIGTERM drains an agent (no new work, running attempts may end). Stopping now, a second
        SIGTERM (sent again each second: two at once may arrive as one) cancels its attempts at once;
        an agent still running after its share of SHUTDOWN_S is killed."""
        agents = self.process_agents
        for process in agents:  # all at once
            process.terminate()
        deadline = started + (AGENT_STOP_S if now else AGENT_DRAIN_S)  # a plain stop lets them drain
        next_signal = time.monotonic() + 1.0
        while any(a.alive() for a in agents) and time.monotonic() < deadline:
            if now and time.monotonic() >= next_signal:
                for process in agents:
                    process.terminate()
                next_signal += 1.0
            time.sleep(0.05)
        for process in agents:
            process.stop(timeout_s=0.5, terminated=True)  # SIGKILL what is left
        self.process_agents = []

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what users need -------------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        if self.moto is None:
            raise LocalCloudError("local cloud not started")
        return self.moto.endpoint_url

    @property
    def api_url(self) -> str:
        if self.front_door is None:
            raise LocalCloudError("local cloud not started")
        return self.front_door.url

    @property
    def profiles(self) -> dict[str, seed.SeededUser]:
        return {user.profile: user for user in self.seeded}

    @property
    def exports(self) -> dict[str, str]:
        if self._state is not None:
            return self._state.exports(self.api_url, self.region, self.endpoint_url)
        return {
            "BERTH_API_URL": self.api_url,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
        }

    def output(self, key: str) -> str:
        if self.stack is None or key not in self.stack.outputs:
            raise LocalCloudError(f"stack output {key} is missing")
        return self.stack.outputs[key]

    def session(self, region: str | None = None) -> boto3.session.Session:
        """A boto3 session for the local cloud's own calls to moto (static credentials, never a profile)."""
        return boto3.session.Session(
            aws_access_key_id="localcloud",
            aws_secret_access_key="localcloud",
            region_name=region or self.region,
        )

    def request(
        self, method: str, path: str, profile: str | None = None, body: Any = None
    ) -> tuple[int, dict[str, Any] | str]:
        """Call the API like a client would (signed as `profile` unless None); returns (status, body)."""
        url = self.api_url + path
        data = b"" if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data else {}
        if profile is not None:
            user = self.profiles[profile]
            headers = signed_headers(
                method=method,
                url=url,
                access_key_id=user.access_key_id,
                secret_access_key=user.secret_access_key,
                region=self.region,
                body=data,
                headers=headers,
            )
        request = urllib.request.Request(url, data=data or None, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else {}
        except ValueError:
            return status, raw.decode(errors="replace")

    # -- internals ---------------------------------------------------------------------------------
    def _physical(self, ref: Any) -> str:
        assert self.stack is not None
        logical = ref.get("Ref") if isinstance(ref, dict) and "Ref" in ref else None
        if logical is None and isinstance(ref, dict) and "Fn::GetAtt" in ref:
            logical = ref["Fn::GetAtt"][0]
        if logical is None or logical not in self.stack.resources:
            raise LocalCloudError(f"cannot resolve {ref} in the deployed stack")
        return self.stack.resources[logical][1]

    def _start_event_sources(self) -> None:
        """The template's event source mappings and scheduled rules, run by the local cloud."""
        assert self.stack is not None
        session = self.session()
        sqs = session.client("sqs", endpoint_url=self.endpoint_url)
        lam = session.client("lambda", endpoint_url=self.endpoint_url)
        for props in self.stack.event_source_mappings.values():
            function = self._physical(props["FunctionName"])
            source = props["EventSourceArn"]
            mapping = event_sources.Mapping(
                function_name=function,
                source_arn="",
                batch_size=int(props.get("BatchSize", 10)),
                window_s=float(props.get("MaximumBatchingWindowInSeconds", 0)),
                partial_batch="ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
                starting_position=str(props.get("StartingPosition", "TRIM_HORIZON")),
                max_retries=int(props.get("MaximumRetryAttempts", 10)),
            )
            attr = source["Fn::GetAtt"][1] if isinstance(source, dict) and "Fn::GetAtt" in source else ""
            if attr == "StreamArn":
                table = self._physical(source)
                ddb = session.client("dynamodb", endpoint_url=self.endpoint_url)
                mapping.source_arn = ddb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
                streams = session.client("dynamodbstreams", endpoint_url=self.endpoint_url)
                poller: Any = event_sources.StreamPoller(streams, lam, mapping, signal=moto_streams.SIGNAL)
            else:
                queue_url = self._physical(source)
                mapping.source_arn = sqs.get_queue_attributes(
                    QueueUrl=queue_url, AttributeNames=["QueueArn"]
                )["Attributes"]["QueueArn"]
                poller = event_sources.SqsPoller(sqs, lam, queue_url, mapping)
            poller.start()
            self.pollers.append(poller)
        for lid, res in self.template.get("Resources", {}).items():
            props = res.get("Properties", {})
            if res.get("Type") != "AWS::Events::Rule" or not props.get("ScheduleExpression"):
                continue
            if not self.scheduled_rules:
                continue
            every = self.timer_interval_s or event_sources.schedule_seconds(props["ScheduleExpression"])
            idle_every = self.idle_timer_interval_s if self.timer_interval_s else None
            for target in props.get("Targets", []):
                if not (isinstance(target.get("Arn"), dict) and "Fn::GetAtt" in target["Arn"]):
                    continue
                url = self._physical(target["Arn"])
                if not url.startswith("http"):
                    continue
                body = target.get("Input", "{}")

                def send(url: str = url, body: str = body) -> None:
                    sqs.send_message(QueueUrl=url, MessageBody=body)

                timer = event_sources.ScheduleTimer(
                    send, float(every or 60), lid, active=self._jobs_in_flight(), idle_interval_s=idle_every
                )
                timer.start()
                self.pollers.append(timer)

    def _jobs_in_flight(self) -> Any:
        """The idle timer's predicate: a job not yet ended in the jobs table (None: no jobs table)."""
        table = self.stack.outputs.get("JobsTableName") if self.stack is not None else None
        if table is None:
            return None
        account, region = cloudformation_deploy.DEFAULT_ACCOUNT_ID, self.region
        return lambda: local_activity.jobs_in_flight(account, region, table)

    def _deploy_batch_stacks(self) -> None:
        """Each cloud region's Batch stack, into moto in that region (queues must come up VALID)."""
        assert self.moto is not None
        for region, template in sorted(self.batch_templates.items()):
            session = self.session(region)
            stack_name = f"{BATCH_STACK_PREFIX}{region}"
            deployed = cloudformation_deploy.deploy_stack(
                session, self.moto.endpoint_url, template, stack_name
            )
            cloudformation_deploy.verify_stack(session, self.moto.endpoint_url, template, deployed)
            self.batch_stacks[region] = deployed
        if self.batch_stacks:
            self._say(
                "deployed Batch stacks: "
                + ", ".join(f"{r} ({len(s.resources)} resources)" for r, s in self.batch_stacks.items())
            )

    def host_identity(self, host_id: str) -> HostIdentity:
        """Create an on-prem host's IAM identity (user tagged berth:host, registered as a host)."""
        assert self.stack is not None
        session = self.session()
        (user,) = seed.create_iam_users(
            session,
            self.endpoint_url,
            self.output("ApiId"),
            (seed.SeedUser(f"host-{host_id}", host_id, "host"),),
            policy_name=f"{seed.INVOKE_POLICY_NAME}-{host_id}",
        )
        seed.seed_tenants(
            [user], self.output("TenantsTableName"), self.endpoint_url, self.region, members_only=True
        )
        self.seeded.append(user)
        return HostIdentity(host_id, user.access_key_id, user.secret_access_key)

    def scripted_agent(
        self, host_id: str, gpus: int = 8, gpu_type: str = "A100", start: bool = True
    ) -> ScriptedAgent:
        """A scripted agent on a new host of its own (tests)."""
        agent = ScriptedAgent(
            api_url=self.api_url,
            endpoint_url=self.endpoint_url,
            region=self.region,
            identity=self.host_identity(host_id),
            inventory=Inventory(host_id=host_id, gpu_type=gpu_type, gpu_ids=seed.host_gpu_ids(host_id, gpus)),
        )
        if start:
            agent.start()
        self.scripted_agents.append(agent)
        return agent

    def _start_agents(self, hosts: list[tuple[str, str, int]]) -> None:
        if self.agent_kind == "process":
            self._start_process_agents(hosts)
            return
        by_profile = self.profiles
        for host_id, model, gpus in hosts:
            user = by_profile[f"host-{host_id}"]
            agent = ScriptedAgent(
                api_url=self.api_url,
                endpoint_url=self.endpoint_url,
                region=self.region,
                identity=HostIdentity(host_id, user.access_key_id, user.secret_access_key),
                inventory=Inventory(
                    host_id=host_id, gpu_type=model, gpu_ids=seed.host_gpu_ids(host_id, gpus)
                ),
            )
            agent.start()
            self.scripted_agents.append(agent)

    def process_agent(self, host_id: str, gpu_type: str = "A100", gpus: int = 8) -> AgentProcess:
        """A real agent process on a host of its own (not yet started)."""
        user = self.profiles.get(f"host-{host_id}")
        if user is None:
            identity = self.host_identity(host_id)
            key: tuple[str, str] | None = (identity.access_key_id, identity.secret_access_key)
        else:
            key = None if self._state is not None else (user.access_key_id, user.secret_access_key)
        if self._state is not None:
            base = self._state.agents_dir
            jobs = self._state.jobs_root()  # work, cache and datasets: where jobs can reach
        else:
            import tempfile

            base = jobs = Path(tempfile.mkdtemp(prefix="berth-agents-"))
        return AgentProcess(
            host_id=host_id,
            gpu_type=gpu_type,
            gpus=gpus,
            home=base / host_id,
            jobs_home=jobs / host_id,
            api_url=self.api_url,
            endpoint_url=self.endpoint_url,
            region=self.region,
            artifacts_bucket=self.output("ArtifactsBucketName"),
            data_bucket=self.output("DataBucketName"),
            aws_config_file=self._state.config_file if self._state is not None else None,
            aws_credentials_file=self._state.credentials_file if self._state is not None else None,
            access_key=key,
            # Every simulated host holds the example datasets on its own disk (one copy per state dir).
            datasets=seed.example_dataset_roots(jobs / "datasets"),
        )

    def _start_process_agents(self, hosts: list[tuple[str, str, int]]) -> None:
        for host_id, model, gpus in hosts:
            agent = self.process_agent(host_id, model, gpus)
            self.process_agents.append(agent.start())
        try:
            wait_registered(self.process_agents)
        except AgentStartError as exc:
            raise LocalCloudError(str(exc)) from exc
        self._say(
            "agents registered: "
            + ", ".join(
                f"{a.host_id} (pid {a.pid}, {len(a.registered_gpus)} GPUs)" for a in self.process_agents
            )
        )

    def _gateway_config(self, rest_api_id: str) -> gateway_config.GatewayConfig:
        """The deployed API's gateway responses and resource policy, from the template (moto drops them)."""
        assert self.stack is not None
        logical = next(
            (
                lid
                for lid, (kind, physical) in self.stack.resources.items()
                if kind == "AWS::ApiGateway::RestApi" and physical == rest_api_id
            ),
            None,
        )
        if logical is None:
            raise LocalCloudError(f"REST API {rest_api_id} is not a resource of the deployed template")
        return gateway_config.from_template(
            self.template, logical, rest_api_id, cloudformation_deploy.DEFAULT_ACCOUNT_ID, self.region
        )

    def _stage_name(self, rest_api_id: str) -> str:
        client = self.session().client("apigateway", endpoint_url=self.endpoint_url)
        stages = [s["stageName"] for s in client.get_stages(restApiId=rest_api_id).get("item", [])]
        api_url = self.stack.outputs.get("ApiUrl", "") if self.stack else ""
        for stage in stages:
            if api_url.rstrip("/").endswith("/" + stage):
                return stage
        if not stages:
            raise LocalCloudError(f"REST API {rest_api_id} has no stage")
        return stages[0]

    def _probe(self) -> int:
        first = next(iter(self.profiles))
        status, body = self.request("GET", READINESS_PATH, profile=first)
        if status == 403:
            raise LocalCloudError(f"readiness probe rejected by the front door: {body}")
        if status >= 500:
            self._say(f"warning: GET {READINESS_PATH} as {first} answered {status}: {body}")
        return status

    def _say(self, message: str) -> None:
        if self.console is not None:
            print(f"berth local: {message}", file=self.console, flush=True)


def load_template(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise LocalCloudError(f"{path} does not exist: run `make synth` (npx cdk synth) first")
    return cloudformation_deploy.load_template(path)


def load_batch_templates(main_template: Path) -> dict[str, dict[str, Any]]:
    """The ``Berth-batch-<region>.template.json`` files next to the main template, by region."""
    templates: dict[str, dict[str, Any]] = {}
    for path in sorted(main_template.parent.glob(f"{BATCH_STACK_PREFIX}*.template.json")):
        region = path.name[len(BATCH_STACK_PREFIX) : -len(".template.json")]
        templates[region] = cloudformation_deploy.load_template(path)
    return templates


def stderr_console() -> TextIO:
    return sys.stderr
