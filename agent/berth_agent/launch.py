"""``python -m berth_agent.launch``: one code-bundle attempt inside a cloud container (AWS Batch).

The Batch job definition of a code-bundle job runs this module in the configured base image with
``BERTH_LAUNCH`` = a JSON launch spec (docs/cloud-interface: job_id, attempt, tenant, command, env,
code {uri, digest} | null, data [{source, mount}], outputs {bucket, prefix}, checkpoint_prefix,
timeout_s, aws_region, endpoint_url | null, secret_env: [ENV_NAME] | absent; for a child of a group's
array job, a ``tasks`` table instead of job_id, command and array_env, whose row
``AWS_BATCH_JOB_ARRAY_INDEX`` picks: ``task_row``). It does what the
agent's process executor does for an on-prem attempt, with the same functions, so a job behaves the
same on both sites:

1. the per-attempt directories (``staging.JobDirs``);
2. the bundle fetched from ``code.uri`` and verified against ``code.digest`` before anything is
   unpacked (``staging.stage_bundle``; a mismatch is refused and nothing runs);
3. each ``s3://`` data source staged through the object cache (``awsio.BotocoreIO.stage_s3``) and
   linked at ``<workdir>/<mount>`` (``ProcessExecutor.link_mounts``), checkpoints of an earlier
   attempt restored (``outputs.restore``);
4. the command run by ``ProcessExecutor`` (own process group, the environment of
   ``executors.base.job_environment``: the job's env, ``BERTH_*``, ``BERTH_OUTPUT_DIR``,
   ``BERTH_CHECKPOINT_DIR``, the container's AWS credentials, the values of the ``secret_env``
   variables ECS put in this container's environment from the definition's ``secrets``, and nothing
   else), its output passed
   through to this process's stdout/stderr (the awslogs driver ships it);
5. outputs and checkpoints synced while it runs and once at its end (``outputs.PeriodicSync``);
6. exit with the command's exit code: 124 when it ran past ``timeout_s``, 143 when stopped by
   SIGTERM (Batch TerminateJob), 128+N when killed by signal N, ``EXIT_STAGING`` (65) when an input
   could not be staged, ``EXIT_INVALID_BUNDLE`` (66) when the code bundle is a broken archive,
   ``EXIT_NOT_FOUND`` (127) when the command does not exist, ``EXIT_USAGE`` (64)
   for a malformed spec. A line ``berth-launch: ...`` on stderr says why for every code of its own.

A node of a gang (an AWS Batch multi-node parallel job, ``resources.nodes`` > 1) also gets the
rendezvous variables an on-prem rank gets (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``,
``NODE_RANK``, ``BERTH_RANK``, ``BERTH_WORLD_SIZE``), from Batch's (``batch_gang.batch_rendezvous``),
and says which node it is in its first line; each node's output is its own log stream.

Credentials come from the environment (the Batch job role; locally the local Batch runner passes
the role's STS credentials). Only the agent's light dependencies: botocore, never boto3 or moto.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from berth.domain.agent_wire import LaunchDocument, LaunchTask
from berth_agent.batch_gang import GangEnvError, batch_rendezvous
from berth_agent.executors.base import (
    CREDENTIAL_KEYS,
    FailureKind,
    JobResult,
    Launch,
    Mount,
    Rendezvous,
    StartError,
)
from berth_agent.executors.process import ProcessExecutor
from berth_agent.outputs import DirSync, PeriodicSync, restore
from berth_agent.staging import (
    InvalidBundle,
    JobDirs,
    ObjectCache,
    StagingError,
    parse_digest,
    stage_bundle,
)

LAUNCH_ENV = "BERTH_LAUNCH"
WORK_DIR_ENV = "BERTH_LAUNCH_WORK_DIR"
EXIT_USAGE = 64
EXIT_STAGING = 65
#: The code bundle is a broken archive (``staging.InvalidBundle``): the control plane reads this code
#: of the launcher as the permanent ``InvalidBundle`` (``berth.domain.cloud.failed_outcome``).
EXIT_INVALID_BUNDLE = 66
EXIT_TIMEOUT = 124
EXIT_NOT_FOUND = 127
EXIT_TERMINATED = 143
DEFAULT_SYNC_INTERVAL_S = 30.0
DEFAULT_GRACE_S = 20.0  # Batch (ECS) kills the container 30 s after SIGTERM: 10 s left for the final sync
CACHE_BYTES = 64 * 1024**3
_TICK_S = 0.2


ARRAY_INDEX_ENV = "AWS_BATCH_JOB_ARRAY_INDEX"


class LaunchSpecError(ValueError):
    pass


class NoTaskHere(LaunchSpecError):
    """A child of a group's array job whose task no longer runs this attempt: it runs nothing."""


def task_row(obj: dict[str, Any], array_index: str | None) -> dict[str, Any]:
    """The launch spec of this container: the spec itself, or, for a child of a group's Batch array
    job (a ``tasks`` table, one row per child), the spec with the row ``array_index`` names merged in
    (its ``job_id``, ``command`` and ``array_env``)."""
    tasks = obj.get("tasks")
    if tasks is None:
        return obj
    if not isinstance(tasks, list) or not tasks:
        raise LaunchSpecError("tasks must be a non-empty list")
    if array_index is None or not array_index.isdigit() or int(array_index) >= len(tasks):
        raise LaunchSpecError(f"{ARRAY_INDEX_ENV}={array_index!r} names no row of the {len(tasks)} tasks")
    row = tasks[int(array_index)]
    if row is None:
        raise NoTaskHere(f"child {array_index} of the group has no task to run (it moved on)")
    try:
        task = LaunchTask.model_validate(row)
    except ValidationError as exc:
        raise LaunchSpecError(f"tasks[{array_index}] is not a task row: {exc}") from exc
    merged = {k: v for k, v in obj.items() if k != "tasks"}
    merged.update(task.model_dump(mode="json"))
    return merged


@dataclass(frozen=True, slots=True)
class DataItem:
    source: str
    mount: str


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    job_id: str
    attempt: int
    tenant: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    code_uri: str | None = None
    code_digest: str | None = None
    data: tuple[DataItem, ...] = ()
    outputs_bucket: str | None = None
    outputs_prefix: str | None = None
    checkpoint_prefix: str | None = None
    timeout_s: float | None = None
    aws_region: str = "us-east-1"
    endpoint_url: str | None = None
    sync_interval_s: float = DEFAULT_SYNC_INTERVAL_S
    grace_s: float = DEFAULT_GRACE_S
    array_env: Mapping[str, str] = field(default_factory=dict)
    """An array task's ``BERTH_ARRAY_*`` / ``BERTH_PARAM_*`` variables."""
    secret_env: tuple[str, ...] = ()
    """Names of variables ECS resolved from Secrets Manager (the values never sit in the spec)."""

    @classmethod
    def parse(cls, raw: str | Mapping[str, Any], array_index: str | None = None) -> LaunchSpec:
        """The spec in ``raw``; ``array_index``: ``AWS_BATCH_JOB_ARRAY_INDEX`` (a group's child)."""
        try:
            obj = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except ValueError as exc:
            raise LaunchSpecError(f"{LAUNCH_ENV} is not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise LaunchSpecError(f"{LAUNCH_ENV} is not a JSON object")
        obj = task_row(obj, array_index)
        try:
            doc = LaunchDocument.model_validate(obj)  # the model the control plane wrote it with
        except ValidationError as exc:
            raise LaunchSpecError(f"{LAUNCH_ENV} is malformed: {exc}") from exc
        code_uri = code_digest = None
        if doc.code is not None:
            code_uri = doc.code.uri
            code_digest = parse_digest(doc.code.digest)
            if code_digest is None:
                raise LaunchSpecError(f"code.digest {doc.code.digest!r} is not sha256:<64 hex>")
        for name, prefix in (
            ("outputs.prefix", doc.outputs.prefix),
            ("checkpoint_prefix", doc.checkpoint_prefix),
        ):
            if prefix is not None and not prefix.endswith("/"):
                raise LaunchSpecError(f"{name} must end with '/'")
        spec = cls(
            job_id=doc.job_id,
            attempt=doc.attempt,
            tenant=doc.tenant,
            command=doc.command,
            env=doc.env,
            array_env=doc.array_env,
            code_uri=code_uri,
            code_digest=code_digest,
            data=tuple(DataItem(d.source, d.mount) for d in doc.data),
            outputs_bucket=doc.outputs.bucket,
            outputs_prefix=doc.outputs.prefix,
            checkpoint_prefix=doc.checkpoint_prefix,
            timeout_s=doc.timeout_s,
            aws_region=doc.aws_region,
            endpoint_url=doc.endpoint_url,
            sync_interval_s=DEFAULT_SYNC_INTERVAL_S if doc.sync_interval_s is None else doc.sync_interval_s,
            grace_s=DEFAULT_GRACE_S if doc.grace_s is None else doc.grace_s,
            secret_env=doc.secret_env,
        )
        if spec.attempt < 1:
            raise LaunchSpecError("attempt must be >= 1")
        if (spec.outputs_prefix or spec.checkpoint_prefix) and not spec.outputs_bucket:
            raise LaunchSpecError("outputs.bucket is required with an outputs or checkpoint prefix")
        return spec


def exit_code_of(result: JobResult) -> int:
    """The launcher's exit code for how the command ended (what Batch records as the container's)."""
    if result.failure is FailureKind.TIMEOUT:
        return EXIT_TIMEOUT
    if result.failure is FailureKind.CANCELED:
        return EXIT_TERMINATED
    code = result.exit_code
    if code is None:
        return EXIT_STAGING if result.failure is FailureKind.STAGING else 1
    return 128 - code if code < 0 else code


def _gpu_env(environ: Mapping[str, str], env: dict[str, str]) -> None:
    """The GPUs the container runtime gave this container (``NVIDIA_VISIBLE_DEVICES``) stay visible to
    the job; ``job_environment`` alone would hide every GPU (it names only the agent's assignment)."""
    visible = environ.get("NVIDIA_VISIBLE_DEVICES", "")
    if visible and visible not in ("void", "none"):
        env["NVIDIA_VISIBLE_DEVICES"] = visible
        if visible == "all":
            env.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            env["CUDA_VISIBLE_DEVICES"] = visible


class _ContainerExecutor(ProcessExecutor):
    """The process executor, keeping visible the GPUs the container runtime gave this container."""

    def __init__(self, environ: Mapping[str, str], *, timeout_grace_s: float) -> None:
        super().__init__(timeout_grace_s=timeout_grace_s)
        self._environ = environ

    def environment(self, launch: Launch) -> dict[str, str]:
        env = super().environment(launch)
        _gpu_env(self._environ, env)
        return env


class Launcher:
    def __init__(
        self,
        spec: LaunchSpec,
        *,
        io: Any,
        work_dir: Path,
        environ: Mapping[str, str],
        stdout: IO[str] = sys.stdout,
        stderr: IO[str] = sys.stderr,
        rendezvous: Rendezvous | None = None,
    ) -> None:
        self.spec, self.io, self.work_dir, self.environ = spec, io, work_dir, environ
        self.rendezvous = rendezvous
        self.stdout, self.stderr = stdout, stderr
        self._out_lock = threading.Lock()
        self._handle: Any = None
        self._stop_requested = threading.Event()

    def say(self, message: str) -> None:
        with self._out_lock:
            print(f"berth-launch: {message}", file=self.stderr, flush=True)

    def _line(self, stream: str, line: str) -> None:
        with self._out_lock:
            target = self.stderr if stream == "stderr" else self.stdout
            target.write(line + "\n")
            target.flush()

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM to the job's group now, SIGKILL after the grace (TerminateJob, spot reclaim)."""
        self._stop_requested.set()
        if self._handle is not None:
            self._handle.cancel(self.spec.grace_s if grace_s is None else grace_s)

    def run(self) -> int:
        spec = self.spec
        rdv = self.rendezvous
        if rdv is not None:
            self.say(
                f"rank {rdv.rank} of {rdv.world_size} (gang node), master {rdv.master_addr}:{rdv.master_port}"
            )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        dirs = JobDirs.create(self.work_dir, spec.job_id, spec.attempt)
        try:
            try:
                mounts = self._stage(dirs)
            except InvalidBundle as exc:
                self.say(f"invalid bundle: {exc}")
                return EXIT_INVALID_BUNDLE
            except StagingError as exc:
                self.say(f"staging failed: {exc}")
                return EXIT_STAGING
            missing = [n for n in spec.secret_env if n not in self.environ]
            if missing:
                self.say(f"secrets not in the container's environment: {', '.join(missing)}")
                return EXIT_STAGING
            executor = _ContainerExecutor(self.environ, timeout_grace_s=spec.grace_s)
            launch = Launch(
                job_id=spec.job_id,
                attempt=spec.attempt,
                tenant=spec.tenant,
                command=spec.command,
                workdir=dirs.work,
                env=dict(spec.env),
                timeout_s=spec.timeout_s,
                mounts=mounts,
                output_dir=dirs.outputs,
                checkpoint_dir=dirs.checkpoints,
                credentials={k: v for k, v in self.environ.items() if k in CREDENTIAL_KEYS},
                secrets={n: self.environ[n] for n in spec.secret_env},
                array_env=dict(spec.array_env),
                rendezvous=rdv,
            )
            syncs = PeriodicSync(self._syncs(dirs), spec.sync_interval_s)
            try:
                self._handle = executor.start(launch, self._line)
            except StartError as exc:
                self.say(str(exc))
                if exc.failure is FailureKind.STAGING:
                    return EXIT_STAGING
                return EXIT_NOT_FOUND if exc.failure is FailureKind.NONZERO_EXIT else 1
            if self._stop_requested.is_set():
                self._handle.cancel(spec.grace_s)
            try:
                while (result := self._handle.wait(_TICK_S)) is None:
                    syncs.tick()
            finally:
                for synced in syncs.final():
                    if synced.failed:
                        self.say(f"{synced.failed} output file(s) could not be uploaded")
            code = exit_code_of(result)
            if result.failure is FailureKind.TIMEOUT:
                self.say(f"stopped at its timeout ({spec.timeout_s:g}s)")
            return code
        finally:
            dirs.remove()

    def _stage(self, dirs: JobDirs) -> tuple[Mount, ...]:
        spec = self.spec
        if spec.code_uri is not None and spec.code_digest is not None:
            uri, digest = spec.code_uri, spec.code_digest
            stage_bundle(
                lambda path: self.io.fetch_bundle_uri(uri, digest, path),
                digest,
                dirs.base / "bundle",
                dirs.work,
            )
        mounts = []
        for i, item in enumerate(spec.data):
            if not item.source.startswith("s3://"):
                raise StagingError(f"{item.source}: a cloud attempt stages only s3:// data")
            source = self.io.stage_s3(item.source, dirs.base / "data" / str(i))
            mounts.append(Mount(source=source, target=item.mount))
        if spec.attempt > 1 and spec.checkpoint_prefix:
            restore(dirs.checkpoints, spec.checkpoint_prefix, self.io.list_keys, self.io.get)
        return tuple(mounts)

    def _syncs(self, dirs: JobDirs) -> list[DirSync]:
        out = []
        if self.spec.outputs_prefix:
            out.append(DirSync(dirs.outputs, self.spec.outputs_prefix, self.io.put))
        if self.spec.checkpoint_prefix:
            out.append(DirSync(dirs.checkpoints, self.spec.checkpoint_prefix, self.io.put))
        return out


def botocore_io(spec: LaunchSpec, cache_dir: Path) -> Any:
    """S3 access with the container's own credentials (the job role), through an object cache."""
    import botocore.session

    from berth_agent.awsio import BotocoreIO

    session = botocore.session.Session()
    kw: dict[str, Any] = {"region_name": spec.aws_region}
    if spec.endpoint_url:
        kw["endpoint_url"] = spec.endpoint_url
    clients = {name: session.create_client(name, **kw) for name in ("s3", "logs", "secretsmanager")}
    bucket = spec.outputs_bucket or ""
    return BotocoreIO(
        clients, cache=ObjectCache(cache_dir, CACHE_BYTES), artifacts_bucket=bucket, data_bucket=bucket
    )


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    raw = env.get(LAUNCH_ENV)
    if not raw:
        print(f"berth-launch: {LAUNCH_ENV} is not set", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        spec = LaunchSpec.parse(raw, env.get(ARRAY_INDEX_ENV))
    except NoTaskHere as exc:
        print(f"berth-launch: {exc}", file=sys.stderr, flush=True)
        return 0
    except LaunchSpecError as exc:
        print(f"berth-launch: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        rendezvous = batch_rendezvous(env)
    except GangEnvError as exc:
        print(f"berth-launch: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    work_dir = Path(env.get(WORK_DIR_ENV) or Path(tempfile.gettempdir()) / "berth-launch")
    work_dir.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(
        spec, io=botocore_io(spec, work_dir / "cache"), work_dir=work_dir, environ=env, rendezvous=rendezvous
    )

    def on_signal(signum: int, _frame: Any) -> None:
        launcher.say(f"signal {signum}: stopping the job")
        launcher.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return launcher.run()


if __name__ == "__main__":  # pragma: no cover - exercised by the tests as a subprocess
    sys.exit(main())
