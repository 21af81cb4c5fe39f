"""Real on-prem agents for the local cloud: one ``berth-agent`` process per simulated host.

Each runs ``python -m berth_agent.main`` with a config file of its own under the state dir
(``agents/<host>/config.yaml``, 0600 in a 0700 directory): simulated GPUs, the ``process`` executor,
work and cache dirs under the run's job root (``jobs_home``, outside the state dir: see
``state_dir``), the moto endpoint, the front door as its API and the host's own IAM identity (the
``host-<id>`` profile of the state dir's AWS files, or its keys in the environment without a state
dir). Its JSON log goes to ``agents/<host>/agent.log``. ``wait_registered`` reads the log until the
agent says it registered (with the GPU UUIDs it registered); ``stop`` sends SIGTERM and, after a
timeout, SIGKILL.

When the local cloud runs as root, each agent runs its jobs under unprivileged uids of its own (the
agent's ``limits.uid_range``: a block of ``UIDS_PER_AGENT`` ids per agent from ``JOB_UID_BASE``, so
no two hosts' jobs share a uid; gid = uid, no supplementary groups, their attempt directories 0700):
a job cannot read the state dir's keys, the agent's config or another job's files. As any other
user, jobs run as that user (nothing to switch to; docs/local-cloud.md says what that means).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: How long an agent may take from spawn to registration.
REGISTER_TIMEOUT_S = 60.0
#: SIGTERM, then this long before SIGKILL (the local agents drain with a short timeout).
STOP_TIMEOUT_S = 10.0
#: Job uids of the local agents (as root): agent ``i`` of this process gets
#: ``JOB_UID_BASE + i * UIDS_PER_AGENT`` onwards. Above the agent's own default range (3000000-).
JOB_UID_BASE = 3_100_000
UIDS_PER_AGENT = 1000
_uid_blocks = itertools.count()


def job_uid_range() -> str | None:
    """A fresh block of job uids for one agent, or None when jobs cannot switch user (not root)."""
    if os.geteuid() != 0:
        return None
    first = JOB_UID_BASE + next(_uid_blocks) * UIDS_PER_AGENT
    return f"{first}-{first + UIDS_PER_AGENT - 1}"


class AgentStartError(RuntimeError):
    pass


@dataclass
class AgentProcess:
    host_id: str
    gpu_type: str
    gpus: int
    home: Path
    api_url: str
    endpoint_url: str
    region: str
    artifacts_bucket: str
    data_bucket: str
    aws_config_file: Path | None = None
    aws_credentials_file: Path | None = None
    access_key: tuple[str, str] | None = None
    #: Registered dataset roots on this host (``dataset://<name>/...``), e.g. the example ``glue``.
    datasets: dict[str, str] = field(default_factory=dict)
    #: Where the agent's work and cache dirs go (default: its home); jobs must be able to reach it.
    jobs_home: Path | None = None
    #: The uids its jobs run under (``job_uid_range()``: a block of its own as root, else None).
    uid_range: str | None = field(default_factory=job_uid_range)
    process: subprocess.Popen[bytes] | None = None
    registered_gpus: list[str] = field(default_factory=list)

    @property
    def log_file(self) -> Path:
        return self.home / "agent.log"

    @property
    def config_file(self) -> Path:
        return self.home / "config.yaml"

    @property
    def gpu_faults_file(self) -> Path:
        """The simulated GPUs' injected faults (``berth_agent.gpu_health.SimulatedHealthSource``)."""
        return self.home.absolute() / "gpu-faults.jsonl"

    def inject_gpu_error(self, gpu: str, xid: int) -> dict[str, Any]:
        """Make simulated GPU ``gpu`` (an index or a UUID) report XID ``xid``; ValueError for a GPU
        this host does not have. Its agent sees it at its next health poll (``health_poll_s``)."""
        ids = self.registered_gpus or [f"GPU-sim-{self.host_id}-{i}" for i in range(self.gpus)]
        gpu_id = ids[int(gpu)] if gpu.isdigit() and int(gpu) < len(ids) else gpu
        if gpu_id not in ids:
            raise ValueError(f"host {self.host_id} has no GPU {gpu!r} (it has {len(ids)}: {', '.join(ids)})")
        with self.gpu_faults_file.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"gpu": gpu_id, "xid": xid}) + "\n")
        return {"host_id": self.host_id, "gpu_id": gpu_id, "xid": xid}

    @property
    def work_home(self) -> Path:
        return (self.jobs_home or self.home).absolute()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "api_url": self.api_url,
            "region": self.region,
            "pool": "default",
            "host_id": self.host_id,
            "work_dir": str(self.work_home / "work"),
            "cache_dir": str(self.work_home / "cache"),
            "cache_max_gib": 1.0,
            "executor": "process",
            "gpus": {
                "discovery": "simulated",
                "simulated": {
                    "gpu_type": self.gpu_type,
                    "count": self.gpus,
                    "memory_gib": 80,
                    # `berth local fault gpu-error` appends here (inject_gpu_error)
                    "faults_file": str(self.gpu_faults_file),
                },
                "health_poll_s": 1.0,
            },
            # a simulated host as big as the scripted ones (this machine's own cores are few)
            "host_cpu": 64,
            "host_memory_gib": 512,
            "drain_timeout_s": 5,
            # usage samples every 2 s (10 s on a real host), so short local jobs have some
            "metrics": {"sample_interval_s": 2.0, "send_interval_s": 5.0},
            "cancel_grace_s": 3,
            # As root, jobs run under uids of their own; otherwise as the local cloud's user.
            "limits": {"uid_range": self.uid_range},
            "artifacts_bucket": self.artifacts_bucket,
            "data_bucket": self.data_bucket,
            "aws_endpoint_url": self.endpoint_url,
        }
        if self.datasets:
            cfg["datasets"] = dict(self.datasets)
        if self.access_key is None:
            cfg["aws_profile"] = f"host-{self.host_id}"
        return cfg

    def environment(self) -> dict[str, str]:
        """Only what the agent needs: none of the local cloud's own AWS settings leak into it."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
        }
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys([*_package_roots(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
        )
        env["BERTH_AGENT_CONFIG"] = str(self.config_file)
        env["PYTHONUNBUFFERED"] = "1"
        if self.access_key is not None:
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = self.access_key
        else:
            assert self.aws_config_file is not None and self.aws_credentials_file is not None
            env["AWS_CONFIG_FILE"] = str(self.aws_config_file)
            env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.aws_credentials_file)
        env["AWS_EC2_METADATA_DISABLED"] = "true"
        return env

    def start(self) -> AgentProcess:
        self.home = self.home.absolute()  # the agent runs in its home: every path it gets is absolute
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.home.chmod(0o700)
        # A job passes through its agent's work dir to its own attempt dir (0700, its uid), no further.
        for name, mode in (("work", 0o711), ("cache", 0o700)):
            (self.work_home / name).mkdir(parents=True, exist_ok=True)
            (self.work_home / name).chmod(mode if self.uid_range is not None else 0o700)
        _write_private(self.config_file, yaml.safe_dump(self.config(), sort_keys=True))
        fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        log = os.fdopen(fd, "ab")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "berth_agent.main"],
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,  # Ctrl-C on the local cloud reaches it as our SIGTERM only
            )
        finally:
            log.close()
        return self

    def registered(self) -> bool:
        if self.registered_gpus:
            return True
        for record in self.log_records():
            if record.get("msg") == "registered":
                self.registered_gpus = [str(g) for g in record.get("gpus", [])]
                return True
        return False

    def log_records(self) -> list[dict[str, Any]]:
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        """None while it runs or before it was started; else its exit code (-N: killed by signal N)."""
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        """SIGTERM: the agent drains (takes no more work, lets running jobs end within its timeout)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, *, terminated: bool = False) -> None:
        """SIGTERM (unless already sent), then SIGKILL after ``timeout_s``."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        if not terminated:
            self.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def as_json(self) -> dict[str, Any]:
        return {"host_id": self.host_id, "pid": self.pid, "gpus": self.registered_gpus, "kind": "process"}


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def _package_roots() -> list[str]:
    """Where this process imports ``berth_agent`` and ``berth`` from (a source tree or a venv)."""
    import importlib.util

    roots = []
    for name in ("berth_agent", "berth"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(str(Path(next(iter(spec.submodule_search_locations))).parent))
    return roots


def wait_registered(agents: list[AgentProcess], timeout_s: float = REGISTER_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(agents)
    while pending:
        for agent in list(pending):
            if agent.registered():
                pending.remove(agent)
            elif not agent.alive():
                tail = agent.log_file.read_text(errors="replace")[-2000:] if agent.log_file.exists() else ""
                raise AgentStartError(f"agent {agent.host_id} exited before registering:\n{tail}")
        if pending and time.monotonic() > deadline:
            raise AgentStartError(
                f"agents not registered after {timeout_s:.0f}s: {', '.join(a.host_id for a in pending)}"
            )
        if pending:
            time.sleep(0.1)
