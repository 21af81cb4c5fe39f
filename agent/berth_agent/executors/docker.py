"""Run an image job with docker or podman, locked down, through the process machinery.

``container_argv(launch, ...)`` is the single place that decides the container's privileges:

- GPUs: docker ``--gpus "device=<uuid>,<uuid>"`` (the quotes are part of the value: docker reads
  it as CSV); podman ``--device nvidia.com/gpu=<uuid>`` per GPU (CDI). Only the attempt's UUIDs.
- never ``--privileged``; ``--cap-drop ALL``; ``--security-opt no-new-privileges``; the runtime's
  default seccomp profile (never ``seccomp=unconfined``); ``--read-only`` root with a ``nosuid,nodev``
  tmpfs at /tmp; ``--user 65534:65534``; ``--pids-limit``; ``--memory``/``--cpus`` from the spec;
  ``--network`` from the host's config; ``--init`` so signals reach the job.
- mounts: data read-only (podman adds ``nosuid,nodev``; docker has no such bind option, and with
  no-new-privileges plus no capabilities set-uid bits and device nodes are inert), outputs and
  checkpoints read-write, the per-job dir as the working directory. Never the runtime's socket.
- environment: ``--env NAME`` without a value for every variable, the values living only in the
  CLI process's environment (readable by the agent's user alone), never in argv where ``ps`` shows
  them to every user of the host.

Cancel: ``<runtime> stop --time <grace>`` (SIGTERM in the container, SIGKILL after grace), then
the CLI's process group is killed as for any process.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from berth_agent.config import ContainerConfig
from berth_agent.executors.base import (
    Executor,
    FailureKind,
    Launch,
    LineSink,
    RunHandle,
    StartError,
    job_environment,
)
from berth_agent.executors.process import ProcessRun

log = logging.getLogger(__name__)

Runtime = Literal["docker", "podman"]

WORKDIR = "/berth/work"
OUTPUT_DIR = "/berth/outputs"
CHECKPOINT_DIR = "/berth/checkpoints"
#: Variables the runtime CLI itself may need from the agent's environment; never forwarded into the
#: container (only ``--env NAME`` names are).
CLI_PASSTHROUGH = ("DOCKER_HOST", "DOCKER_CONFIG", "XDG_RUNTIME_DIR", "CONTAINERS_CONF", "CONTAINER_HOST")


def container_environment(launch: Launch) -> dict[str, str]:
    return job_environment(launch, home=WORKDIR, output_dir=OUTPUT_DIR, checkpoint_dir=CHECKPOINT_DIR)


def _bind(runtime: Runtime, source: str, target: str, read_only: bool) -> list[str]:
    if "," in source or "," in target or ":" in target:
        raise StartError(FailureKind.STAGING, f"mount path {source} -> {target} holds ',' or ':'")
    if runtime == "podman":
        opts = "ro,nosuid,nodev" if read_only else "rw,nosuid,nodev"
        return ["--volume", f"{source}:{target}:{opts}"]
    spec = f"type=bind,source={source},target={target}"
    return ["--mount", spec + (",readonly" if read_only else "")]


def container_argv(
    launch: Launch,
    *,
    runtime: Runtime,
    binary: str,
    config: ContainerConfig,
    env_names: Sequence[str],
) -> list[str]:
    """The full ``<runtime> run`` argv for ``launch`` (see the module docstring for each choice)."""
    if launch.image is None:
        raise StartError(FailureKind.BAD_IMAGE, "a container job needs an image")
    argv = [
        binary,
        "run",
        "--rm",
        "--name",
        launch.name,
        "--init",
        "--user",
        config.user,
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,size=1g",
        "--pids-limit",
        str(config.pids_limit),
        "--shm-size",
        config.shm_size,
        "--network",
        config.network,
        "--workdir",
        WORKDIR,
        "--label",
        f"berth.job-id={launch.job_id}",
        "--label",
        f"berth.attempt={launch.attempt}",
    ]
    if launch.gpu_uuids:
        if runtime == "docker":
            argv += ["--gpus", '"device=' + ",".join(launch.gpu_uuids) + '"']
        else:
            for uuid in launch.gpu_uuids:
                argv += ["--device", f"nvidia.com/gpu={uuid}"]
    if launch.limits.memory_gib is not None:
        mib = int(launch.limits.memory_gib * 1024)
        argv += ["--memory", f"{mib}m", "--memory-swap", f"{mib}m"]
    if launch.limits.cpus is not None:
        argv += ["--cpus", f"{launch.limits.cpus:g}"]
    argv += _bind(runtime, str(launch.workdir), WORKDIR, read_only=False)
    if launch.output_dir is not None:
        argv += _bind(runtime, str(launch.output_dir), OUTPUT_DIR, read_only=False)
    if launch.checkpoint_dir is not None:
        argv += _bind(runtime, str(launch.checkpoint_dir), CHECKPOINT_DIR, read_only=False)
    for m in launch.mounts:
        if m.target.startswith("/berth/"):
            raise StartError(FailureKind.STAGING, f"mount target {m.target} is reserved")
        argv += _bind(runtime, str(m.source), m.target, read_only=m.read_only)
    for name in sorted(env_names):
        argv += ["--env", name]
    argv.append(launch.image)
    argv += list(launch.command)
    return argv


class ContainerExecutor(Executor):
    containment = "container"

    def __init__(
        self,
        runtime: Runtime,
        config: ContainerConfig,
        *,
        timeout_grace_s: float = 30.0,
        environ: Mapping[str, str] | None = None,
        run: Callable[[list[str]], object] | None = None,
    ) -> None:
        self.runtime: Runtime = runtime
        self.config = config
        self.binary = config.binary or shutil.which(runtime) or runtime
        self.timeout_grace_s = timeout_grace_s
        self._environ = os.environ if environ is None else environ
        self._run = run or self._run_cli

    @staticmethod
    def _run_cli(argv: list[str]) -> object:
        return subprocess.run(argv, capture_output=True, timeout=3600, check=False)

    def _stopper(self, name: str) -> Callable[[float], None]:
        def stop(grace_s: float) -> None:
            argv = [self.binary, "stop", "--time", str(int(grace_s)), name]
            # In the background: ``stop`` blocks for up to the grace, and cancel must not.
            threading.Thread(target=self._run, args=(argv,), daemon=True, name=f"stop-{name}").start()

        return stop

    @staticmethod
    def open_dirs(launch: Launch) -> None:
        """The container user (65534, or its user-namespace mapping) must write its work, outputs and
        checkpoints: they become 0777, and their parent (the attempt's directory) 0700, the agent's
        only. The runtime (root's daemon, or rootless podman as the agent) reaches them; container
        processes see only their own mounts; no other host user can walk into them."""
        for d in (launch.workdir, launch.output_dir, launch.checkpoint_dir):
            if d is not None:
                d.chmod(0o777)
                d.parent.chmod(0o700)

    def start(self, launch: Launch, on_line: LineSink) -> RunHandle:
        env = container_environment(launch)
        argv = container_argv(
            launch, runtime=self.runtime, binary=self.binary, config=self.config, env_names=list(env)
        )
        self.open_dirs(launch)
        cli_env = {k: v for k, v in self._environ.items() if k in CLI_PASSTHROUGH}
        cli_env.update(env)
        log.info("starting container", extra={"job_id": launch.job_id, "attempt": launch.attempt})
        return ProcessRun(
            argv,
            env=cli_env,
            cwd=launch.workdir,
            on_line=on_line,
            timeout_s=launch.timeout_s,
            timeout_grace_s=self.timeout_grace_s,
            terminate=self._stopper(launch.name),
            container=True,
        )
