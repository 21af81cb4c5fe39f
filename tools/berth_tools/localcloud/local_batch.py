"""Local AWS Batch: jobs submitted to a `berth-*` queue really run, as host processes.

moto 5.2.5 stores compute environments, queues and job definitions faithfully, but without docker a
job either succeeds at once (`batch.use_docker: false`, the local cloud's setting) or fails. Two of
its private surfaces are replaced (declared in `moto_compat.SURFACES`):

- `BatchSimpleBackend.submit_job` (the docker-less backend): a job for a queue named `berth-*` goes
  to the real backend's `submit_job`, which stores the job and starts its thread; any other queue
  keeps moto's behaviour;
- `Job.run` (that thread's body): for a `berth-*` queue, `LocalBatch.execute(job)` runs it; any other
  job runs moto's own `run`.

`execute` drives the job as AWS Batch does: SUBMITTED -> PENDING -> RUNNABLE -> (waits while the
queue's compute environment has no free vCPUs: `maxvCpus` minus the vCPUs of the jobs it runs, or
while `berth local fault capacity` covers its instance types) -> STARTING -> RUNNING ->
SUCCEEDED | FAILED, with `startedAt`/`stoppedAt`, `statusReason`, `container.exitCode` and an
`attempts[]` entry; every status change puts a `Batch Job State Change` event (source `aws.batch`,
detail as DescribeJobs answers it) on the default bus of the job's region. The container's command
runs through the agent's `ProcessRun` (own process group and a containment marker, so every process
it started, detached ones too, ends with it as in a container; supervised, no
environment but the one given): the job definition's environment with the submit's overrides over
it, `AWS_BATCH_*`, `AWS_REGION`, `AWS_ENDPOINT_URL` (the local cloud), and STS credentials of the job
definition's `jobRoleArn` (none without one, as on AWS). A code-bundle job's
`python -m berth_agent.launch` runs the launcher of this source tree with this interpreter. Output
lines go to CloudWatch Logs through the agent's `LogShipper`, in order, where AWS Batch's awslogs
driver puts them (`awslogs_target`): the definition's `awslogs-group` (default `/aws/batch/job`) in its
`awslogs-region`, stream `<awslogs-stream-prefix or definition name>/default/<ECS task id>` (a fresh
32-hex id per start, also in the attempt's `taskArn`), reported as `container.logStreamName` by
DescribeJobs and in the events from RUNNING on. TerminateJob (and CancelJob
before start) stops it: SIGTERM to the group, SIGKILL after `TERMINATE_GRACE_S`, FAILED with the
given reason. `attemptDurationSeconds` is enforced (`Job attempt duration exceeded timeout`).

A definition's `secrets` (`[{name, valueFrom: secret ARN}]`) are resolved at STARTING as ECS does,
with its `executionRoleArn`: the runner assumes that role in moto's STS, asks moto's IAM evaluator
whether the session may `secretsmanager:GetSecretValue` on the secret's ARN (moto enforces IAM on
requests only after `set_initial_no_auth_action_count`, never in the local cloud) and reads the value
with the session's credentials; the values go into the process's environment only. A secret without
an execution role, not allowed to it, or missing fails the job before it runs, with ECS's
`ResourceInitializationError: unable to pull secrets or registry auth: ...` as its reason (names,
never values).

A multi-node parallel job (a gang: a ``type: multinode`` definition) runs as one process per node,
each a Batch job of its own ``<job id>#<index>`` with the AWS_BATCH_JOB_*NODE* variables, reaching
each other over 127.0.0.1 (``local_batch_gang``).

Each job runs in a fresh work dir under `work_root` (the run's job root, outside the state dir). When
the local cloud runs as root it runs under a uid of its own from `JOB_UIDS` (gid = uid, no
supplementary groups; its work dir chowned to it, 0700, in a 0711 root), so it cannot read the state
dir's keys or another job's files; a launcher job keeps this process's user when this interpreter is
not reachable by other users (a pyenv under /root), with a warning.

`BERTH_TIME_FACTOR` (default 1) divides the runner's own delays (the capacity statusReason delay, the
terminate grace); a job's command runs in real time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from berth.domain.arrays import from_aws_name
from berth.domain.cloud import batch_job_task
from berth_agent import containment
from berth_agent.executors.base import SAFE_PATH, FailureKind, JobResult
from berth_agent.executors.process import ProcessRun, UidPool
from berth_agent.logship import LogShipper
from berth_tools.localcloud import local_batch_gang, moto_compat
from berth_tools.localcloud.faults import FAULTS, FaultState
from berth_tools.localcloud.moto_transport import InProcessTransport

QUEUE_PREFIX = "berth-"
EXIT_REASON = "Essential container in task exited"
TIMEOUT_REASON = "Job attempt duration exceeded timeout"
SPOT_INSTANCE_ID = "i-0123456789abcdef0"
SPOT_REASON = f"Host EC2 (instance {SPOT_INSTANCE_ID}) terminated."
#: AWS Batch's wording for a job its compute environment cannot get instances for.
CAPACITY_REASON = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no {instance_type} capacity in {region}"
CAPACITY_REASON_AFTER_S = 5.0
MISCONFIGURATION_REASON = (
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement (vCPU/memory/GPU) is higher"
    " than that can be met by the CE(s) attached to the job queue."
)
TERMINATE_GRACE_S = 2.0
#: ECS's reason when the execution role could not read a secret of the definition (the task never ran).
SECRETS_REASON = (
    "ResourceInitializationError: unable to pull secrets or registry auth: execution resource retrieval "
    "failed: unable to retrieve secret from asm: {detail}"
)
DEFAULT_LOG_GROUP = "/aws/batch/job"
LAUNCHER_MODULE = "berth_agent.launch"
_POLL_S = 0.05

SUBMIT_JOB = "moto.batch_simple.models:BatchSimpleBackend.submit_job"
JOB_RUN = "moto.batch.models:Job.run"
CONTAINER_DETAILS = "moto.batch.models:Job._container_details"
SUBMIT_JOB_RESPONSE = "moto.batch.responses:BatchResponse.submitjob"
DESCRIBE_JOBS = "moto.batch.models:BatchBackend.describe_jobs"
#: moto's Batch iterates its live jobs dict in DescribeJobs and ListJobs while SubmitJob adds to it
#: ("dictionary changed size during iteration", a 500, under a burst): the three share one lock.
SERIALISED = tuple(
    f"moto.batch.models:BatchBackend.{n}" for n in ("submit_job", "describe_jobs", "list_jobs")
)
_JOBS_LOCK = threading.RLock()


def time_factor(environ: dict[str, str] | None = None) -> float:
    raw = (environ if environ is not None else os.environ).get("BERTH_TIME_FACTOR", "1")
    try:
        value = float(raw)
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


def local_max_running(environ: dict[str, str] | None = None) -> int:
    """``BERTH_LOCAL_BATCH_MAX_RUNNING``, else 4 containers per core (at least 8)."""
    raw = (environ if environ is not None else os.environ).get("BERTH_LOCAL_BATCH_MAX_RUNNING", "")
    if raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    return max(8, 4 * (os.cpu_count() or 1))


def _package_roots() -> list[str]:
    """Where this process imports `berth_agent` and `berth` from (for the launcher's PYTHONPATH)."""
    import importlib.util

    roots = []
    for name in ("berth_agent", "berth"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(str(Path(next(iter(spec.submodule_search_locations))).parent))
    return roots


def is_berth_queue(queue: Any) -> bool:
    return queue is not None and str(queue.name).startswith(QUEUE_PREFIX)


def _env_list(items: Any) -> dict[str, str]:
    return {str(e["name"]): str(e["value"]) for e in items or [] if "name" in e}


def job_vcpus(job: Any) -> int:
    """The vCPUs a job asks for: the submit's overrides, else its definition (VCPU requirement)."""
    overrides = job.container_overrides or {}
    for req in overrides.get("resourceRequirements") or []:
        if req.get("type") == "VCPU":
            return max(1, int(float(req["value"])))
    if overrides.get("vcpus"):
        return max(1, int(overrides["vcpus"]))
    value = job.job_definition._get_resource_requirement("vcpus", 1)
    return max(1, int(float(value or 1)))


@dataclass(frozen=True)
class LogTarget:
    group: str
    stream: str
    #: ``awslogs-region`` (None: the job's own region).
    region: str | None = None


def awslogs_target(
    definition_name: str, container_properties: dict[str, Any] | None, task_id: str
) -> LogTarget:
    """Where AWS Batch's awslogs driver puts a container's output: the definition's
    ``logConfiguration.options`` ``awslogs-group`` (default ``/aws/batch/job``) and ``awslogs-region``,
    stream ``<awslogs-stream-prefix>/default/<ECS task id>``, the prefix defaulting to the job
    definition's name (Batch names the container ``default``)."""
    config = (container_properties or {}).get("logConfiguration") or {}
    options = (config.get("options") or {}) if config.get("logDriver", "awslogs") == "awslogs" else {}
    prefix = options.get("awslogs-stream-prefix") or definition_name
    return LogTarget(
        group=options.get("awslogs-group") or DEFAULT_LOG_GROUP,
        stream=f"{prefix}/default/{task_id}",
        region=options.get("awslogs-region") or None,
    )


class SecretsUnavailable(Exception):
    """A secret of the job definition could not be read with its execution role (ECS's wording)."""


@dataclass
class _Run:
    job: Any
    berth_job_id: str | None
    attempt: int
    handle: ProcessRun | None = None
    spot: bool = False
    terminating: bool = False


DEFAULT_WORK_ROOT = Path(tempfile.gettempdir()) / "berth-local-batch"
#: Job uids of local Batch jobs when the local cloud runs as root (below the local agents' blocks).
JOB_UIDS = "3090000-3099999"


@dataclass
class LocalBatch:
    """Runs the Batch jobs of `berth-*` queues in this process's moto (see the module docstring)."""

    endpoint_url: str
    work_root: Path = DEFAULT_WORK_ROOT
    #: As root, each job runs under a uid of its own from this pool (None: as this process's user).
    uids: UidPool | None = field(default_factory=lambda: UidPool.parse(JOB_UIDS))
    faults: FaultState = field(default_factory=lambda: FAULTS)
    factor: float = field(default_factory=time_factor)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _runs: dict[str, _Run] = field(default_factory=dict)
    _in_use: dict[str, int] = field(default_factory=dict)  # compute environment ARN -> vCPUs running
    #: Containers running at once on this machine, whatever the compute environments would allow: a
    #: 50-child array job must not start 50 launchers at once on a laptop (the rest wait RUNNABLE,
    #: as for instances). ``BERTH_LOCAL_BATCH_MAX_RUNNING``; default 4 per core, at least 8.
    max_running: int = field(default_factory=lambda: local_max_running())
    _running: int = 0
    _clients: dict[tuple[str, str], Any] = field(default_factory=dict)
    _stopping: bool = False
    #: The nodes of gangs (``<job id>#<index>``), for DescribeJobs: moto does not store them.
    _nodes: dict[str, Any] = field(default_factory=dict)

    # -- clients into moto, in this thread --------------------------------------------------------
    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                session: Any = boto3.session.Session(
                    aws_access_key_id="localbatch", aws_secret_access_key="localbatch", region_name=region
                )
                client = session.client(
                    service,
                    endpoint_url=self.endpoint_url,
                    config=Config(retries={"max_attempts": 2, "mode": "standard"}),
                )
                # Batch's own events and the job's logs are not the control plane's bill: not metered.
                client.meta.events.register(
                    "before-send", InProcessTransport(self.endpoint_url, metered=False)
                )
                self._clients[key] = client
        return client

    # -- status and events ------------------------------------------------------------------------
    def _detail(self, job: Any) -> dict[str, Any]:
        """The event detail: what DescribeJobs answers for the job (AWS sends that shape)."""
        detail: dict[str, Any] = job.describe_short()
        detail["jobQueue"] = job.job_queue.arn
        detail["dependsOn"] = job.depends_on or []
        detail["parameters"] = dict(job.parameters or {})
        detail["tags"] = job.backend.list_tags_for_resource(job.arn)
        detail["attempts"] = json.loads(json.dumps(job.attempts, default=str))
        container: dict[str, Any] = {"command": self._command(job)}
        props = job.job_definition.container_properties or {}
        if props.get("image"):
            container["image"] = props["image"]
        if job.exit_code is not None:
            container["exitCode"] = job.exit_code
        if job.log_stream_name:
            container["logStreamName"] = job.log_stream_name
        detail["container"] = container
        index = getattr(job, local_batch_gang.NODE_INDEX_ATTR, None)
        if index is not None:
            detail["nodeDetails"] = {
                "nodeIndex": index,
                "isMainNode": index == local_batch_gang.main_node(job),
            }
        return detail

    def _set_status(self, job: Any, status: str) -> None:
        job.status = status
        self._emit(job)

    def _emit(self, job: Any) -> None:
        region = job.backend.region_name
        entry = {
            "Source": "aws.batch",
            "DetailType": "Batch Job State Change",
            "Detail": json.dumps(self._detail(job)),
            "Resources": [job.arn],
            "EventBusName": "default",
        }
        try:
            answer = self._client("events", region).put_events(Entries=[entry])
            if answer.get("FailedEntryCount"):
                print(f"berth local batch: event not put: {answer['Entries']}", file=sys.__stderr__)
        except Exception as exc:  # an event lost must not stop the job (AWS delivers at least once)
            print(f"berth local batch: event not put: {exc!r}", file=sys.__stderr__)

    # -- the job's thread -------------------------------------------------------------------------
    def execute(self, job: Any) -> None:
        if local_batch_gang.is_gang(job):
            self._execute_gang(job)
            return
        env = self._environment(job)
        task = batch_job_task(str(job.job_id), str(job.job_name))  # a group's child runs one task
        run = _Run(job, task[0] if task else None, task[1] if task else 1)
        with self._lock:
            self._runs[job.job_id] = run
        try:
            self._execute(job, run, env)
        except Exception as exc:  # a bug here fails the job visibly rather than leaving it RUNNING
            print(f"berth local batch: job {job.job_id} failed in the runner: {exc!r}", file=sys.__stderr__)
            self._finish(job, success=False, exit_code=None, reason=f"local Batch runner error: {exc}")
        finally:
            with self._lock:
                self._runs.pop(job.job_id, None)

    def _execute_gang(self, job: Any) -> None:
        with _JOBS_LOCK:  # SubmitJob sets the overrides before it lets go of the lock
            overrides = dict(getattr(job, local_batch_gang.NODE_OVERRIDES_ATTR, None) or {})
        try:
            local_batch_gang.run_gang(self, job, overrides)
        except Exception as exc:  # a bug here fails the gang visibly rather than leaving it RUNNING
            print(f"berth local batch: gang {job.job_id} failed in the runner: {exc!r}", file=sys.__stderr__)
            self._finish(job, success=False, exit_code=None, reason=f"local Batch runner error: {exc}")

    def add_nodes(self, nodes: list[Any]) -> None:
        with self._lock:
            self._nodes.update({n.job_id: n for n in nodes})

    def describe_nodes(self, ids: list[str]) -> list[dict[str, Any]]:
        """DescribeJobs of gang nodes (``<job id>#<index>``) this runner ran or runs."""
        with self._lock:
            found = [self._nodes[i] for i in ids if i in self._nodes]
        return [n.describe() for n in found]

    def _execute(self, job: Any, run: _Run, env: dict[str, str]) -> None:
        self._emit(job)  # SUBMITTED
        self._set_status(job, "PENDING")
        self._set_status(job, "RUNNABLE")
        ce = job.job_queue.environments[0] if job.job_queue.environments else None
        vcpus = job_vcpus(job)
        if not self._wait_for_capacity(job, ce, vcpus):
            return
        workdir = Path(tempfile.mkdtemp(prefix=f"{job.job_id[:8]}-", dir=self._work_root()))
        shipper: LogShipper | None = None
        uid: int | None = None
        try:
            job.job_stopped_reason = None  # a capacity reason no longer holds
            self._set_status(job, "STARTING")
            try:
                secret_env = self._secrets(job)
            except SecretsUnavailable as exc:  # ECS: the task stops before its container starts
                self._finish(job, success=False, exit_code=None, reason=SECRETS_REASON.format(detail=exc))
                return
            task_id = uuid.uuid4().hex  # the ECS task the container runs in, on AWS
            target = awslogs_target(job.job_definition.name, job.job_definition.container_properties, task_id)
            shipper = self._shipper(job, target)
            job.log_stream_name = target.stream  # DescribeJobs' and the events' container.logStreamName
            job.job_started_at = datetime.now()
            job._start_attempt()
            if job.latest_attempt is not None:
                job.latest_attempt["container"]["taskArn"] = self._task_arn(job, ce, task_id)
            argv, env = self._argv_env(job, env, workdir, secret_env)
            # A container's processes all end with it (its PID namespace): the local stand-in marks
            # them so the detached ones are found and killed with the rest (berth_agent.containment).
            key = containment.new_attempt_key(job.job_id, len(job.attempts))
            env[containment.ATTEMPT_KEY_ENV] = key
            try:
                if self.uids is not None and self._may_switch(argv):  # its work dir (0700) is all it owns
                    uid = self.uids.take()
                    os.chown(workdir, uid, uid)
                run.handle = ProcessRun(
                    argv,
                    env=env,
                    cwd=workdir,
                    on_line=shipper.emit_line,
                    timeout_s=job._get_attempt_duration(),
                    timeout_grace_s=TERMINATE_GRACE_S / self.factor,
                    user=uid,
                    group=uid,
                    attempt_key=key,
                )
            except Exception as exc:  # CannotStartContainerError on AWS
                shipper.emit(f"CannotStartContainerError: {exc}")
                self._finish(job, success=False, exit_code=None, reason=f"CannotStartContainerError: {exc}")
                return
            self._set_status(job, "RUNNING")
            result = self._supervise(job, run)
        finally:
            if shipper is not None:
                shipper.close(timeout_s=10)
            shutil.rmtree(workdir, ignore_errors=True)
            if uid is not None and self.uids is not None:
                self.uids.give_back(uid)
            with self._lock:
                self._running -= 1
                if ce is not None:
                    self._in_use[ce.arn] = self._in_use.get(ce.arn, 0) - vcpus
        self._settle(job, run, result)

    def _wait_for_capacity(self, job: Any, ce: Any, vcpus: int) -> bool:
        """Wait RUNNABLE until the compute environment has room (and no capacity fault); False when
        the job was terminated or canceled meanwhile (then it is FAILED already)."""
        region = job.backend.region_name
        resources = (ce.compute_resources or {}) if ce is not None else {}
        max_vcpus = int(resources.get("maxvCpus") or 0) or None
        types = [str(t) for t in resources.get("instanceTypes") or []]
        blocked_since: float | None = None
        while True:
            if job.stop or self._stopping:
                self._finish(
                    job, success=False, exit_code=None, reason=job.job_stopped_reason or "terminated"
                )
                return False
            blocked = self.faults.capacity_blocked(region, types)
            if blocked is not None:
                now = time.monotonic()
                blocked_since = blocked_since if blocked_since is not None else now
                reason = CAPACITY_REASON.format(instance_type=blocked, region=region)
                if (
                    now - blocked_since >= CAPACITY_REASON_AFTER_S / self.factor
                    and job.job_stopped_reason != reason
                ):
                    job.job_stopped_reason = reason
                    self._emit(job)
            else:
                blocked_since = None
                if ce is None:
                    with self._lock:
                        if self._running < self.max_running:
                            self._running += 1
                            return True
                    time.sleep(_POLL_S)
                    continue
                if max_vcpus is not None and vcpus > max_vcpus:  # never fits: RUNNABLE for good, as on AWS
                    if job.job_stopped_reason != MISCONFIGURATION_REASON:
                        job.job_stopped_reason = MISCONFIGURATION_REASON
                        self._emit(job)
                    time.sleep(_POLL_S)
                    continue
                with self._lock:
                    used = self._in_use.get(ce.arn, 0)
                    fits = max_vcpus is None or used + vcpus <= max_vcpus
                    if fits and self._running < self.max_running:
                        self._in_use[ce.arn] = used + vcpus
                        self._running += 1
                        return True
            time.sleep(_POLL_S)

    def _supervise(self, job: Any, run: _Run) -> JobResult:
        assert run.handle is not None
        while (result := run.handle.wait(_POLL_S)) is None:
            if (job.stop or self._stopping) and not run.terminating:
                run.terminating = True
                run.handle.cancel(TERMINATE_GRACE_S / self.factor)
        return result

    def _settle(self, job: Any, run: _Run, result: JobResult) -> None:
        code = result.exit_code
        exit_code = None if code is None else (128 - code if code < 0 else code)
        if run.spot:
            self._finish(job, success=False, exit_code=None, reason=SPOT_REASON)
        elif run.terminating:
            self._finish(
                job, success=False, exit_code=exit_code, reason=job.job_stopped_reason or "terminated"
            )
        elif result.failure is FailureKind.TIMEOUT:
            self._finish(job, success=False, exit_code=exit_code, reason=TIMEOUT_REASON)
        else:
            self._finish(job, success=exit_code == 0, exit_code=exit_code, reason=EXIT_REASON)

    def _finish(self, job: Any, *, success: bool, exit_code: int | None, reason: str) -> None:
        if job.job_stopped:
            return
        job.exit_code = exit_code
        job.job_stopped_reason = reason
        if job.latest_attempt is not None:
            container = job.latest_attempt.setdefault("container", {})
            container["reason"] = reason
            if exit_code is not None:
                container["exitCode"] = exit_code
            job.latest_attempt["statusReason"] = reason
        job._mark_stopped(success=success)
        self._emit(job)

    # -- what the process gets --------------------------------------------------------------------
    @staticmethod
    def _command(job: Any) -> list[str]:
        props = job.job_definition.container_properties or {}
        command = (job.container_overrides or {}).get("command") or props.get("command") or []
        return [str(c) for c in job._add_parameters_to_command(command)]

    @staticmethod
    def _environment(job: Any) -> dict[str, str]:
        """The definition's environment with the submit's overrides over it (moto's own merge appends
        to the overrides on every describe, so it is not used)."""
        props = job.job_definition.container_properties or {}
        env = _env_list(props.get("environment"))
        env.update(_env_list((job.container_overrides or {}).get("environment")))
        return env

    def _argv_env(
        self, job: Any, job_env: dict[str, str], workdir: Path, secret_env: dict[str, str] | None = None
    ) -> tuple[list[str], dict[str, str]]:
        region = job.backend.region_name
        argv = self._command(job)
        if not argv:
            raise ValueError("the job has no command")
        env = {"PATH": SAFE_PATH, "HOME": str(workdir), "LANG": "C.UTF-8", "TMPDIR": str(workdir)}
        env.update(job_env)
        env.update(secret_env or {})
        env.update(
            {
                "AWS_BATCH_JOB_ID": job.job_id,
                "AWS_BATCH_JQ_NAME": job.job_queue.name,
                "AWS_BATCH_JOB_ATTEMPT": str(len(job.attempts)),
                **self._array_env(job),
                **getattr(job, local_batch_gang.NODE_ENV_ATTR, {}),
                "AWS_REGION": region,
                "AWS_DEFAULT_REGION": region,
                "AWS_ENDPOINT_URL": self.endpoint_url,
            }
        )
        if job.job_queue.environments:
            env["AWS_BATCH_CE_NAME"] = job.job_queue.environments[0].name
        env.update(self._role_credentials(job))
        if (
            len(argv) >= 3
            and argv[1:3] == ["-m", LAUNCHER_MODULE]
            and Path(argv[0]).name.startswith("python")
        ):
            argv[0] = sys.executable  # the image's python: here, this interpreter and this source tree
            env["PYTHONPATH"] = os.pathsep.join(_package_roots())
            env.setdefault("BERTH_LAUNCH_WORK_DIR", str(workdir / "launch"))
        return argv, env

    @staticmethod
    def _array_env(job: Any) -> dict[str, str]:
        """A child of an array job sees its index (``AWS_BATCH_JOB_ARRAY_INDEX``), as on Batch."""
        index = (getattr(job, "array_properties", None) or {}).get("index")
        return {} if index is None else {"AWS_BATCH_JOB_ARRAY_INDEX": str(index)}

    def _role_credentials(self, job: Any) -> dict[str, str]:
        """STS credentials of the definition's `jobRoleArn` (what the container's role endpoint serves)."""
        role_arn = (job.job_definition.container_properties or {}).get("jobRoleArn")
        if not role_arn:
            return {}
        session = moto_compat.assume_role(
            job.backend.account_id, job.backend.region_name, job.job_id[:64], str(role_arn), 3600
        )
        return {
            "AWS_ACCESS_KEY_ID": session.access_key_id,
            "AWS_SECRET_ACCESS_KEY": session.secret_access_key,
            "AWS_SESSION_TOKEN": session.session_token,
        }

    def _secrets(self, job: Any) -> dict[str, str]:
        """The definition's `secrets` read as its execution role (see the module docstring); raises
        `SecretsUnavailable` naming the secret (never a value)."""
        props = job.job_definition.container_properties or {}
        items = props.get("secrets") or []
        if not items:
            return {}
        role_arn = props.get("executionRoleArn")
        if not role_arn:
            raise SecretsUnavailable("the job definition names secrets but no executionRoleArn")
        session = moto_compat.assume_role(
            job.backend.account_id, job.backend.region_name, job.job_id[:64], str(role_arn), 900
        )
        out: dict[str, str] = {}
        for item in items:
            env_name, value_from = str(item.get("name", "")), str(item.get("valueFrom", ""))
            region, secret_id = _secret_location(value_from, job.backend.region_name)
            arn = self._secret_arn(region, secret_id, job.backend.account_id)
            if not moto_compat.session_permits(session, "secretsmanager:GetSecretValue", arn or value_from):
                raise SecretsUnavailable(
                    f"AccessDeniedException: {session.arn} is not authorized to perform: "
                    f"secretsmanager:GetSecretValue on resource: {value_from}"
                )
            if arn is None:
                raise SecretsUnavailable(
                    f"ResourceNotFoundException: Secrets Manager can't find the specified secret {value_from}"
                )
            sm = self._session_client("secretsmanager", region, session)
            try:
                answer = sm.get_secret_value(SecretId=arn)
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                raise SecretsUnavailable(f"{code}: the secret {value_from} could not be read") from None
            if "SecretString" not in answer:
                raise SecretsUnavailable(f"the secret {value_from} is binary; only string secrets are passed")
            out[env_name] = str(answer["SecretString"])
        return out

    def _secret_arn(self, region: str, secret_id: str, account: str) -> str | None:
        """The secret's full ARN (DescribeSecret, as the runner: names and ARNs, never values), None when
        it does not exist."""
        try:
            arn = self._client("secretsmanager", region).describe_secret(SecretId=secret_id)["ARN"]
        except ClientError:
            return None
        return str(arn) if f":{account}:" in str(arn) else None

    def _session_client(self, service: str, region: str, session: Any) -> Any:
        """A client into moto signed with an STS session's credentials (not cached: short-lived)."""
        signed: Any = boto3.session.Session(
            aws_access_key_id=session.access_key_id,
            aws_secret_access_key=session.secret_access_key,
            aws_session_token=session.session_token,
            region_name=region,
        )
        client = signed.client(
            service,
            endpoint_url=self.endpoint_url,
            config=Config(retries={"max_attempts": 2, "mode": "standard"}),
        )
        client.meta.events.register("before-send", InProcessTransport(self.endpoint_url, metered=False))
        return client

    def _shipper(self, job: Any, target: LogTarget) -> LogShipper:
        logs = self._client("logs", target.region or job.backend.region_name)
        group, stream = target.group, target.stream
        with contextlib.suppress(ClientError):  # ResourceAlreadyExistsException
            logs.create_log_group(logGroupName=group)
        with contextlib.suppress(ClientError):  # a stream of an earlier run of the same attempt
            logs.create_log_stream(logGroupName=group, logStreamName=stream)
        shipper = LogShipper(_ExistingStreamOk(logs), group, stream, backoff_base_s=0.05, backoff_max_s=1.0)
        shipper.start()
        return shipper

    @staticmethod
    def _task_arn(job: Any, ce: Any, task_id: str) -> str:
        # The ECS cluster Batch made for the compute environment (moto names one for a managed CE).
        cluster = (ce.ecs_name or ce.name) if ce is not None else "local"
        return f"arn:aws:ecs:{job.backend.region_name}:{job.backend.account_id}:task/{cluster}/{task_id}"

    @staticmethod
    def _may_switch(argv: list[str]) -> bool:
        """A launcher job runs this interpreter: under a job uid only if any user may run it (a venv
        of a pyenv under /root may not be); then it runs as this process's user, as without root."""
        if argv[0] != sys.executable:
            return True
        if _world_runnable(Path(sys.executable).resolve()):
            return True
        if not _WARNED:
            _WARNED.append(True)
            print(
                f"berth local: {sys.executable} is not reachable by other users: Batch jobs that run "
                "the code-bundle launcher run as this user (docs/local-cloud.md)",
                file=sys.stderr,
            )
        return False

    def _work_root(self) -> Path:
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.work_root.chmod(0o711)  # jobs pass through to their own dirs; they list nothing
        return self.work_root

    # -- faults and shutdown ----------------------------------------------------------------------
    def spot_interrupt(self, berth_job_id: str) -> str | None:
        """Reclaim the instance of the Berth job's running Batch job (the latest attempt, by its name
        `<job_id>-a<n>`, or its child of a group's array job): the process is killed and the job
        fails with the spot reason."""
        wanted = from_aws_name(berth_job_id)
        with self._lock:
            candidates = [
                r
                for r in self._runs.values()
                if r.berth_job_id == wanted and r.handle is not None and not r.job.job_stopped
            ]
        if not candidates:
            return None
        run = max(candidates, key=lambda r: r.attempt)
        run.spot = True
        assert run.handle is not None
        run.handle.cancel(0)
        return str(run.job.job_id)

    def stop_all(self) -> None:
        """Kill every running job now (the local cloud stops)."""
        self._stopping = True
        with self._lock:
            handles = [r.handle for r in self._runs.values() if r.handle is not None]
        for handle in handles:
            handle.cancel(0)
        for handle in handles:
            handle.wait(10)


class _ExistingStreamOk:
    """The logs client for `LogShipper`, which creates its stream: an existing one is fine here."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def create_log_stream(self, **kwargs: Any) -> Any:
        try:
            return self._client.create_log_stream(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceAlreadyExistsException":
                return {}
            raise

    def put_log_events(self, **kwargs: Any) -> Any:
        return self._client.put_log_events(**kwargs)


def _secret_location(value_from: str, default_region: str) -> tuple[str, str]:
    """``(region, SecretId)`` of a ``valueFrom``: a Secrets Manager ARN (full or partial, without the
    ``:json-key:...`` selectors ECS also takes) or a bare name (the job's region)."""
    if value_from.startswith("arn:") and ":secret:" in value_from:
        head, _, name = value_from.partition(":secret:")
        return head.split(":")[3] or default_region, f"{head}:secret:{name.split(':')[0]}"
    return default_region, value_from


_WARNED: list[bool] = []


def _world_runnable(path: Path) -> bool:
    """Others may execute ``path`` and pass through every directory above it."""
    try:
        if not path.stat().st_mode & 0o001:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in path.parents)
    except OSError:
        return False


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


# -- installing the runner into moto ------------------------------------------------------------------
_PATCHES: list[moto_compat.Patch] = []
_RUNNER: list[LocalBatch] = []


def install(endpoint_url: str, runner: LocalBatch | None = None) -> LocalBatch:
    """Make `berth-*` queues run their jobs (idempotent; a new endpoint replaces the runner)."""
    local = runner if runner is not None else LocalBatch(endpoint_url)
    local.faults.clear()  # a new local cloud starts without the faults of an earlier one in this process
    _RUNNER[:] = [local]
    local.faults.spot_interrupt_handler = local.spot_interrupt
    if _PATCHES:
        return local
    original_submit = moto_compat.surface(SUBMIT_JOB)
    original_run = moto_compat.surface(JOB_RUN)

    def submit_job(
        self: Any, job_name: str, job_def_id: str, job_queue: str, *args: Any, **kwargs: Any
    ) -> Any:
        if _RUNNER and is_berth_queue(self.get_job_queue(job_queue)):
            return self.backend.submit_job(job_name, job_def_id, job_queue, *args, **kwargs)
        return original_submit(self, job_name, job_def_id, job_queue, *args, **kwargs)

    def run(job: Any) -> None:
        if is_berth_queue(job.job_queue) and _RUNNER:
            _RUNNER[0].execute(job)
        else:
            original_run(job)

    original_details = moto_compat.surface(CONTAINER_DETAILS)

    def container_details(job: Any) -> Any:
        # moto's merge appends AWS_BATCH_JOB_ID to the submit's own environment list on every describe
        # (DescribeJobs grew by one variable per call); it merges into a copy here.
        saved = (job.container_overrides or {}).get("environment")
        if saved is not None:
            job.container_overrides["environment"] = list(saved)
        try:
            details = original_details(job)
        finally:
            if saved is not None:
                job.container_overrides["environment"] = saved
        if job.job_stopped and job.exit_code is not None:  # DescribeJobs has container.exitCode on AWS
            details["exitCode"] = job.exit_code
        if job.job_stopped and job.latest_attempt and "reason" in job.latest_attempt.get("container", {}):
            details["reason"] = job.latest_attempt["container"]["reason"]
        return details

    _install_gang_patches()
    container_details.__wrapped__ = original_details  # type: ignore[attr-defined]
    _PATCHES.append(moto_compat.replace(CONTAINER_DETAILS, container_details))
    submit_job.__wrapped__ = original_submit  # type: ignore[attr-defined]
    run.__wrapped__ = original_run  # type: ignore[attr-defined]
    _PATCHES.append(moto_compat.replace(SUBMIT_JOB, submit_job))
    _PATCHES.append(moto_compat.replace(JOB_RUN, run))
    for path in SERIALISED:
        original = moto_compat.surface(path)

        def serialised(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            with _JOBS_LOCK:
                return __original(*args, **kwargs)

        functools.update_wrapper(serialised, original)
        _PATCHES.append(moto_compat.replace(path, serialised))
    return local


def _install_gang_patches() -> None:
    """SubmitJob keeps a gang's ``nodeOverrides`` on its job (moto drops them); DescribeJobs answers
    for gang nodes (``<job id>#<index>``) too."""
    original_submitjob = moto_compat.surface(SUBMIT_JOB_RESPONSE)
    get_param = moto_compat.surface("moto.batch.responses:BatchResponse._get_param")

    def submitjob(self: Any) -> str:
        overrides = get_param(self, "nodeOverrides")
        with _JOBS_LOCK:  # the job's thread reads them under the same lock
            body = str(original_submitjob(self))
            if overrides:
                job = self.batch_backend.get_job_by_id(json.loads(body)["jobId"])
                if job is not None:
                    setattr(job, local_batch_gang.NODE_OVERRIDES_ATTR, overrides)
        return body

    original_describe = moto_compat.surface(DESCRIBE_JOBS)

    def describe_jobs(self: Any, jobs: list[str] | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = original_describe(self, jobs)
        nodes = [j for j in jobs or [] if "#" in j]
        if nodes and _RUNNER:
            found.extend(_RUNNER[0].describe_nodes(nodes))
        return found

    submitjob.__wrapped__ = original_submitjob  # type: ignore[attr-defined]
    describe_jobs.__wrapped__ = original_describe  # type: ignore[attr-defined]
    _PATCHES.append(moto_compat.replace(SUBMIT_JOB_RESPONSE, submitjob))
    _PATCHES.append(moto_compat.replace(DESCRIBE_JOBS, describe_jobs))


def current() -> LocalBatch | None:
    return _RUNNER[0] if _RUNNER else None


def stop_all() -> None:
    """Kill the running jobs (the moto server is stopping). The patches stay (moto resets its jobs) but
    do nothing until a local cloud installs a runner again: moto's own Batch answers meanwhile."""
    if _RUNNER:
        _RUNNER[0].stop_all()
        _RUNNER.clear()
