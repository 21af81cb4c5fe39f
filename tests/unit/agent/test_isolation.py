"""Two jobs on one agent at the same time (process executor, real processes): neither sees the other's
GPUs, files or credentials, nor the agent's.

Each job's environment is built from nothing (its GPUs, its attempt's credentials file), and, when
the agent runs as root (as the process executor's systemd drop-in has it), each job runs under a
uid of its own with 0700 directories, so the other's work dir, credentials file and the agent's
ledger are unreadable. Without root, jobs share the agent's uid: only the environment part holds
(docs/agent.md says so), and the file checks are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from berth_agent.attempt import AttemptRunner
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.executors import ProcessExecutor, UidPool
from berth_agent.gpus import Gpu, Inventory
from berth_agent.ledger import AttemptLedger
from tests.unit.agent.test_attempt import FakeIO

INV = Inventory(
    gpus=(Gpu(0, "GPU-a", "H100", 81920), Gpu(1, "GPU-b", "H100", 81920)), gpu_type="H100", source="simulated"
)
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
GPU_OF = {"j-a": "GPU-a", "j-b": "GPU-b"}

PROBE = """
import json, os, pathlib, shlex, subprocess, time
me = os.environ["BERTH_JOB_ID"]
other = "j-b" if me == "j-a" else "j-a"
root = pathlib.Path(os.environ["AGENT_WORK"])
time.sleep(1.0)  # both jobs are running now
def own_key():  # what an SDK does with AWS_CONFIG_FILE: run its credential_process
    config = pathlib.Path(os.environ["AWS_CONFIG_FILE"]).read_text()
    (line,) = [x for x in config.splitlines() if x.startswith("credential_process")]
    printed = subprocess.run(shlex.split(line.partition("=")[2]), capture_output=True, check=True).stdout
    return json.loads(printed)["AccessKeyId"]
def attempt(fn):
    try:
        return fn()
    except Exception as exc:
        return type(exc).__name__
out = {
    "env": dict(os.environ),
    "uid": os.getuid(),
    "own_key": own_key(),
    "other_creds": attempt(lambda: (root / f"{other}-1/work/.aws/credentials.json").read_text()),
    "other_work": attempt(lambda: sorted(os.listdir(root / f"{other}-1/work"))),
    "other_outputs": attempt(lambda: sorted(os.listdir(root / f"{other}-1/outputs"))),
    "ledger": attempt(lambda: sorted(os.listdir(root / ".attempts"))),
}
pathlib.Path(os.environ["BERTH_OUTPUT_DIR"], "probe.json").write_text(json.dumps(out))
time.sleep(1.0)
"""


class TwoJobsApi:
    def __init__(self, work: Path) -> None:
        self.spec = {
            "name": "probe",
            "image": "python:3.11-slim",
            # the system's python: a job uid cannot read a venv under /root (real hosts: the same)
            "command": [PYTHON, "-c", PROBE],
            "env": {"AGENT_WORK": str(work)},
        }

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return {
            "job_id": job_id,
            "attempt": attempt,
            "tenant": "vision",
            "spec": self.spec,
            "gpu_ids": [GPU_OF[job_id]],
        }

    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return {"AccessKeyId": f"ASIA-{job_id}", "SecretAccessKey": f"secret-{job_id}", "SessionToken": "t"}

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        return {"directive": None}


def test_two_jobs_on_one_agent_see_only_their_own_gpus_files_and_credentials() -> None:
    root = os.geteuid() == 0
    # pytest's tmp dirs are 0700 root: an agent's work dir must be traversable (0711) by job uids
    tmp_path = Path(tempfile.mkdtemp(prefix="berth-isolation-"))
    tmp_path.chmod(0o711)
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o711)
    ios: dict[str, FakeIO] = {}

    def io_for(creds: Mapping[str, Any]) -> FakeIO:
        return ios.setdefault(str(creds["AccessKeyId"]), FakeIO())

    cfg = AgentConfig(
        api_url="http://x", pool="p", host_id="h", work_dir=work, limits=JobLimits(uid_range=None)
    )
    runner = AttemptRunner(
        config=cfg,
        inventory=INV,
        api=TwoJobsApi(work),
        executor=ProcessExecutor(uids=UidPool(range(3_000_300, 3_000_302)) if root else None),
        ledger=AttemptLedger(work),
        io_for=io_for,
        sync_interval_s=60,
        tick_s=0.05,
    )
    outcomes = {}

    def run(job: str) -> None:
        outcomes[job] = runner.run({"job_id": job, "attempt": 1, "fencing_token": f"tok-{job}"})

    threads = [threading.Thread(target=run, args=(j,)) for j in GPU_OF]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    probes = {}
    for job in GPU_OF:
        outcome = outcomes[job]
        assert outcome.result is not None and outcome.result.succeeded, outcome
        probes[job] = json.loads(ios[f"ASIA-{job}"].objects[f"vision/jobs/{job}/outputs/probe.json"])
    for job, other in (("j-a", "j-b"), ("j-b", "j-a")):
        p, env = probes[job], probes[job]["env"]
        # GPUs: only its own
        assert env["CUDA_VISIBLE_DEVICES"] == GPU_OF[job] and env["NVIDIA_VISIBLE_DEVICES"] == GPU_OF[job]
        assert not any(GPU_OF[other] in v for v in env.values())
        # credentials: its own, through its credentials file; nothing of the other's or the agent's
        assert p["own_key"] == f"ASIA-{job}" and "AWS_ACCESS_KEY_ID" not in env
        assert not any(other in v for v in env.values() if v != env.get("AGENT_WORK"))
        assert not {k for k in env if k.startswith("AWS_")} - {
            "AWS_CONFIG_FILE",
            "AWS_SDK_LOAD_CONFIG",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
        }
        if root:  # files: separate uids, 0700 dirs
            assert p["uid"] != probes[other]["uid"] and p["uid"] != 0
            assert p["other_creds"] == "PermissionError", p["other_creds"]
            assert p["other_work"] == p["other_outputs"] == p["ledger"] == "PermissionError"
        else:  # shared uid: what holds is the 0700 dirs against other users
            assert p["uid"] == os.getuid()
    shutil.rmtree(tmp_path)
