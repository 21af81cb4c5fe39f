"""Every failure of an attempt's reports, with a running job that tries to outlive it.

Once the process has started the agent supervises it until all of it has ended, whatever the
control plane answers: ``AttemptRunner.run`` returns (and the daemon frees the GPUs) only then.
The job (``jobprocs.ESCAPERS``) leaves a child, a setsid'd grandchild and a double-forked daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from berth_agent.client import AgentApiError, Canceled, Fenced, Unreachable
from berth_agent.daemon import BUSY_RETRY_S, Daemon
from berth_agent.executors import FailureKind
from berth_agent.ledger import AttemptEntry, AttemptLedger
from tests.unit.agent.jobprocs import ESCAPERS, alive, kill_all, read_pids, wait_for
from tests.unit.agent.test_attempt import MSG, FakeApi, FakeIO, _bundle, _runner, _spec
from tests.unit.agent.test_daemon import FakeApi as DaemonApi
from tests.unit.agent.test_daemon import FakeQueue, _msg


class FailingApi(FakeApi):
    """Answers the ``event`` report with the errors in ``errors``, one per call, then 200; the
    first ``started`` is answered only once the job's escapers all run (``marks``)."""

    def __init__(self, spec: dict[str, Any], event: str, errors: list[Exception], marks: Path) -> None:
        super().__init__(spec)
        self.event, self.errors, self.marks = event, errors, marks

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        if event == "started" and not self.reports:
            read_pids(self.marks)
        self.reports.append({"event": event, **kw})
        if event == self.event and self.errors:
            raise self.errors.pop(0)
        return {"directive": None}


def _setup(tmp_path: Path, leader_s: float) -> tuple[dict[str, Any], FakeIO, Path]:
    digest, data = _bundle(tmp_path, ESCAPERS)
    marks = tmp_path / "marks"
    marks.mkdir()
    spec = _spec(digest, env={"LEADER_S": str(leader_s)})
    spec["command"] = [*spec["command"], str(marks)]
    return spec, FakeIO(bundles={digest: data}), marks


def _pids_if_any(marks: Path) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in marks.iterdir() if not p.name.endswith(".tmp")}


STOPPING = {
    "404": AgentApiError(404, "NotFound", "no such attempt on this host"),
    "fenced": Fenced(409, "Fenced", "superseded"),
}
RUNNING_ON = {
    "500": Unreachable(500, "InternalError", "retries exhausted"),
    "timeout": Unreachable(0, "Unreachable", "cannot reach the API: read timed out"),
    "403": AgentApiError(403, "Forbidden", "clock skew"),
    "bug": RuntimeError("unexpected"),
}


@pytest.mark.parametrize("answer", sorted(STOPPING))
def test_started_answered_not_ours_kills_the_job_and_all_of_it_has_ended_on_return(
    tmp_path: Path, answer: str
) -> None:
    spec, io, marks = _setup(tmp_path, leader_s=60)
    api = FailingApi(spec, "started", [STOPPING[answer]], marks)
    runner = _runner(tmp_path, api, io)
    try:
        outcome = runner.run(MSG)
        pids = read_pids(marks, timeout_s=1)  # they had started before the report went out
        assert outcome.ran and outcome.reason == "Fenced"
        assert [n for n, p in pids.items() if alive(p)] == []  # ended before the GPUs could go
        assert [r["event"] for r in api.reports] == ["started"]  # nothing more said
        assert AttemptLedger(tmp_path / "work").entries() == []
    finally:
        kill_all(_pids_if_any(marks))


class ReleasingApi(FailingApi):
    """Lets the job end (its ``RELEASE`` file) once a ``started`` report was taken."""

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        answer = super().report(job_id, attempt, fencing_token, event, **kw)
        if event == "started":
            (self.marks.parent / "release").touch()
        return answer


@pytest.mark.parametrize("answer", sorted(RUNNING_ON))
def test_started_failing_leaves_the_job_running_supervised_to_its_end(tmp_path: Path, answer: str) -> None:
    spec, io, marks = _setup(tmp_path, leader_s=0)
    spec["env"]["RELEASE"] = str(tmp_path / "release")
    api = ReleasingApi(spec, "started", [RUNNING_ON[answer]] * 2, marks)
    runner = _runner(tmp_path, api, io)
    runner.started_retry_s = 0.2
    try:
        outcome = runner.run(MSG)  # on main: the error escaped here with the job left running
        pids = read_pids(marks, timeout_s=1)
        assert outcome.ran and outcome.result is not None and outcome.result.succeeded, outcome
        assert [n for n, p in pids.items() if alive(p)] == []
        events = [r["event"] for r in api.reports]
        assert events == ["started", "started", "started", "succeeded"], events  # retried until taken
        assert AttemptLedger(tmp_path / "work").entries() == []
    finally:
        kill_all(_pids_if_any(marks))


def test_started_answered_canceled_stops_the_job_with_its_grace_and_reports_canceled(tmp_path: Path) -> None:
    spec, io, marks = _setup(tmp_path, leader_s=60)
    api = FailingApi(spec, "started", [Canceled(409, "Canceled", "the job was canceled")], marks)
    try:
        outcome = _runner(tmp_path, api, io).run(MSG)
        pids = read_pids(marks, timeout_s=1)
        assert outcome.result is not None and outcome.result.failure is FailureKind.CANCELED
        assert [n for n, p in pids.items() if alive(p)] == []
        assert [r["event"] for r in api.reports] == ["started", "canceled"]
    finally:
        kill_all(_pids_if_any(marks))


@pytest.mark.parametrize(
    "error",
    [
        Fenced(409, "Fenced", "superseded"),
        AgentApiError(404, "NotFound", "gone"),
        Unreachable(503, "Unavailable", "retries exhausted"),
        RuntimeError("unexpected"),
    ],
    ids=["fenced", "404", "503", "bug"],
)
def test_a_failed_final_report_still_ends_cleanly(tmp_path: Path, error: Exception) -> None:
    spec, io, marks = _setup(tmp_path, leader_s=0.2)
    api = FailingApi(spec, "succeeded", [error], marks)
    try:
        outcome = _runner(tmp_path, api, io).run(MSG)
        pids = read_pids(marks, timeout_s=1)
        assert outcome.result is not None and outcome.result.succeeded
        assert [n for n, p in pids.items() if alive(p)] == []
        assert [r["event"] for r in api.reports] == ["started", "succeeded"]
        assert AttemptLedger(tmp_path / "work").entries() == []
        assert not (tmp_path / "work" / "j-1-1").exists()
    finally:
        kill_all(_pids_if_any(marks))


class BrokenLedger(AttemptLedger):
    """The disk is full when the started run is recorded (once its escapers all run)."""

    def __init__(self, work: Path, marks: Path) -> None:
        super().__init__(work)
        self.marks = marks

    def started(self, entry: AttemptEntry, pid: int, cgroup: str | None = None) -> AttemptEntry:
        read_pids(self.marks)
        raise OSError(28, "No space left on device")


def test_an_error_after_the_start_kills_the_job_before_it_is_raised(tmp_path: Path) -> None:
    spec, io, marks = _setup(tmp_path, leader_s=60)
    api = FailingApi(spec, "never", [], marks)
    runner = _runner(tmp_path, api, io)
    runner.ledger = BrokenLedger(tmp_path / "work", marks)
    try:
        with pytest.raises(OSError, match="No space"):
            runner.run(MSG)
        pids = read_pids(marks, timeout_s=1)
        assert [n for n, p in pids.items() if alive(p)] == []
    finally:
        kill_all(_pids_if_any(marks))


def test_the_daemon_keeps_the_gpus_busy_until_every_process_of_the_job_has_ended(tmp_path: Path) -> None:
    """(b) through the daemon: ``started`` answered 500, the job runs on, its GPU is not offered to
    the next attempt; canceled, the GPU is free again only once its escapers are all dead."""
    spec, io, marks = _setup(tmp_path, leader_s=60)
    api = FailingApi(spec, "started", [Unreachable(500, "InternalError", "retries exhausted")] * 100, marks)
    runner = _runner(tmp_path, api, io)
    daemon = Daemon(
        config=runner.config,
        inventory=runner.inventory,
        api=DaemonApi(),
        runner=runner,
        queue_for=lambda url: FakeQueue([]),
        ledger=runner.ledger,
        poll_wait_s=0,
    )
    queue = FakeQueue([])
    try:
        assert daemon.offer(queue, _msg("j-1", ["GPU-a"]))
        pids = read_pids(marks)
        wait_for(lambda: [r["event"] for r in api.reports].count("started") >= 2, 10, "a retried report")
        assert not daemon.offer(queue, _msg("j-2", ["GPU-a"]))  # the GPU is still the job's
        assert queue.retried == [("r-j-2", BUSY_RETRY_S)]
        runner.cancel("j-1", 1, grace_s=0.2)
        wait_for(lambda: "GPU-a" not in daemon._busy, 30, "the GPU to be freed")
        assert [n for n, p in pids.items() if alive(p)] == []  # no wait: gone before the GPU was
        assert api.reports[-1]["event"] == "canceled"
    finally:
        kill_all(_pids_if_any(marks))
