"""``berth ls``'s parts: its filters as the API takes them, the pages it reads, the table it prints.

Every filter runs in the API (docs/api.md, "Listing filters"): ``--since`` in the query, ``--name``
and ``--site`` on each page the API reads. A filtered page may therefore hold fewer rows than
``--limit``; ``ls`` reads on until it has ``--limit`` rows (at most ``MAX_FILTERED_PAGES`` pages),
so a filter never shows an empty screen while matching jobs exist further down.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.text import Text

from berth_tools.cli.safe_text import literal
from berth_tools.cli.tables import Cell, Column

#: Pages ``ls`` reads at most to fill ``--limit`` rows under ``--name``/``--site`` (``--all``: no cap).
MAX_FILTERED_PAGES = 20

_AGO = re.compile(r"^(\d{1,6})\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def since_param(text: str, now: datetime | None = None) -> str:
    """``--since`` as the API takes it (ISO 8601, UTC): ``30m``, ``2h``, ``1d``, ``1w`` ago, or a
    date or time (``2026-12-01``, ``2026-12-01T10:00``, with a zone or taken as UTC)."""
    raw = text.strip()
    ago = _AGO.match(raw.lower())
    if ago:
        at = (now or datetime.now(UTC)) - timedelta(seconds=int(ago.group(1)) * _UNIT_S[ago.group(2)])
    else:
        try:
            at = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
        except ValueError:
            raise typer.BadParameter(
                f"{text!r} is neither a time ago (30m, 2h, 1d, 1w) nor a date or ISO 8601 time"
            ) from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_jobs(
    page: Callable[[str | None], dict[str, Any]],
    limit: int,
    next_token: str | None,
    all_pages: bool,
    filtered: bool,
) -> dict[str, Any]:
    """The jobs of one listing: one page; with ``all_pages`` every page; with ``filtered`` pages until
    ``limit`` rows (or ``MAX_FILTERED_PAGES``). ``page(token)`` reads one page."""
    answer = page(next_token)
    jobs = list(answer["jobs"])
    read = 1
    while answer.get("next_token") and (
        all_pages or (filtered and len(jobs) < limit and read < MAX_FILTERED_PAGES)
    ):
        answer = page(answer["next_token"])
        jobs.extend(answer["jobs"])
        read += 1
    return {"jobs": jobs, "next_token": None if all_pages else answer.get("next_token")}


def job_columns(with_tenant: bool) -> list[Column]:
    """``ls``'s columns, most important first to keep: the id always, whole."""
    columns = [
        Column("ID", key=True),
        Column("NAME", flexible=True, min_width=12),
        Column("STATUS"),
        Column("REASON", priority=2, flexible=True, min_width=20),
        Column("GPUS", priority=3),
        Column("WHERE / TASKS", priority=4, flexible=True, min_width=14),
        Column("COST USD", priority=5, justify="right"),
        Column("CREATED", priority=6),
    ]
    if with_tenant:
        columns.insert(1, Column("TENANT", priority=1))
    return columns


def job_rows(
    jobs: Sequence[dict[str, Any]],
    with_tenant: bool,
    status: Callable[[str], Text],
    where: Callable[[dict[str, Any]], Text],
) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for j in jobs:
        res = j["spec"].get("resources", {})
        row: list[Cell] = [
            j["id"],
            literal(j["spec"]["name"]),
            status(j["status"]),
            literal(j["reason"]),
            f"{res.get('gpus', 1)}x{res.get('gpu_type', '?')}",
            where(j),
            f"{j.get('cost_usd', 0.0):.2f}" if not j.get("array") else "-",
            j["created_at"],
        ]
        if with_tenant:
            row.insert(1, j["tenant"])
        rows.append(row)
    return rows
