"""``berth status`` of a queued job shows its place in the queue and the estimate, labelled as one."""

from __future__ import annotations

from typing import Any

from berth_tools.cli.queue_info import queue_rows


def _job(**kw: Any) -> dict[str, Any]:
    return {"status": "QUEUED", "queue_position": 3, "queue_length": 9, "queue_as_of": "T0", **kw}


def test_a_ranked_queued_job_shows_position_and_a_labelled_estimate() -> None:
    rows = dict(queue_rows(_job(estimated_start="2026-12-01T12:10:00.000Z", estimated_start_basis="burst")))
    assert rows["queue"] == "3 of 9 in your team's queue (as of T0)"
    assert str(rows["est. start"]) == "2026-12-01T12:10:00.000Z (an estimate: when its burst wait ends)"


def test_no_estimate_says_so_and_other_jobs_show_nothing() -> None:
    assert str(dict(queue_rows(_job(estimated_start=None)))["est. start"]).startswith("no estimate")
    assert queue_rows(_job(status="RUNNING")) == []
    assert queue_rows(_job(queue_position=None)) == []
