"""Job output and reasons reach the terminal escaped: ``berth logs``, ``berth status`` and ``berth
events`` (one helper, ``berth_tools.cli.safe_text``), with ``berth logs --raw`` as the way out."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from berth_tools.cli import jobs_cmd, observe_cmd
from berth_tools.cli.main import app
from berth_tools.cli.output import console
from berth_tools.cli.safe_text import literal, visible

CLEAR = "\x1b[2J\x1b[H"  # CSI: clear the screen, cursor home
TITLE = "\x1b]0;pwned\x07"  # OSC: window title, ended by BEL
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x1b\\"  # OSC 52: write the clipboard, ended by ST
C1_CSI = "\x9b2J"  # the one-byte CSI some terminals honour
HOSTILE = f"{CLEAR}{TITLE}{CLIPBOARD}{C1_CSI}\x07ok\rfake prompt $ [bold]not bold[/] :smile: \u202eevil"
#: What must never reach a terminal from job output.
RAW = ("\x1b", "\x07", "\x9b", "\r", "\u202e")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (CLEAR, "\\x1b[2J\\x1b[H"),
        (TITLE, "\\x1b]0;pwned\\x07"),
        (CLIPBOARD, "\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x1b\\"),
        (C1_CSI, "\\x9b2J"),
        ("\x07", "\\x07"),
        ("50%\r60%", "50%\\x0d60%"),
        ("\x00\x08\x7f\x85", "\\x00\\x08\\x7f\\x85"),
        ("abc\u202edef\u2066", "abc\\u202edef\\u2066"),
        ("line 1\nline 2\tcol", "line 1\nline 2\tcol"),  # newline and tab stay
        ("naïve 日本 🚀 [bold]x[/]", "naïve 日本 🚀 [bold]x[/]"),  # printable text is untouched
    ],
)
def test_visible_escapes_controls_and_keeps_the_rest(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_literal_is_never_markup() -> None:
    assert literal("[bold]x[/] :smile:").plain == "[bold]x[/] :smile:"
    assert literal("[bold]x[/]").spans == []


class Client:
    """The API's answers for one job whose output and reason hold escape sequences and markup."""

    def get(self, job_id: str) -> Any:
        return {
            "id": job_id,
            "spec": {"name": "train", "resources": {"gpus": 1, "gpu_type": "a100"}},
            "status": "FAILED",
            "reason": HOSTILE,
            "tenant": "vision",
            "owner": "arn:aws:iam::1:user/alice",
            "site": None,
            "placement": None,
            "attempts": 1,
            "cost_usd": 0.0,
            "created_at": "2026-12-01T10:00:00Z",
            "updated_at": "2026-12-01T10:05:00Z",
        }

    def outputs(self, job_id: str, **_: Any) -> Any:
        return {"location": f"s3://data/vision/jobs/{job_id}/", "objects": []}

    def events(self, job_id: str) -> Any:
        return {
            "events": [{"at": "2026-12-01T10:05:00Z", "from": "RUNNING", "to": "FAILED", "reason": HOSTILE}]
        }

    def logs(self, job_id: str, **_: Any) -> Any:
        token = _.get("next_token")
        events = [] if token else [{"at": "t", "message": HOSTILE, "attempt": 1}]
        return {
            "job_id": job_id,
            "attempt": 1,
            "attempts": 1,
            "status": "FAILED",
            "events": events,
            "next_token": "tok",
            "reason": None,
        }


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Any:
    for module in (jobs_cmd, observe_cmd):
        monkeypatch.setattr(module, "client_for", lambda *_a: Client())
    monkeypatch.setattr(console, "width", 1000)  # one table row a line, for the substring checks

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    return invoke


@pytest.mark.parametrize("command", [["logs", "j-1"], ["status", "j-1"], ["events", "j-1"]])
def test_commands_print_job_text_escaped_and_literally(run: Any, command: list[str]) -> None:
    out = run(*command)
    assert not any(c in out for c in RAW), repr(out)
    assert "\\x1b]52;c;" in out and "\\x1b[2J" in out and "\\x9b2J" in out and "\\x07" in out
    assert "[bold]not bold[/]" in out and ":smile:" in out  # no markup, no emoji


def test_logs_raw_prints_the_output_as_written(run: Any) -> None:
    out = run("logs", "j-1", "--raw")
    assert HOSTILE in out
