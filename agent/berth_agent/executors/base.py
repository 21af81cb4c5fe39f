"""What every executor shares: the launch description, the result, failure classes, the job's env.

An executor turns a ``Launch`` (one attempt of one job on this host, already staged) into a running
``RunHandle``; the daemon loop polls handles, cancels them, and reports their ``JobResult``::

    handle = executor.start(launch, on_line=shipper.emit_line)
    while (result := handle.poll()) is None: ... heartbeat ...; maybe handle.cancel(grace_s)
    report(result.exit_code, result.failure, result.message)

``job_environment`` is the one place that decides what a job's environment holds: the job's own
``env``, its resolved secrets and its attempt's scoped credentials, ``BERTH_*`` facts, the
rendezvous variables of a multi-node attempt, and ``CUDA_VISIBLE_DEVICES``/``NVIDIA_VISIBLE_DEVICES``
naming only its GPUs. Nothing is inherited from the agent.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from berth.domain.reasons import exit_words

log = logging.getLogger(__name__)

#: Keys a job's own ``env`` may not set (the spec refuses them too; this is the host's own check).
RESERVED_PREFIXES = ("AWS_", "BERTH_", "NVIDIA_", "LD_")
RESERVED_KEYS = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})
#: The only AWS variables a job gets: its attempt's scoped credentials, as values or (process jobs,
#: refreshed: berth_agent.attempt_credentials) as a config file whose credential_process prints them
#: (in a Batch container, the job role's credentials endpoint, which the launcher passes on).
CREDENTIAL_KEYS = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONFIG_FILE",
        "AWS_SDK_LOAD_CONFIG",
    }
)
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Receives each line of job output: (stream name "stdout"|"stderr", line without its newline).
LineSink = Callable[[str, str], None]


class FailureKind(StrEnum):
    NONZERO_EXIT = "nonzero_exit"
    TIMEOUT = "timeout"
    OOM = "oom"
    BAD_IMAGE = "bad_image"
    STAGING = "staging"
    INVALID_BUNDLE = "invalid_bundle"
    CANCELED = "canceled"
    AGENT_ERROR = "agent_error"


@dataclass(frozen=True, slots=True)
class JobResult:
    exit_code: int | None
    failure: FailureKind | None
    message: str = ""

    @property
    def succeeded(self) -> bool:
        return self.failure is None


@dataclass(frozen=True, slots=True)
class Mount:
    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """A multi-node attempt's coordinates (from the claim); this host runs rank ``rank``."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master port {self.master_port} is not a TCP port")

    def env(self) -> dict[str, str]:
        # One rank per host (issue 10) or per Batch node: the node rank is the rank. torchrun's names,
        # and Berth's own (the same on-prem and in the cloud, whatever a launcher does with the others).
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(self.rank),
            "NODE_RANK": str(self.rank),
            "BERTH_RANK": str(self.rank),
            "BERTH_WORLD_SIZE": str(self.world_size),
        }


@dataclass(frozen=True, slots=True)
class Limits:
    cpus: float | None = None
    memory_gib: float | None = None
    #: rlimits for the process executor (None = not set).
    address_space_bytes: int | None = None
    nofile: int | None = None
    cpu_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class Launch:
    """One attempt of one job on this host, staged and ready to start."""

    job_id: str
    attempt: int
    tenant: str
    command: tuple[str, ...]
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_uuids: tuple[str, ...] = ()
    timeout_s: float | None = None
    image: str | None = None
    mounts: tuple[Mount, ...] = ()
    output_dir: Path | None = None
    checkpoint_dir: Path | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    rendezvous: Rendezvous | None = None
    limits: Limits = Limits()
    array_env: Mapping[str, str] = field(default_factory=dict)
    """``BERTH_ARRAY_*`` and ``BERTH_PARAM_*`` of an array task (from its spec's ``array_task``)."""
    attempt_key: str | None = None
    """The run's marker (``BERTH_ATTEMPT_KEY``, berth_agent.containment): every process of the run
    inherits it, so one that detached (``setsid``, a double fork) is still found and killed."""

    @property
    def name(self) -> str:
        """A name for the run (container, Kubernetes Job): unique per attempt, DNS-label safe."""
        return f"berth-{self.job_id}-{self.attempt}".lower().replace("_", "-").replace(":", "-")[:63]


#: The only reserved names a launch may carry from the control plane's spec (an array task's place).
ARRAY_ENV_PREFIXES = ("BERTH_ARRAY_", "BERTH_PARAM_")


def _reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIXES) or key in RESERVED_KEYS


def job_environment(
    launch: Launch,
    *,
    home: str,
    output_dir: str | None,
    checkpoint_dir: str | None,
) -> dict[str, str]:
    """The complete environment of ``launch``'s process; paths as the job sees them."""
    env = {"PATH": SAFE_PATH, "HOME": home, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    for source in (launch.env, launch.secrets):
        for key, value in source.items():
            if _reserved(key):
                log.warning("reserved variable dropped from a job's env", extra={"key": key})
                continue
            env[key] = value
    for key, value in launch.credentials.items():
        if key not in CREDENTIAL_KEYS:
            raise ValueError(f"{key} is not a credential variable")
        env[key] = value
    for key, value in launch.array_env.items():
        if key.startswith(ARRAY_ENV_PREFIXES):
            env[key] = value
    env["BERTH_JOB_ID"] = launch.job_id
    env["BERTH_ATTEMPT"] = str(launch.attempt)
    if launch.attempt_key is not None:
        env["BERTH_ATTEMPT_KEY"] = launch.attempt_key
    if output_dir is not None:
        env["BERTH_OUTPUT_DIR"] = output_dir
    if checkpoint_dir is not None:
        env["BERTH_CHECKPOINT_DIR"] = checkpoint_dir
    if launch.rendezvous is not None:
        env.update(launch.rendezvous.env())
    gpus = ",".join(launch.gpu_uuids)
    env["CUDA_VISIBLE_DEVICES"] = gpus  # empty hides every GPU
    env["NVIDIA_VISIBLE_DEVICES"] = gpus or "void"
    return env


_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "MemoryError", "std::bad_alloc")
_IMAGE_MARKERS = (
    "Unable to find image",
    "pull access denied",
    "manifest unknown",
    "repository does not exist",
    "image not known",
    "invalid reference format",
    "ErrImagePull",
    "ImagePullBackOff",
)


def classify(
    returncode: int | None,
    *,
    canceled: bool,
    timed_out: bool,
    stderr_tail: list[str],
    container: bool = False,
) -> JobResult:
    """The one rule for turning how a run ended into a ``JobResult``.

    ``stderr_tail`` only helps to tell the kind (an image that could not be pulled, a CUDA out of
    memory): the message is Berth's own words with the exit code or signal, never job output, which
    may hold anything the job printed (its secrets among it) and goes to the job's log only. The
    control plane adds where to read that log."""
    tail = "\n".join(stderr_tail)
    if canceled:
        return JobResult(returncode, FailureKind.CANCELED, "canceled")
    if timed_out:
        return JobResult(returncode, FailureKind.TIMEOUT, "stopped at its timeout_minutes limit")
    if returncode == 0:
        return JobResult(0, None, "")
    ended = exit_words(returncode)
    if container and returncode == 125:
        if any(m in tail for m in _IMAGE_MARKERS):
            return JobResult(returncode, FailureKind.BAD_IMAGE, f"the image could not be pulled ({ended})")
        return JobResult(returncode, FailureKind.AGENT_ERROR, f"the container runtime failed ({ended})")
    if returncode is not None and (returncode == -9 or (container and returncode == 137)):
        return JobResult(returncode, FailureKind.OOM, f"out of memory ({ended})")
    if any(m in tail for m in _OOM_MARKERS):
        return JobResult(returncode, FailureKind.OOM, f"out of memory: the job said so ({ended})")
    return JobResult(returncode, FailureKind.NONZERO_EXIT, ended)


class RunHandle(ABC):
    """A started run. ``poll`` never blocks; ``cancel`` never blocks (the kill follows after grace)."""

    @abstractmethod
    def poll(self) -> JobResult | None: ...

    @abstractmethod
    def wait(self, timeout: float | None = None) -> JobResult | None: ...

    @abstractmethod
    def cancel(self, grace_s: float) -> None: ...

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """The host process (group leader) of the run, for sampling and re-adoption; None if none."""

    @property
    def cgroup_path(self) -> str | None:
        """The run's own cgroup (cgroup v2 containment), recorded in the ledger; None if none."""
        return None


class Executor(ABC):
    #: How a run's processes are held together (berth_agent.containment.Mode), for the inventory.
    containment: str = "none"

    @abstractmethod
    def start(self, launch: Launch, on_line: LineSink) -> RunHandle:
        """Start ``launch``; raises ``StartError`` when it cannot start at all."""


class StartError(Exception):
    def __init__(self, failure: FailureKind, message: str) -> None:
        super().__init__(message)
        self.failure = failure
