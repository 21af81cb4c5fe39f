"""``berth submit --follow``: a job's status changes, then its output, until it ends; the exit code
says how it ended. ``berth submit --dry-run``: the scheduler's answer for a spec, nothing stored."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from rich.table import Table

from berth_tools.cli.observe_cmd import TERMINAL, log_pages
from berth_tools.cli.output import OutputFormat, console, emit_json, err_console
from berth_tools.cli.safe_text import literal, visible
from berth_tools.client import BerthClient


class JobExit(IntEnum):
    """How a followed job ended (docs/api.md, "CLI exit codes"); 1..5 stay the API's refusals."""

    COMPLETED = 0
    FAILED = 10
    CANCELED = 11


def job_exit(status: str) -> int:
    return int(JobExit[status]) if status in JobExit.__members__ else int(JobExit.FAILED)


def _emit(output: OutputFormat, kind: str, data: dict[str, Any], text: str) -> None:
    if output is OutputFormat.JSON:
        sys.stdout.write(json.dumps({"type": kind, **data}, sort_keys=True) + "\n")
    elif kind == "log":
        sys.stdout.write(text + "\n")
    else:
        err_console.print(literal(text))
    sys.stdout.flush()


class _Events:
    """Prints the job's state changes it has not printed yet."""

    def __init__(self, client: BerthClient, job_id: str, output: OutputFormat) -> None:
        self.client, self.job_id, self.output, self.seen = client, job_id, output, 0

    def poll(self) -> None:
        events = self.client.events(self.job_id)["events"]
        for e in events[self.seen :]:
            line = f"{e['at']}  {e['from'] or '-'} -> {e['to']}  {visible(e['reason'])}"
            _emit(self.output, "event", {"event": e}, line)
        self.seen = max(self.seen, len(events))


def follow(
    client: BerthClient,
    job: dict[str, Any],
    output: OutputFormat,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow ``job`` until it ends: its events until it runs (or ends), then its output (every
    attempt's, as ``berth logs -f``), then the events left. Returns the exit code of its end."""
    job_id = job["id"]
    events = _Events(client, job_id, output)
    while True:
        job = client.get(job_id)
        events.poll()  # after the read: every change up to the status just read is shown
        if job["status"] == "RUNNING" or job["status"] in TERMINAL:
            break
        sleep(poll_s)
    for page in log_pages(client, job_id, follow=True, poll_s=poll_s, sleep=sleep):
        for e in page.get("events", []):
            _emit(output, "log", {"log": e}, visible(e["message"].rstrip("\n")))
        if not page.get("events"):
            events.poll()  # between polls of a quiet log: a retry, a cancel
    while True:  # the stream is drained once the job ended; its last events may lag a moment
        job = client.get(job_id)
        if job["status"] in TERMINAL:
            break
        sleep(poll_s)
    events.poll()
    _emit(output, "job", {"job": job}, f"{job_id} ended {job['status']}: {visible(job['reason'])}")
    return job_exit(job["status"])


def array_exit(job: dict[str, Any]) -> int:
    """An array followed to its end: 0 when every task COMPLETED, else as its worst task."""
    counts = job["array"]["counts"]
    if counts.get("FAILED"):
        return int(JobExit.FAILED)
    if counts.get("CANCELED"):
        return int(JobExit.CANCELED)
    return int(JobExit.COMPLETED)


def show_plan(plan: dict[str, Any], output: OutputFormat) -> None:
    if output is OutputFormat.JSON:
        emit_json(plan)
        return
    limits = plan["limits"]
    price = "-" if plan["hourly_usd"] is None else f"{plan['hourly_usd']:.2f} USD/h"
    cap = "none" if limits["max_cost_usd"] is None else f"{limits['max_cost_usd']:.2f} USD"
    t = Table(show_header=False, box=None, pad_edge=False)
    rows = [
        ("dry run", "nothing was submitted or stored"),
        ("name", plan["name"]),
        ("tasks", str(plan["tasks"])),
        ("outcome", plan["outcome"]),
        ("now", plan["summary"]),
        ("price", price + ("" if plan["outcome"] != "pending" else " (if it burst now)")),
        ("cost cap", f"{cap} (max_cost_usd); timeout {limits['timeout_minutes']} min"),
    ]
    if limits["max_hourly_usd"] is not None:
        rows.append(("hourly cap", f"{limits['max_hourly_usd']:.2f} USD/h"))
    if limits["monthly_cloud_budget_usd"] is not None:
        rows.append(("cloud budget", f"{limits['cloud_budget_left_usd']:.2f} USD left this month"))
    rows.append(("versions", f"policy v{plan['policy_version']}, offers v{plan['offers_version']}"))
    for k, v in rows:
        t.add_row(f"[bold]{k}[/]", literal(v))
    console.print(t)
    sites = Table("SITE", "ELIGIBLE", "RULE", "WHY / PRICE")
    for c in plan["explanation"]["candidates"]:
        sites.add_row(
            literal(c["site"]), "yes" if c["eligible"] else "no", c["rule"] or "-", literal(c["message"])
        )
    console.print(sites)


def submit_and_follow(
    client: BerthClient,
    spec: dict[str, Any],
    idempotency_key: str | None,
    dry_run: bool,
    output: OutputFormat,
) -> int:
    """``berth submit --dry-run`` (the plan; exit 0) or ``--follow`` (submit, then follow; the exit
    code of the job's end)."""
    if dry_run:
        show_plan(client.plan(spec), output)
        return 0
    job = client.submit(spec, idempotency_key)
    if output is not OutputFormat.JSON:
        err_console.print(literal(f"submitted {job['id']} ({job['status']})"))
    if job.get("array"):
        from berth_tools.cli.jobs_cmd import wait_for

        job = wait_for(client, job, progress=output is not OutputFormat.JSON)
        _emit(output, "job", {"job": job}, f"{job['id']} ended: {job['array']['counts']}")
        return array_exit(job)
    return follow(client, job, output)
