"""The "why is it waiting" lines of ``berth status``: a queued job's place in its team's queue and
the scheduler's estimate of its start (from the job API, which reads the last pass's summary)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from berth_tools.cli.safe_text import literal

_BASIS = {
    "onprem": "when on-prem GPUs of its model are predicted free",
    "burst": "when its burst wait ends",
}


def queue_rows(job: dict[str, Any]) -> list[tuple[str, str | Text]]:
    """``[("queue", "3 of 12 (as of ...)"), ("est. start", "... (estimate: ...)")]`` for a ranked
    queued job; nothing otherwise."""
    position = job.get("queue_position")
    if job.get("status") != "QUEUED" or position is None:
        return []
    of = f"{position} of {job.get('queue_length')} in your team's queue (as of {job.get('queue_as_of')})"
    rows: list[tuple[str, str | Text]] = [("queue", of)]
    start = job.get("estimated_start")
    if start:
        basis = _BASIS.get(job.get("estimated_start_basis") or "", "")
        rows.append(("est. start", literal(f"{start} (an estimate{': ' + basis if basis else ''})")))
    else:
        rows.append(("est. start", "no estimate (see berth explain)"))
    return rows
