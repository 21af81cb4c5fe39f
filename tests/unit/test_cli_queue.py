"""``berth queue``: the team's waiting jobs in the scheduler's order, from GET /v1/tenants/{t}/queue."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from berth_tools.cli import queue_cmd
from berth_tools.cli.main import app


def _job(i: int, pos: int, start: str | None = None) -> dict[str, Any]:
    return {
        "id": f"j-{i:026d}",
        "status": "QUEUED",
        "reason": "waiting for capacity",
        "spec": {"name": f"trial-{i}", "resources": {"gpus": 2, "gpu_type": "A100"}},
        "queue_position": pos,
        "estimated_start": start,
        "estimated_start_basis": "onprem" if start else None,
    }


class Client:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.asked: list[tuple[str | None, int]] = []

    def queue(self, tenant: str | None, limit: int) -> dict[str, Any]:
        self.asked.append((tenant, limit))
        return self.answer


def test_queue_lists_the_head_in_order_for_the_callers_team(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {
        "tenant": "vision",
        "as_of": "2026-12-01T12:00:00.000Z",
        "waiting": 1200,
        "jobs": [_job(1, 1, "2026-12-01T12:10:00.000Z"), _job(2, 3)],
    }
    client = Client(answer)
    monkeypatch.setattr(queue_cmd, "client_for", lambda url, profile: client)
    monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal: every column whole
    result = CliRunner().invoke(app, ["queue", "--limit", "20"])
    assert result.exit_code == 0, result.output
    assert client.asked == [(None, 20)]  # the caller's own team: GET /v1/queue
    assert "vision: 1200 waiting (ranked by the pass at 2026-12-01T12:00:00.000Z)" in result.output
    lines = [line for line in result.output.splitlines() if "j-0" in line]
    assert [line.split()[0] for line in lines] == ["1", "3"]
    assert "2026-12-01T12:10:00.000Z (on-prem free)" in lines[0] and "no estimate" in lines[1]
    result = CliRunner().invoke(app, ["queue", "nlp", "-o", "json"])
    assert result.exit_code == 0 and client.asked[-1] == ("nlp", 50)


def test_an_unranked_queue_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client({"tenant": "vision", "as_of": None, "waiting": 0, "jobs": []})
    monkeypatch.setattr(queue_cmd, "client_for", lambda url, profile: client)
    result = CliRunner().invoke(app, ["queue"])
    assert result.exit_code == 0 and "no pass has ranked this team's queue yet" in result.output
