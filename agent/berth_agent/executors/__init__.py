"""Executors: how a staged attempt runs on this host (see ``base`` for the shared contract).

``for_config(config)`` picks the executor the host's config names; the Kubernetes one needs the
cluster's API objects (``kubernetes.client.BatchV1Api()``, ``CoreV1Api()``), passed as ``kube``.
"""

from __future__ import annotations

import logging

from berth_agent import cgroups, containment, gpu_devices
from berth_agent.config import AgentConfig, ExecutorKind
from berth_agent.executors.base import (
    Executor,
    FailureKind,
    JobResult,
    Launch,
    Limits,
    LineSink,
    Mount,
    Rendezvous,
    RunHandle,
    StartError,
    job_environment,
)
from berth_agent.executors.docker import ContainerExecutor
from berth_agent.executors.kubernetes import BatchApi, CoreApi, KubernetesExecutor
from berth_agent.executors.process import ProcessExecutor, UidPool

__all__ = [
    "ContainerExecutor",
    "Executor",
    "FailureKind",
    "JobResult",
    "KubernetesExecutor",
    "Launch",
    "Limits",
    "LineSink",
    "Mount",
    "ProcessExecutor",
    "Rendezvous",
    "RunHandle",
    "StartError",
    "UidPool",
    "for_config",
    "job_environment",
]

log = logging.getLogger(__name__)


def _process_group_containment(why: str) -> None:
    """No job cgroups: the agent becomes the child subreaper of its jobs (berth_agent.containment)."""
    refused = containment.become_subreaper()
    log.warning(
        "containment: process-group (no job cgroups: %s); rlimits only; detached processes are found "
        "by their BERTH_ATTEMPT_KEY marker%s",
        why,
        f"; not a child subreaper: {refused}" if refused else ", the agent is their child subreaper",
        extra={"containment": containment.Mode.PROCESS_GROUP.value, "why": why},
    )


def for_config(
    config: AgentConfig,
    kube: tuple[BatchApi, CoreApi] | None = None,
    gpu_minors: dict[str, int | None] | None = None,
) -> Executor:
    """The configured executor; ``gpu_minors`` (GPU UUID -> device minor, the host's inventory) lets
    the process executor write each job's GPU device rules (berth_agent.gpu_devices)."""
    grace = float(config.cancel_grace_s)
    if config.executor == ExecutorKind.PROCESS:
        device_rules, device_why = gpu_devices.detect(
            gpu_minors or {}, enabled=config.limits.gpu_device_rules
        )
        (log.info if device_rules is not None else log.warning)(
            "GPU device rules: " + ("on" if device_rules is not None else "off"), extra={"why": device_why}
        )
        job_cgroups, why = (
            cgroups.detect(config.limits.cgroup_root)
            if config.limits.cgroups
            else (None, "off in the config")
        )
        if job_cgroups is not None:
            log.info("containment: cgroup-v2 (one cgroup per attempt)", extra={"why": why})
        else:
            _process_group_containment(why)
        return ProcessExecutor(
            uids=UidPool.parse(config.limits.uid_range),
            timeout_grace_s=grace,
            cgroups=job_cgroups,
            device_rules=device_rules,
        )
    if config.executor in (ExecutorKind.DOCKER, ExecutorKind.PODMAN):
        if config.executor == ExecutorKind.DOCKER:
            return ContainerExecutor("docker", config.container, timeout_grace_s=grace)
        return ContainerExecutor("podman", config.container, timeout_grace_s=grace)
    if kube is None:
        raise ValueError("the kubernetes executor needs the cluster's BatchV1Api and CoreV1Api")
    return KubernetesExecutor(kube[0], kube[1], config.kubernetes)
