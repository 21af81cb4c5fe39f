"""The agent's configuration: a YAML file, then ``BERTH_AGENT_*`` environment overrides.

``load()`` reads ``$BERTH_AGENT_CONFIG`` (default ``/etc/berth-agent/config.yaml``; a missing file is
fine when the environment says everything). Environment variables override the file: the name after
the prefix is the field, ``__`` goes one level down, and a value starting with ``{`` or ``[`` is read
as YAML/JSON and
replaces the file's value as a whole::

    BERTH_AGENT_POOL=lab-a
    BERTH_AGENT_GPUS__DISCOVERY=simulated
    BERTH_AGENT_GPUS__SIMULATED__COUNT=4
    BERTH_AGENT_DATASETS='{"imagenet": "/data/imagenet"}'

Unknown keys (in the file or the environment) are refused, so a typo never passes silently.
Deliberately plain pydantic (no pydantic-settings): the host's dependency set stays small.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "BERTH_AGENT_"
CONFIG_ENV = "BERTH_AGENT_CONFIG"
DEFAULT_CONFIG_PATH = Path("/etc/berth-agent/config.yaml")


class ConfigError(Exception):
    """The configuration is missing, unreadable or invalid; the message says which field."""


class ExecutorKind(StrEnum):
    PROCESS = "process"
    DOCKER = "docker"
    PODMAN = "podman"
    KUBERNETES = "kubernetes"


class DiscoveryMode(StrEnum):
    #: NVML; when NVML is absent or fails, the declared simulated inventory (logged as such).
    NVML = "nvml"
    SIMULATED = "simulated"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimulatedInventory(_Section):
    gpu_type: str = "H100"
    count: Annotated[int, Field(ge=0, le=64)] = 1
    memory_gib: Annotated[int, Field(ge=1, le=1024)] = 80
    #: Faults injected into the simulated GPUs (JSON lines, ``berth_agent.gpu_health``); None: none.
    faults_file: Path | None = None


class GpuConfig(_Section):
    discovery: DiscoveryMode = DiscoveryMode.NVML
    simulated: SimulatedInventory = SimulatedInventory()
    #: How often the GPU health watcher polls NVML's counters (XID events arrive as they happen).
    health_poll_s: Annotated[float, Field(gt=0, le=300)] = 5.0


class LogConfig(_Section):
    """CloudWatch Logs shipping; the batch limits default to PutLogEvents' own."""

    group_prefix: str = "/berth/jobs"
    batch_max_events: Annotated[int, Field(ge=1, le=10_000)] = 10_000
    batch_max_bytes: Annotated[int, Field(ge=1024, le=1_048_576)] = 1_048_576
    #: Most bytes of job output held in memory per attempt before lines are dropped (and counted).
    buffer_max_bytes: Annotated[int, Field(ge=64 * 1024)] = 8 * 1024 * 1024
    flush_interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0


class MetricsConfig(_Section):
    """Usage samples of running attempts, sent to the agent API (``POST /v1/agent/metrics``)."""

    sample_interval_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    send_interval_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    #: Most samples kept per attempt while the API cannot be reached (the oldest go first).
    buffer_max_samples: Annotated[int, Field(ge=1, le=100_000)] = 360
    #: Most samples per request (the agent API refuses more than 120).
    batch_max_samples: Annotated[int, Field(ge=1, le=120)] = 100


class JobLimits(_Section):
    """Per-job limits the host imposes on the process executor (rlimits; None = not set)."""

    address_space_gib: Annotated[float | None, Field(gt=0)] = None
    nofile: Annotated[int | None, Field(ge=64)] = 65536
    cpu_seconds: Annotated[int | None, Field(ge=1)] = None
    #: When the agent runs as root (process executor), each running job gets its own uid (and gid of
    #: the same number) from this range, so jobs cannot read each other's files or the agent's.
    #: Pick a range no account, subuid/subgid allocation or other host service uses.
    uid_range: Annotated[str | None, Field(pattern=r"^\d+-\d+$")] = "3000000-3000999"
    #: cgroup v2 memory.max/cpu.max per job (``resources.memory_gib``/``cpu``) where the host delegates
    #: a writable cgroup with the memory and cpu controllers (berth_agent.cgroups); otherwise rlimits
    #: only, with the reason logged at start. ``cgroup_root``: that cgroup's directory (default: the
    #: agent's own, from /proc/self/cgroup).
    cgroups: bool = True
    cgroup_root: Path | None = None
    #: A devices cgroup per process job that denies the device nodes of the host's other GPUs, where
    #: the host has a writable cgroup v1 devices hierarchy and NVML gives the minors
    #: (berth_agent.gpu_devices); otherwise the host reports ``berth/gpu-isolation: none``.
    gpu_device_rules: bool = True


class ContainerConfig(_Section):
    binary: str | None = None  # default: the executor's name on PATH
    network: str = "bridge"
    user: Annotated[str, Field(pattern=r"^\d+:\d+$")] = "65534:65534"
    pids_limit: Annotated[int, Field(ge=16)] = 4096
    shm_size: str = "1g"


class KubernetesConfig(_Section):
    namespace: str = "berth-jobs"
    service_account: str | None = None
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] = 600


class AgentConfig(_Section):
    api_url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")]
    region: str = "us-east-1"
    pool: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
    host_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    work_dir: Path = Path("/var/lib/berth-agent/work")
    cache_dir: Path = Path("/var/cache/berth-agent")
    cache_max_gib: Annotated[float, Field(gt=0)] = 100.0
    executor: ExecutorKind = ExecutorKind.PROCESS
    gpus: GpuConfig = GpuConfig()
    #: Registered dataset roots on this host: ``dataset://<name>/...`` resolves under ``datasets[name]``.
    datasets: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")], Path] = Field(
        default_factory=dict
    )
    drain_timeout_s: Annotated[int, Field(ge=0)] = 3600
    cancel_grace_s: Annotated[int, Field(ge=0, le=3600)] = 30
    limits: JobLimits = JobLimits()
    logs: LogConfig = LogConfig()
    metrics: MetricsConfig = MetricsConfig()
    container: ContainerConfig = ContainerConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    log_level: str = "INFO"
    #: Where the attempt's bundles and outputs live (until the claim answer carries them).
    artifacts_bucket: str | None = None
    data_bucket: str | None = None
    #: An AWS endpoint override (the embedded local cloud); None for AWS itself.
    aws_endpoint_url: str | None = None
    #: Declared CPUs and memory of the host instead of what the OS reports (a simulated host of
    #: the local cloud, or to keep some of the machine back from jobs).
    host_cpu: Annotated[int | None, Field(ge=1)] = None
    host_memory_gib: Annotated[int | None, Field(ge=1)] = None
    #: The host identity's named profile (the local cloud's ``host-<host_id>``); None: the default chain.
    aws_profile: str | None = None

    @field_validator("work_dir", "cache_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        if not v.is_absolute():
            raise ValueError("must be an absolute path")
        return v

    @field_validator("datasets")
    @classmethod
    def _absolute_roots(cls, v: dict[str, Path]) -> dict[str, Path]:
        for name, root in v.items():
            if not root.is_absolute():
                raise ValueError(f"dataset root for {name!r} must be an absolute path")
        return v

    @property
    def cache_max_bytes(self) -> int:
        return int(self.cache_max_gib * 1024**3)


class _Whole:
    """An environment value given as YAML/JSON: it replaces the file's value instead of merging."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        value: Any = _Whole(yaml.safe_load(raw)) if raw.lstrip().startswith(("{", "[")) else raw
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: {part} is set both as a value and as a section")
            node = child
        node[path[-1]] = value
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, _Whole):
            merged[key] = value.value
        elif isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """The configuration from ``path`` (or ``$BERTH_AGENT_CONFIG``, or the default) plus overrides."""
    env = os.environ if environ is None else environ
    explicit = path is not None or CONFIG_ENV in env
    file = path or Path(env.get(CONFIG_ENV, str(DEFAULT_CONFIG_PATH)))
    data: dict[str, Any] = {}
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {file} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {file} cannot be read: {exc}") from exc
    else:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {file} must hold a mapping at the top level")
        data = loaded or {}
    try:
        return AgentConfig.model_validate(_merge(data, _env_overrides(env)))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"invalid agent configuration: {problems}") from exc
