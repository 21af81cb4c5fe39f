"""An agent killed with SIGKILL, then started again: nothing of its attempts may run on.

The "agent" is a real process (``AgentRun``: an ``AttemptRunner`` with a fake control plane) whose
job leaves a child in its group, a setsid'd grandchild and a double-forked daemon; the kernel
kills only the job's leader with the agent (``PR_SET_PDEATHSIG``). The restarted agent is a
``Daemon`` over the same work dir: its ``recover`` must find and kill all of them from the ledger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from berth_agent.config import AgentConfig
from berth_agent.daemon import Daemon, LeftoverAlive
from berth_agent.gpus import Gpu, Inventory
from berth_agent.ledger import AttemptEntry, AttemptLedger, Leftover
from tests.unit.agent.jobprocs import alive, escapers_argv, kill_all, read_pids, wait_for
from tests.unit.agent.test_daemon import FakeApi, FakeQueue, FakeRunner

INV = Inventory(gpus=(Gpu(0, "GPU-a", "H100", 81920),), gpu_type="H100", source="simulated")

AGENT = r"""
import json, sys
from pathlib import Path
from berth_agent.attempt import AttemptRunner
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.executors import ProcessExecutor
from berth_agent.gpus import Gpu, Inventory
from berth_agent.ledger import AttemptLedger
from berth_tools.bundle import pack
from tests.unit.agent.jobprocs import ESCAPERS
from tests.unit.agent.test_attempt import FakeIO

work, marks = Path(sys.argv[1]), sys.argv[2]
code = work.parent / "code"
code.mkdir()
(code / "escapers.py").write_text(ESCAPERS)
bundle = pack(code)

class Api:
    def claim(self, job_id, attempt, token):
        command = [sys.executable, "escapers.py", marks]
        spec = {"name": "t", "code": f"sha256:{bundle.digest}", "command": command}
        return {"job_id": job_id, "attempt": attempt, "tenant": "vision", "spec": spec, "gpu_ids": ["GPU-a"]}
    def credentials(self, *a):
        return {"AccessKeyId": "ASIA", "SecretAccessKey": "s", "SessionToken": "t"}
    def report(self, *a, **kw):
        return {}

cfg = AgentConfig(api_url="http://x", pool="p", host_id="h", work_dir=work, limits=JobLimits(uid_range=None))
inv = Inventory(gpus=(Gpu(0, "GPU-a", "H100", 81920),), gpu_type="H100", source="simulated")
io = FakeIO(bundles={bundle.digest: bundle.data})
runner = AttemptRunner(
    config=cfg, inventory=inv, api=Api(), executor=ProcessExecutor(), ledger=AttemptLedger(work),
    io_for=lambda creds: io,
)
print(runner.run({"job_id": "j-1", "attempt": 1, "fencing_token": "tok"}), file=sys.stderr)
"""


def _daemon(work: Path, api: FakeApi, ledger: AttemptLedger) -> Daemon:
    cfg = AgentConfig(api_url="http://x", pool="lab", host_id="h1", work_dir=work)
    return Daemon(
        config=cfg,
        inventory=INV,
        api=api,
        runner=FakeRunner(),
        queue_for=lambda url: FakeQueue([]),
        ledger=ledger,
        host_facts={"cpu": 1, "memory_gib": 1},
        poll_wait_s=0,
    )


def _started_entry(ledger: AttemptLedger) -> AttemptEntry:
    entries = ledger.entries()
    return entries[0] if entries and entries[0].pid is not None else None  # type: ignore[return-value]


def test_after_sigkill_the_restarted_agent_kills_every_process_of_the_attempt(tmp_path: Path) -> None:
    """(a) the leader died with the agent; its child, setsid'd grandchild and daemon did not: the
    restarted agent kills all three before it would register, and reports the attempt lost."""
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o711)
    (tmp_path / "marks").mkdir()
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(work), str(tmp_path / "marks")],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    pids: dict[str, int] = {}
    try:
        try:
            pids = read_pids(tmp_path / "marks", timeout_s=30)
        except AssertionError:
            agent.kill()
            raise AssertionError(agent.communicate()[1].decode()) from None
        ledger = AttemptLedger(work)
        wait_for(lambda: _started_entry(ledger) is not None, 10, "the ledger's started entry")
        entry = _started_entry(ledger)
        assert entry.attempt_key and entry.attempt_key.startswith("j-1:1:")
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(lambda: not alive(entry.pid or 0), 10, "the kernel to kill the leader (pdeathsig)")
        assert all(alive(p) for p in pids.values())  # what main left running forever

        api = FakeApi()
        assert _daemon(work, api, AttemptLedger(work)).recover() == 1
        assert [n for n, p in pids.items() if alive(p)] == []
        assert api.reports == [("j-1", 1, "tok", "failed", "agent_error")]
        assert AttemptLedger(work).entries() == []
    finally:
        if agent.poll() is None:
            agent.kill()
        kill_all(pids)


def test_a_leftover_that_survives_sigkill_stops_the_agent_before_it_offers_gpus(tmp_path: Path) -> None:
    class StuckLedger(AttemptLedger):
        def reap(self, leftover: Leftover, run: Any = None, timeout_s: float = 10.0) -> bool:
            return False  # e.g. a process in uninterruptible sleep (D) on a hung GPU driver

    ledger = StuckLedger(tmp_path)
    ledger.record(AttemptEntry("j-1", 1, "tok", "process", "berth-j-1-1", attempt_key="j-1:1:n"))
    api = FakeApi()
    daemon = _daemon(tmp_path, api, ledger)
    with pytest.raises(LeftoverAlive):
        daemon.run(install_signals=False)
    assert api.registered == [] and api.reports == []
    assert [e.job_id for e in ledger.entries()] == ["j-1"]  # kept for the next start


def test_reap_finds_leftovers_by_marker_when_no_pid_was_recorded(tmp_path: Path) -> None:
    """The agent died between the start and the ledger's ``started``: the marker still finds them."""
    key = "j-1:1:nonce"
    leader = subprocess.Popen(
        escapers_argv(tmp_path / "marks"),
        env={**os.environ, "BERTH_ATTEMPT_KEY": key},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    pids = read_pids(tmp_path / "marks")
    try:
        ledger = AttemptLedger(tmp_path)
        ledger.record(AttemptEntry("j-1", 1, "tok", "process", "berth-j-1-1", attempt_key=key))
        (left,) = ledger.leftovers()
        assert ledger.reap(left, timeout_s=10)
        assert leader.wait(5) == -9 and [n for n, p in pids.items() if alive(p)] == []
    finally:
        kill_all([leader.pid, *pids.values()])
