"""The CLI's array views: counts, the --wait progress loop (polls until every task ended), and the
tables of `berth status` / `berth ls` with an array row."""

from __future__ import annotations

from typing import Any

import pytest

from berth_tools.cli import jobs_cmd


def _array(counts: dict[str, int], size: int = 4) -> dict[str, Any]:
    return {
        "id": "j-0123456789abcdefghjkmnpqrs",
        "tenant": "vision",
        "owner": "o",
        "status": "RUNNING",
        "reason": "r",
        "spec": {"name": "sweep", "resources": {"gpus": 1, "gpu_type": "A100"}, "array": {"size": size}},
        "created_at": "t",
        "updated_at": "t",
        "site": None,
        "placement": None,
        "attempts": 0,
        "cost_usd": 0.0,
        "array": {"size": size, "counts": counts, "created": size},
    }


class FakeClient:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.gets = 0

    def get(self, job_id: str) -> dict[str, Any]:
        self.gets += 1
        return self.pages[min(self.gets, len(self.pages) - 1)]


def test_counts_in_status_order() -> None:
    text = jobs_cmd._counts(_array({"QUEUED": 2, "RUNNING": 1, "COMPLETED": 1}))
    assert text.index("QUEUED") < text.index("RUNNING") < text.index("COMPLETED")
    assert jobs_cmd._counts({"array": None}) == "-"


def test_wait_polls_until_every_task_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_cmd, "WAIT_POLL_S", 0)
    pages = [
        _array({"QUEUED": 4}),
        _array({"RUNNING": 2, "QUEUED": 2}),
        _array({"COMPLETED": 3, "RUNNING": 1}),
        _array({"COMPLETED": 3, "FAILED": 1}),
    ]
    client = FakeClient(pages)
    done = jobs_cmd.wait_for(client, pages[0], progress=False)  # type: ignore[arg-type]
    assert done["array"]["counts"] == {"COMPLETED": 3, "FAILED": 1} and client.gets == 3


def test_wait_for_a_plain_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_cmd, "WAIT_POLL_S", 0)
    job = {"id": "j-1", "status": "QUEUED"}
    client = FakeClient([job, {"id": "j-1", "status": "RUNNING"}, {"id": "j-1", "status": "COMPLETED"}])
    assert jobs_cmd.wait_for(client, job)["status"] == "COMPLETED"  # type: ignore[arg-type]


def test_status_table_shows_size_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    jobs_cmd._job_table(_array({"RUNNING": 1, "QUEUED": 3}))
    out = capsys.readouterr().out
    assert "4 (4 created)" in out and "RUNNING" in out and "QUEUED" in out


def test_status_table_shows_the_last_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    job = {**_array({"RUNNING": 1}), "array": None}
    jobs_cmd._job_table({**job, "checkpoint": None})
    assert "checkpoint" not in capsys.readouterr().out
    ckpt = {"at": "2026-12-03T17:00:00Z", "size_bytes": 3 * 1024**3, "attempt": 2}
    jobs_cmd._job_table({**job, "checkpoint": ckpt})
    out = capsys.readouterr().out
    assert "checkpoint" in out and "2026-12-03T17:00:00Z (3.0 GiB, attempt 2)" in out
