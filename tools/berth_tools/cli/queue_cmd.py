"""``berth queue``: a team's waiting jobs in the order the scheduler serves them, from the head its
last pass ranked (``GET /v1/tenants/{tenant}/queue``: one read however deep the queue)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.cli.safe_text import literal
from berth_tools.cli.tables import Cell, Column, WideOpt, show

_BASIS = {"onprem": "on-prem free", "burst": "burst wait ends"}


def queue_table(d: dict[str, Any], wide: bool = False) -> None:
    jobs = d.get("jobs") or []
    if d.get("as_of") is None:
        console.print(f"{d['tenant']}: no pass has ranked this team's queue yet", highlight=False)
        return
    console.print(
        f"{d['tenant']}: {d['waiting']} waiting (ranked by the pass at {d['as_of']}); "
        f"the first {len(jobs)} still waiting:",
        highlight=False,
    )
    if not jobs:
        return
    columns = [
        Column("POS", justify="right"),
        Column("JOB", key=True),
        Column("NAME", flexible=True, priority=2),
        Column("GPUS", priority=1),
        Column("EST. START (an estimate)", priority=1),
        Column("REASON", flexible=True, priority=3, min_width=16),
    ]
    rows: list[list[Cell]] = []
    for j in jobs:
        res = (j.get("spec") or {}).get("resources") or {}
        start = j.get("estimated_start")
        basis = _BASIS.get(j.get("estimated_start_basis") or "", "")
        rows.append(
            [
                str(j.get("queue_position") or "-"),
                literal(j["id"]),
                literal(str((j.get("spec") or {}).get("name") or "")),
                f"{res.get('gpus', 1)}x{res.get('gpu_type', '')}",
                literal(f"{start} ({basis})" if start else "no estimate"),
                literal(str(j.get("reason") or "")),
            ]
        )
    show(console, columns, rows, wide=wide)


def queue(
    tenant: Annotated[
        str | None, typer.Argument(help="Tenant (team); default: your own (admins: any)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="At most this many jobs")] = 50,
    wide: WideOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """A team's waiting jobs in the order the scheduler serves them: position, estimated start (an
    estimate from the same predictor the scheduler uses) and reason, however deep the queue."""
    with api_errors(output):
        data = client_for(api_url, profile).queue(tenant, limit)
    render(output, data, lambda d: queue_table(d, wide))


def register(app: typer.Typer) -> None:
    app.command("queue")(queue)
