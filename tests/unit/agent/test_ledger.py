"""The on-disk ledger of running attempts, and what a restarted agent does with leftovers."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from berth_agent.ledger import AttemptEntry, AttemptLedger, Leftover, process_start_ticks


def _entry(**kw: object) -> AttemptEntry:
    base: dict[str, object] = dict(
        job_id="j-1", attempt=1, fencing_token="tok", executor="process", run_name="berth-j-1-1"
    )
    base.update(kw)
    return AttemptEntry(**base)  # type: ignore[arg-type]


def test_record_survives_a_new_instance_and_remove(tmp_path: Path) -> None:
    ledger = AttemptLedger(tmp_path)
    ledger.record(_entry())
    ledger.record(_entry(job_id="j-2"))
    again = AttemptLedger(tmp_path)
    assert [e.job_id for e in again.entries()] == ["j-1", "j-2"]
    again.remove(_entry())
    assert [e.job_id for e in AttemptLedger(tmp_path).entries()] == ["j-2"]
    assert not list((tmp_path / ".attempts").glob(".tmp-*"))


def test_torn_files_are_dropped(tmp_path: Path) -> None:
    ledger = AttemptLedger(tmp_path)
    (ledger.dir / "x-1.json").write_text("{not json")
    assert ledger.entries() == [] and not (ledger.dir / "x-1.json").exists()


def test_a_restarted_agent_finds_and_reaps_a_live_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ledger = AttemptLedger(tmp_path)
        entry = ledger.started(_entry(), proc.pid)
        assert entry.start_ticks == process_start_ticks(proc.pid)
        (left,) = AttemptLedger(tmp_path).leftovers()  # the "restarted" agent
        assert left.alive and left.entry.fencing_token == "tok"
        ledger.reap(left)
        assert proc.wait(5) == -9
        assert AttemptLedger(tmp_path).leftovers()[0].alive is False
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_recycled_pid_is_not_the_job(tmp_path: Path) -> None:
    ledger = AttemptLedger(tmp_path)
    entry = _entry(pid=os.getpid(), start_ticks=(process_start_ticks(os.getpid()) or 0) + 1)
    ledger.record(entry)
    (left,) = ledger.leftovers()
    assert not left.alive
    ledger.reap(left)  # must not signal our own (pid-recycled) group
    time.sleep(0.01)


def test_container_leftovers_are_removed(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    AttemptLedger(tmp_path).reap(Leftover(_entry(executor="podman"), alive=False), run=calls.append)
    assert calls == [["podman", "rm", "-f", "berth-j-1-1"]]
