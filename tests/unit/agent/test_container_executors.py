"""The docker/podman argv and the Kubernetes manifests: every privilege decision, checked."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from berth_agent.config import ContainerConfig, KubernetesConfig
from berth_agent.executors import (
    ContainerExecutor,
    FailureKind,
    Launch,
    Limits,
    Mount,
    Rendezvous,
    StartError,
)
from berth_agent.executors import kubernetes as k8s
from berth_agent.executors.docker import Runtime, container_argv, container_environment


def _launch(**kw: Any) -> Launch:
    base: dict[str, Any] = dict(
        job_id="J_01ABC",
        attempt=1,
        tenant="vision",
        command=("python", "train.py", "--epochs", "3"),
        workdir=Path("/var/lib/berth-agent/work/j1"),
        image="ghcr.io/acme/train:1.2@sha256:" + "a" * 64,
        env={"EPOCHS": "3"},
        secrets={"WANDB_API_KEY": "s3cret"},
        gpu_uuids=("GPU-1111", "GPU-2222"),
        mounts=(Mount(Path("/data/imagenet/train"), "/data/train"),),
        output_dir=Path("/var/lib/berth-agent/work/j1-out"),
        checkpoint_dir=Path("/var/lib/berth-agent/work/j1-ckpt"),
        limits=Limits(cpus=8, memory_gib=32),
        timeout_s=3600,
    )
    base.update(kw)
    return Launch(**base)


def _argv(runtime: Runtime = "docker", **kw: Any) -> list[str]:
    launch = _launch(**kw)
    env = container_environment(launch)
    return container_argv(
        launch, runtime=runtime, binary=runtime, config=ContainerConfig(), env_names=list(env)
    )


def _opt(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_docker_argv_is_locked_down() -> None:
    argv = _argv()
    image_at = argv.index(_launch().image)  # type: ignore[arg-type]
    assert argv[:2] == ["docker", "run"] and argv[image_at + 1 :] == ["python", "train.py", "--epochs", "3"]
    flags = argv[:image_at]
    assert "--privileged" not in flags and "--read-only" in flags and "--rm" in flags and "--init" in flags
    assert _opt(flags, "--gpus") == ['"device=GPU-1111,GPU-2222"']
    assert _opt(flags, "--cap-drop") == ["ALL"] and "--cap-add" not in flags
    assert _opt(flags, "--security-opt") == ["no-new-privileges"]
    assert _opt(flags, "--user") == ["65534:65534"]
    assert _opt(flags, "--memory") == ["32768m"] and _opt(flags, "--memory-swap") == ["32768m"]
    assert _opt(flags, "--cpus") == ["8"] and _opt(flags, "--network") == ["bridge"]
    assert _opt(flags, "--tmpfs") == ["/tmp:rw,nosuid,nodev,size=1g"]
    mounts = _opt(flags, "--mount")
    assert "type=bind,source=/data/imagenet/train,target=/data/train,readonly" in mounts
    assert "type=bind,source=/var/lib/berth-agent/work/j1-out,target=/berth/outputs" in mounts
    assert not any("docker.sock" in a for a in argv)
    # values never on the command line, names only
    assert sorted(_opt(flags, "--env")) == sorted(container_environment(_launch()))
    assert not any("s3cret" in a for a in argv)
    assert _opt(flags, "--name") == ["berth-j-01abc-1"]


def test_podman_uses_cdi_devices_and_nosuid_nodev_mounts() -> None:
    flags = _argv("podman")
    assert _opt(flags, "--device") == ["nvidia.com/gpu=GPU-1111", "nvidia.com/gpu=GPU-2222"]
    assert "--gpus" not in flags
    assert "/data/imagenet/train:/data/train:ro,nosuid,nodev" in _opt(flags, "--volume")


def test_container_env_uses_container_paths_and_rendezvous() -> None:
    env = container_environment(_launch(rendezvous=Rendezvous("10.1.1.1", 29400, 4, 3)))
    assert env["BERTH_OUTPUT_DIR"] == "/berth/outputs" and env["BERTH_CHECKPOINT_DIR"] == "/berth/checkpoints"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-1111,GPU-2222" and env["RANK"] == env["NODE_RANK"] == "3"
    assert env["WANDB_API_KEY"] == "s3cret"


def test_no_gpus_and_bad_inputs() -> None:
    assert "--gpus" not in _argv(gpu_uuids=())
    with pytest.raises(StartError) as e:
        _argv(image=None)
    assert e.value.failure is FailureKind.BAD_IMAGE
    with pytest.raises(StartError):
        _argv(mounts=(Mount(Path("/data/x"), "/berth/outputs"),))
    with pytest.raises(StartError):
        _argv(mounts=(Mount(Path("/data/a,b"), "/data"),))


def test_container_executor_runs_the_cli_with_job_env_only(tmp_path: Path) -> None:
    # A stand-in "docker" binary that prints the container env it would forward, then exits 125.
    fake = tmp_path / "docker"
    fake.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "e = os.environ.get\n"
        "print(e('WANDB_API_KEY'), e('AGENT_SECRET'), e('DOCKER_HOST'))\n"
        "print('Unable to find image', file=sys.stderr)\nsys.exit(125)\n"
    )
    fake.chmod(0o755)
    (tmp_path / "w").mkdir()
    launch = _launch(workdir=tmp_path / "w", output_dir=None, checkpoint_dir=None)
    lines: list[str] = []
    ex = ContainerExecutor(
        "docker",
        ContainerConfig(binary=str(fake)),
        environ={"AGENT_SECRET": "x", "DOCKER_HOST": "unix:///run/user/1/docker.sock"},
    )

    def sink(stream: str, line: str) -> None:
        if stream == "stdout":
            lines.append(line)

    result = ex.start(launch, sink).wait(10)
    assert lines == ["s3cret None unix:///run/user/1/docker.sock"]
    assert result is not None and result.failure is FailureKind.BAD_IMAGE


def test_container_cancel_calls_runtime_stop(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    calls: list[list[str]] = []
    done = threading.Event()

    def run(argv: list[str]) -> None:
        calls.append(argv)
        done.set()

    ex = ContainerExecutor("docker", ContainerConfig(binary=str(fake)), run=run)
    job = tmp_path / "job-1"
    dirs = [job / "work", job / "outputs", job / "checkpoints"]
    for d in dirs:
        d.mkdir(parents=True)
    launch = _launch(workdir=dirs[0], output_dir=dirs[1], checkpoint_dir=dirs[2])
    handle = ex.start(launch, lambda s, line: None)
    # the container user may write its dirs; nobody else on the host may walk into the attempt's dir
    assert all(d.stat().st_mode & 0o777 == 0o777 for d in dirs) and job.stat().st_mode & 0o777 == 0o700
    handle.cancel(grace_s=0.2)
    result = handle.wait(10)
    assert done.wait(5) and calls[0] == [str(fake), "stop", "--time", "0", "berth-j-01abc-1"]
    assert result is not None and result.failure is FailureKind.CANCELED


def test_kubernetes_job_manifest() -> None:
    cfg = KubernetesConfig(namespace="ml")
    job = k8s.job_manifest(_launch(), cfg)
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert job["metadata"] == {
        "name": "berth-j-01abc-1",
        "namespace": "ml",
        "labels": job["spec"]["template"]["metadata"]["labels"],
    }
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 3600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert not pod["hostNetwork"] and not pod["hostPID"] and not pod["hostIPC"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32768Mi"}
    assert "env" not in c and c["envFrom"] == [{"secretRef": {"name": "berth-j-01abc-1"}}]
    data = [m for m in c["volumeMounts"] if m["mountPath"] == "/data/train"]
    assert data and data[0]["readOnly"] is True
    vol = next(v for v in pod["volumes"] if v["name"] == data[0]["name"])
    assert vol["hostPath"] == {"path": "/data/imagenet/train", "type": "Directory"}
    names = [v["name"] for v in pod["volumes"]]
    assert len(names) == len(set(names)) and all(len(n) <= 63 for n in names)
    assert {m["name"] for m in c["volumeMounts"]} == set(names)
    secret = k8s.env_secret_manifest(_launch(), cfg)
    assert secret["kind"] == "Secret" and secret["stringData"]["WANDB_API_KEY"] == "s3cret"


def test_kubernetes_submit_delete_and_result() -> None:
    class Api:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, Any]]] = []

        def __getattr__(self, name: str) -> Any:
            return lambda **kw: self.calls.append((name, kw))

    batch, core = Api(), Api()
    cfg = KubernetesConfig()
    name = k8s.submit(batch, core, _launch(), cfg)
    assert core.calls[0][0] == "create_namespaced_secret" and batch.calls[0][0] == "create_namespaced_job"
    k8s.delete(batch, core, name, cfg, grace_s=30)
    assert batch.calls[1] == (
        "delete_namespaced_job",
        {
            "name": name,
            "namespace": "berth-jobs",
            "grace_period_seconds": 30,
            "propagation_policy": "Foreground",
        },
    )

    class Cond:
        def __init__(self, type_: str, status: str, reason: str) -> None:
            self.type, self.status, self.reason, self.message = type_, status, reason, None

    class Status:
        def __init__(self, succeeded: int | None, conditions: list[Cond]) -> None:
            self.succeeded, self.conditions = succeeded, conditions

    assert k8s.result_of(Status(1, [])).succeeded  # type: ignore[union-attr]
    assert k8s.result_of(Status(None, [])) is None
    r = k8s.result_of(Status(None, [Cond("Failed", "True", "DeadlineExceeded")]))
    assert r is not None and r.failure is FailureKind.TIMEOUT
    r = k8s.result_of(Status(None, [Cond("Failed", "True", "BackoffLimitExceeded")]))
    assert r is not None and r.failure is FailureKind.NONZERO_EXIT


class FakeCluster:
    """BatchV1Api + CoreV1Api enough for the executor: Jobs finish when told."""

    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}
        self.secrets: set[str] = set()
        self.deleted: list[tuple[str, int]] = []
        self.reads = 0

    def create_namespaced_secret(self, namespace: str, body: Any) -> None:
        self.secrets.add(body["metadata"]["name"])

    def delete_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> None:
        self.secrets.discard(name)

    def create_namespaced_job(self, namespace: str, body: Any) -> None:
        self.jobs[body["metadata"]["name"]] = SimpleNamespace(
            status=SimpleNamespace(succeeded=None, conditions=[])
        )

    def delete_namespaced_job(self, name: str, namespace: str, **kw: Any) -> None:
        self.deleted.append((name, kw["grace_period_seconds"]))
        self.jobs.pop(name, None)

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        self.reads += 1
        return self.jobs[name]


def test_kubernetes_executor_runs_polls_and_cleans_up() -> None:
    cluster = FakeCluster()
    clock = [0.0]
    ex = k8s.KubernetesExecutor(cluster, cluster, KubernetesConfig(), poll_interval_s=5)
    lines: list[str] = []
    handle = ex.start(_launch(), lambda s, line: lines.append(line))
    assert isinstance(handle, k8s.KubernetesRun) and handle.pid is None
    handle._clock = lambda: clock[0]
    assert "berth-jobs/berth-j-01abc-1" in lines[0] and cluster.secrets == {"berth-j-01abc-1"}
    assert handle.poll() is None and cluster.reads == 1
    assert handle.poll() is None and cluster.reads == 1  # not before the interval
    cluster.jobs["berth-j-01abc-1"].status.succeeded = 1
    clock[0] = 5.0
    result = handle.poll()
    assert result is not None and result.succeeded
    assert cluster.deleted == [("berth-j-01abc-1", 0)] and cluster.secrets == set()


def test_kubernetes_cancel_deletes_with_grace() -> None:
    cluster = FakeCluster()
    handle = k8s.KubernetesExecutor(cluster, cluster, KubernetesConfig()).start(
        _launch(), lambda s, line: None
    )
    handle.cancel(grace_s=30)
    result = handle.poll()
    assert result is not None and result.failure is FailureKind.CANCELED
    assert cluster.deleted == [("berth-j-01abc-1", 30)]
    handle.cancel(grace_s=30)
    assert len(cluster.deleted) == 1


def test_for_config_picks_the_executor() -> None:
    from berth_agent.config import AgentConfig
    from berth_agent.executors import ProcessExecutor, for_config

    def cfg(executor: str) -> AgentConfig:
        return AgentConfig.model_validate(
            {"api_url": "http://x", "pool": "p", "host_id": "h", "executor": executor}
        )

    assert isinstance(for_config(cfg("process")), ProcessExecutor)
    podman = for_config(cfg("podman"))
    assert isinstance(podman, ContainerExecutor) and podman.runtime == "podman"
    with pytest.raises(ValueError, match="BatchV1Api"):
        for_config(cfg("kubernetes"))
    cluster = FakeCluster()
    assert isinstance(for_config(cfg("kubernetes"), kube=(cluster, cluster)), k8s.KubernetesExecutor)
