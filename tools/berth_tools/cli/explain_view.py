"""``berth explain JOB`` as text: the scheduler core's outcome for a pending job, grouped by reason;
where a placed job runs; how a finished one ended (docs/api.md, ``GET /v1/jobs/{id}/explain``).

A pending job is judged against every pool and every cloud offer (region, instance type, zone):
tens of candidates, most kept off by the same rule with the same words. By default one row per
distinct (eligible, rule, reason) with how many candidates it covers and an example or two;
``--all`` lists every candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from berth_tools.cli.safe_text import literal
from berth_tools.cli.tables import Cell, Column, show

#: Candidate sites named in a grouped row before "+N more".
EXAMPLES = 2


@dataclass
class Group:
    chosen: bool
    eligible: bool
    rule: str | None
    message: str
    sites: list[str] = field(default_factory=list)
    prices: list[float] = field(default_factory=list)

    @property
    def order(self) -> tuple[int, float, int]:
        rank = 0 if self.chosen else 1 if self.eligible else 2
        return rank, min(self.prices, default=0.0), -len(self.sites)


def group_candidates(candidates: list[dict[str, Any]]) -> list[Group]:
    """One group per distinct (chosen, eligible, rule, message), chosen first, then eligible ones by
    price, then refusals by how many candidates they cover."""
    groups: dict[tuple[bool, bool, str | None, str], Group] = {}
    for c in candidates:
        key = (bool(c["chosen"]), bool(c["eligible"]), c["rule"], c["message"])
        g = groups.setdefault(key, Group(*key))
        g.sites.append(c["site"])
        if c.get("hourly_usd") is not None:
            g.prices.append(float(c["hourly_usd"]))
    return sorted(groups.values(), key=lambda g: g.order)


def _price(prices: list[float]) -> str:
    if not prices:
        return "-"
    low, high = min(prices), max(prices)
    return f"{low:.2f}" if low == high else f"{low:.2f}-{high:.2f}"


def _sites(sites: list[str]) -> str:
    shown = ", ".join(sites[:EXAMPLES])
    return shown + (f", +{len(sites) - EXAMPLES} more" if len(sites) > EXAMPLES else "")


def _mark(chosen: bool, eligible: bool) -> Text:
    if chosen:
        return Text("chosen", style="green")
    return Text("yes") if eligible else Text("no", style="red")


def candidates_table(console: Console, candidates: list[dict[str, Any]], every: bool, wide: bool) -> None:
    if every:
        columns = [
            Column("SITE", key=True),
            Column("ELIGIBLE"),
            Column("RULE", priority=2),
            Column("USD/H", priority=3, justify="right"),
            Column("WHY", priority=1, flexible=True, min_width=24),
        ]
        rows: list[list[Cell]] = [
            [
                literal(c["site"]),
                _mark(c["chosen"], c["eligible"]),
                c["rule"] or "-",
                "-" if c["hourly_usd"] is None else f"{c['hourly_usd']:.2f}",
                literal(c["message"]),
            ]
            for c in candidates
        ]
        show(console, columns, rows, wide)
        return
    columns = [
        Column("SITES", key=True, justify="right"),
        Column("ELIGIBLE"),
        Column("RULE", priority=2),
        Column("USD/H", priority=3, justify="right"),
        Column("WHY", flexible=True, min_width=24),
        Column("E.G.", priority=4, flexible=True, min_width=16),
    ]
    rows = [
        [
            str(len(g.sites)),
            _mark(g.chosen, g.eligible),
            g.rule or "-",
            _price(g.prices),
            literal(g.message),
            literal(_sites(g.sites)),
        ]
        for g in group_candidates(candidates)
    ]
    show(console, columns, rows, wide)


def placement_text(placement: dict[str, Any] | None) -> str:
    """Where an attempt runs or ran, in words (the placement record of docs/api.md)."""
    if not placement:
        return "not placed"
    rate = placement.get("hourly_usd")
    cost = "" if rate is None else f", {rate:.2f} USD/h"
    if placement.get("site") == "onprem":
        hosts = ", ".join(
            f"{h.get('host_id')} ({h.get('gpus')} GPUs"
            + (f": {','.join(str(i) for i in h['gpu_ids'])}" if h.get("gpu_ids") else "")
            + ")"
            for h in placement.get("hosts", [])
        )
        return f"on-prem, pool {placement.get('pool')}, {placement.get('gpu_type')} on {hosts}{cost}"
    kind = "spot" if placement.get("spot") else "on-demand"
    zone = f" ({placement['zone']})" if placement.get("zone") else ""
    return (
        f"cloud, {placement.get('region')}{zone}, {placement.get('instances', 1)} x "
        f"{placement.get('instance_type')} ({placement.get('gpu_type')}, {kind}), queue "
        f"{placement.get('queue')}{cost}"
    )


def explain_text(
    console: Console,
    d: dict[str, Any],
    status: Callable[[str], Text],
    every: bool = False,
    wide: bool = False,
) -> None:
    console.print(
        Text.assemble(Text(d["job_id"], style="bold"), " ", status(d["status"]), ": ", literal(d["reason"]))
    )
    outcome = d["outcome"]
    ex = d.get("explanation")
    if outcome == "placed":
        console.print(Text.assemble(("placed", "bold"), ": ", literal(placement_text(d.get("placement")))))
        console.print("the scheduler's reasons are for jobs still waiting; `berth events` has its history")
        return
    if outcome == "finished":
        ran = d.get("placement")
        console.print(Text.assemble(("finished", "bold"), f" ({d['status']})"))
        if ran:
            console.print(Text.assemble("last attempt ran: ", literal(placement_text(ran))))
        console.print("`berth events` has its history, `berth logs` its output")
        return
    if ex is None or "candidates" not in ex:
        # not-pending (placed between two reads) or not-considered (behind its queue's head).
        summary = (ex or {}).get("summary") or "no longer pending: ask again for where it runs"
        console.print(Text.assemble((outcome, "bold"), ": ", literal(summary)))
        return
    console.print(f"outcome now: [bold]{escape(ex['outcome'])}[/]: {escape(ex['summary'])}")
    console.print(
        f"fair share: {ex['fair_share']:.3f} (rank {ex['fair_share_rank']} of {ex['tenants']} tenants); "
        f"rules: {', '.join(ex['rules']) or '-'}",
        highlight=False,
    )
    if ex.get("preempts"):
        console.print(f"would preempt: {', '.join(ex['preempts'])}", highlight=False)
    if ex.get("tenant_not_considered"):
        console.print(
            f"{ex['tenant_not_considered']} of your team's queued jobs were not read by this pass",
            highlight=False,
        )
    candidates_table(console, ex["candidates"], every, wide)
    if not every and len(ex["candidates"]) > 1:
        console.print(f"{len(ex['candidates'])} candidate sites; --all lists each one", highlight=False)
