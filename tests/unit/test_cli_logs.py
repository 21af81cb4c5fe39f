"""``berth logs``'s paging: drains what is there, follows until the job ended, moves to a retry."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from berth_tools.cli.observe_cmd import log_pages


class Api:
    """Answers pages from a script: each call pops the next (job status, attempts, events)."""

    def __init__(self, script: list[tuple[str, int, list[str]]]) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []

    def logs(
        self,
        job_id: str,
        attempt: int | None = None,
        since: str | None = None,
        limit: int | None = None,
        next_token: str | None = None,
    ) -> Any:
        self.calls.append({"attempt": attempt, "since": since, "next_token": next_token})
        status, attempts, messages = self.script.pop(0)
        n = attempt or attempts
        return {
            "job_id": job_id,
            "attempt": n,
            "attempts": attempts,
            "status": status,
            "events": [{"at": "t", "message": m, "attempt": n} for m in messages],
            "next_token": f"tok-{n}-{len(self.calls)}",
        }


def messages(pages: Any) -> list[str]:
    return [e["message"] for p in pages for e in p["events"]]


def test_without_follow_it_reads_what_is_there_and_stops() -> None:
    api = Api([("RUNNING", 1, ["a", "b"]), ("RUNNING", 1, ["c"]), ("RUNNING", 1, [])])
    assert messages(log_pages(api, "j", since="2026-12-01T00:00:00Z")) == ["a", "b", "c"]
    assert api.calls[0] == {"attempt": None, "since": "2026-12-01T00:00:00Z", "next_token": None}
    # later pages continue with the token, pinned to the attempt the first page read
    assert api.calls[1] == {"attempt": 1, "since": None, "next_token": "tok-1-1"}


def test_follow_polls_until_the_job_ended_and_the_stream_is_drained() -> None:
    sleeps: list[float] = []
    api = Api(
        [
            ("RUNNING", 1, ["a"]),
            ("RUNNING", 1, []),
            ("RUNNING", 1, ["b"]),
            ("COMPLETED", 1, ["c"]),
            ("COMPLETED", 1, []),
        ]
    )
    got = messages(log_pages(api, "j", follow=True, poll_s=0.5, sleep=sleeps.append))
    assert got == ["a", "b", "c"] and sleeps == [0.5] and api.script == []


def test_follow_moves_on_to_the_next_attempt_when_the_job_retries() -> None:
    api = Api([("RUNNING", 1, ["first"]), ("RETRYING", 2, []), ("RUNNING", 2, ["second"]), ("FAILED", 2, [])])
    assert messages(log_pages(api, "j", follow=True, sleep=lambda _s: None)) == ["first", "second"]
    assert api.calls[2] == {"attempt": 2, "since": None, "next_token": None}


def test_an_explicit_attempt_is_never_left() -> None:
    api = Api([("RUNNING", 2, ["x"]), ("FAILED", 2, [])])
    assert messages(log_pages(api, "j", attempt=1, follow=True, sleep=lambda _s: None)) == ["x"]
    assert {c["attempt"] for c in api.calls} == {1}


def test_berth_logs_prints_every_page_of_long_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """``berth logs`` over the logs use case: 3 MB lines come a page each, cut with the marker, and
    the command reads on to the end of what is there."""
    from typer.testing import CliRunner

    from berth_tools.cli import observe_cmd
    from berth_tools.cli.main import app
    from tests.unit.test_observability import ALICE, Setup

    s = Setup()
    job, _ = s.w.run_to_running(s.w.submit())
    base = int(datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp() * 1000)
    lines = [f"{i}" + "z" * 3_000_000 for i in range(3)] + ["done"]
    for i, line in enumerate(lines):
        s.logs.write("/berth/jobs/vision", f"{job.id}/1", base + i, line)
    calls: list[str | None] = []

    class Client:
        def logs(self, job_id: str, **kw: Any) -> Any:
            calls.append(kw.get("next_token"))
            return s.svc.logs(ALICE, job_id, kw.get("attempt"), None, 200, kw.get("next_token"))

    monkeypatch.setattr(observe_cmd, "client_for", lambda *_a: Client())
    result = CliRunner().invoke(app, ["logs", job.id])
    assert result.exit_code == 0, result.output[-300:]
    out = result.output.splitlines()
    assert len(out) == 4 and out[3] == "done"
    for i in range(3):
        assert out[i].startswith(f"{i}zzz") and out[i].endswith("longer than one page of logs]")
        assert len(out[i]) < 2_200_000
    assert len(calls) == 4 + 1  # a page a long line, then "done", then the empty end
