"""Run an image job as a Kubernetes ``batch/v1`` Job (a host that fronts an on-prem cluster).

``job_manifest(launch, ...)`` renders the Job as a plain dict (what ``kubectl apply`` or the
``kubernetes`` client's ``create_namespaced_job(body=...)`` accepts) and ``env_secret_manifest``
the ``v1`` Secret that holds its environment, so secrets and credentials never sit in the Job's
spec where anyone who can read Jobs sees them. The pod: ``nvidia.com/gpu`` limit = the attempt's
GPU count (the cluster's device plugin picks the devices; UUID pinning is not possible there),
``runAsNonRoot`` as 65534, read-only root, no privilege escalation, every capability dropped,
seccomp ``RuntimeDefault``, no service-account token, ``backoffLimit: 0`` (Berth retries, not
Kubernetes), ``activeDeadlineSeconds`` from ``timeout_minutes``, data volumes read-only.

``KubernetesExecutor``/``KubernetesRun`` make it an ``Executor`` like the others (the Job polled
through the API, deleted with a grace on cancel and after it ends). They and ``submit``/``delete``
take client objects (``kubernetes.client.BatchV1Api`` and ``CoreV1Api`` in production), so this
module has no dependency on the ``kubernetes`` package.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any, Protocol

from berth_agent.config import KubernetesConfig
from berth_agent.executors.base import (
    Executor,
    FailureKind,
    JobResult,
    Launch,
    LineSink,
    RunHandle,
    StartError,
)
from berth_agent.executors.docker import CHECKPOINT_DIR, OUTPUT_DIR, WORKDIR, container_environment

log = logging.getLogger(__name__)

_VOLUME_NAME = re.compile(r"[^a-z0-9-]")


def _labels(launch: Launch) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "berth-agent",
        "berth.io/job-id": launch.job_id.lower(),
        "berth.io/attempt": str(launch.attempt),
    }


def env_secret_manifest(launch: Launch, config: KubernetesConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": launch.name, "namespace": config.namespace, "labels": _labels(launch)},
        "type": "Opaque",
        "stringData": container_environment(launch),
    }


def job_manifest(launch: Launch, config: KubernetesConfig) -> dict[str, Any]:
    if launch.image is None:
        raise StartError(FailureKind.BAD_IMAGE, "a Kubernetes job needs an image")
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "work", "emptyDir": {}},
        {"name": "outputs", "emptyDir": {}},
        {"name": "checkpoints", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "work", "mountPath": WORKDIR},
        {"name": "outputs", "mountPath": OUTPUT_DIR},
        {"name": "checkpoints", "mountPath": CHECKPOINT_DIR},
    ]
    for i, m in enumerate(launch.mounts):
        name = f"data-{i}-" + _VOLUME_NAME.sub("-", m.target.lower()).strip("-")[:40]
        volumes.append({"name": name, "hostPath": {"path": str(m.source), "type": "Directory"}})
        mounts.append({"name": name, "mountPath": m.target, "readOnly": m.read_only})
    resources: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
    gpus = len(launch.gpu_uuids)
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    if launch.limits.cpus is not None:
        resources["limits"]["cpu"] = resources["requests"]["cpu"] = f"{launch.limits.cpus:g}"
    if launch.limits.memory_gib is not None:
        mem = f"{int(launch.limits.memory_gib * 1024)}Mi"
        resources["limits"]["memory"] = resources["requests"]["memory"] = mem
    container: dict[str, Any] = {
        "name": "job",
        "image": launch.image,
        "command": list(launch.command),
        "workingDir": WORKDIR,
        "envFrom": [{"secretRef": {"name": launch.name}}],
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "fsGroup": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if config.service_account:
        pod_spec["serviceAccountName"] = config.service_account
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": _labels(launch)}, "spec": pod_spec},
    }
    if launch.timeout_s is not None:
        spec["activeDeadlineSeconds"] = max(1, math.ceil(launch.timeout_s))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": launch.name, "namespace": config.namespace, "labels": _labels(launch)},
        "spec": spec,
    }


class BatchApi(Protocol):
    def create_namespaced_job(self, namespace: str, body: Any) -> Any: ...
    def delete_namespaced_job(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def read_namespaced_job_status(self, name: str, namespace: str) -> Any: ...


class CoreApi(Protocol):
    def create_namespaced_secret(self, namespace: str, body: Any) -> Any: ...
    def delete_namespaced_secret(self, name: str, namespace: str, **kwargs: Any) -> Any: ...


def submit(batch: BatchApi, core: CoreApi, launch: Launch, config: KubernetesConfig) -> str:
    """Create the env Secret, then the Job; returns the Job's name."""
    core.create_namespaced_secret(namespace=config.namespace, body=env_secret_manifest(launch, config))
    batch.create_namespaced_job(namespace=config.namespace, body=job_manifest(launch, config))
    return launch.name


def delete(batch: BatchApi, core: CoreApi, name: str, config: KubernetesConfig, grace_s: int) -> None:
    """Delete the Job and its pods (foreground), giving the pod ``grace_s`` to stop; then the Secret."""
    batch.delete_namespaced_job(
        name=name, namespace=config.namespace, grace_period_seconds=grace_s, propagation_policy="Foreground"
    )
    core.delete_namespaced_secret(name=name, namespace=config.namespace)


def result_of(job_status: Any) -> JobResult | None:
    """A finished Job's result from its ``status`` (``.succeeded``/``.failed``/``.conditions``)."""
    if getattr(job_status, "succeeded", None):
        return JobResult(0, None, "")
    for cond in getattr(job_status, "conditions", None) or []:
        if cond.type == "Failed" and cond.status == "True":
            if cond.reason == "DeadlineExceeded":
                return JobResult(None, FailureKind.TIMEOUT, "stopped at its timeout_minutes limit")
            return JobResult(None, FailureKind.NONZERO_EXIT, f"{cond.reason}: {cond.message or ''}".strip())
    return None


class KubernetesRun(RunHandle):
    """A submitted Job, polled through the API at most every ``poll_interval_s`` (no thread)."""

    def __init__(
        self,
        batch: BatchApi,
        core: CoreApi,
        name: str,
        config: KubernetesConfig,
        *,
        poll_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._batch, self._core, self.name, self._config = batch, core, name, config
        self._interval = poll_interval_s
        self._clock = clock
        self._next_poll = 0.0
        self._result: JobResult | None = None
        self._canceled = False

    @property
    def pid(self) -> int | None:
        return None

    def poll(self) -> JobResult | None:
        if self._result is not None or self._clock() < self._next_poll:
            return self._result
        self._next_poll = self._clock() + self._interval
        job = self._batch.read_namespaced_job_status(name=self.name, namespace=self._config.namespace)
        result = result_of(getattr(job, "status", None))
        if result is not None:
            if self._canceled:
                result = JobResult(result.exit_code, FailureKind.CANCELED, "canceled")
            self._result = result
            self._cleanup(grace_s=0)
        return self._result

    def wait(self, timeout: float | None = None) -> JobResult | None:
        deadline = None if timeout is None else self._clock() + timeout
        while (result := self.poll()) is None:
            if deadline is not None and self._clock() >= deadline:
                return None
            time.sleep(min(self._interval, 1.0))
        return result

    def cancel(self, grace_s: float) -> None:
        if self._result is not None or self._canceled:
            return
        self._canceled = True
        self._cleanup(int(grace_s))
        self._result = JobResult(None, FailureKind.CANCELED, "canceled")

    def _cleanup(self, grace_s: int) -> None:
        try:
            delete(self._batch, self._core, self.name, self._config, grace_s)
        except Exception as exc:  # already gone, or the API is down: the TTL removes it later
            log.warning("kubernetes job not deleted", extra={"job": self.name, "error": str(exc)})


class KubernetesExecutor(Executor):
    """Runs image jobs as Kubernetes Jobs. Output lines are not streamed (the pod's log stays in
    the cluster's logging); ``on_line`` gets one line naming the Job."""

    containment = "kubernetes"

    def __init__(
        self, batch: BatchApi, core: CoreApi, config: KubernetesConfig, poll_interval_s: float = 5.0
    ):
        self._batch, self._core, self._config = batch, core, config
        self._interval = poll_interval_s

    def start(self, launch: Launch, on_line: LineSink) -> RunHandle:
        try:
            name = submit(self._batch, self._core, launch, self._config)
        except StartError:
            raise
        except Exception as exc:
            raise StartError(FailureKind.AGENT_ERROR, f"kubernetes refused the job: {exc}") from exc
        on_line("stderr", f"[berth] running as Kubernetes Job {self._config.namespace}/{name}")
        return KubernetesRun(self._batch, self._core, name, self._config, poll_interval_s=self._interval)
