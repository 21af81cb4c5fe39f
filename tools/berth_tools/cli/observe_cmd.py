"""A job's output and usage: ``berth logs JOB [-f]`` and ``berth metrics JOB``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Protocol

import typer

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.cli.safe_text import literal, visible
from berth_tools.cli.tables import Cell, Column, WideOpt, show

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELED"})


class LogsApi(Protocol):
    def logs(
        self,
        job_id: str,
        attempt: int | None = None,
        since: str | None = None,
        limit: int | None = None,
        next_token: str | None = None,
        rank: int | None = None,
    ) -> Any: ...


def log_pages(
    api: LogsApi,
    job_id: str,
    *,
    attempt: int | None = None,
    since: str | None = None,
    follow: bool = False,
    poll_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    rank: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Pages of a job's output, oldest first, until what is there now is read; with ``follow``,
    until the job has ended and its last attempt's stream is drained. Without an ``attempt`` it
    reads the latest one and, following, moves on to the next attempt when the job retries.
    ``rank``: one node of a gang (the API's default: the main node)."""
    current, token = attempt, None
    extra = {} if rank is None else {"rank": rank}  # only when asked: older APIs refuse no rank
    while True:
        page = api.logs(
            job_id, attempt=current, since=since if token is None else None, next_token=token, **extra
        )
        yield page
        if current is None and page.get("attempt") is not None:
            current = int(page["attempt"])  # pin it: a token belongs to one attempt's stream
        token = page.get("next_token") or token
        if page.get("events"):
            continue  # more may be waiting: read on without pausing
        if not follow:
            return
        if attempt is None and current is not None and int(page.get("attempts") or 0) > current:
            current, token = int(page["attempts"]), None  # the job retried: follow the new attempt
            continue
        # The service reads the job before the log: an empty page with a terminal status means the
        # stream was read after the job ended (the agent ships all output before its final report).
        if page.get("status") in TERMINAL:
            return
        sleep(poll_s)


def logs(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Which attempt (default: the latest)")
    ] = None,
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            min=0,
            help="One node of a multi-node job (default: 0, the main node); in the cloud each node "
            "has its own stream, on-prem all ranks share one",
        ),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Epoch ms or ISO 8601 time (e.g. 2026-12-01T10:00:00Z)")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job has ended")
    ] = False,
    poll_s: Annotated[float, typer.Option("--poll", min=0.2, help="Seconds between polls (-f)")] = 2.0,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Print the output as the job wrote it, terminal escape sequences included "
            "(by default control characters are shown escaped, e.g. \\x1b)",
        ),
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Print a job's output (stdout and stderr), oldest first, every page of it. Control characters
    but newline and tab are printed as visible escapes, so the output cannot drive the terminal;
    ``--raw`` prints them as they are. ``--output json``: one JSON object per line, per event
    (``at``, ``message``, ``attempt``)."""
    with api_errors(output):
        client = client_for(api_url, profile)
        said = None
        pages = log_pages(
            client, job_id, attempt=attempt, since=since, follow=follow, poll_s=poll_s, rank=rank
        )
        for page in pages:
            reason = page.get("reason")
            if reason and reason != said and not page.get("events") and output is not OutputFormat.JSON:
                sys.stderr.write(
                    f"({visible(reason)})\n"
                )  # why nothing is shown yet, once; stdout stays the log
                said = reason
            for event in page.get("events", []):
                if output is OutputFormat.JSON:
                    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
                else:
                    message = event["message"].rstrip("\n")
                    sys.stdout.write((message if raw else visible(message)) + "\n")
            sys.stdout.flush()


def _num(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def metrics(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Which attempt (default: the latest)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="Most samples shown")] = 20,
    wide: WideOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Show a job's GPU, CPU and memory use: a summary of the attempt and its latest samples."""
    with api_errors(output):
        data = client_for(api_url, profile).metrics(job_id, attempt, limit)

    def table(d: dict[str, Any]) -> None:
        s = d["summary"]
        console.print(
            f"[bold]{d['job_id']}[/] attempt {_num(d['attempt'])} of {d['attempts']} "
            f"({d['status']}), {s['samples']} samples: GPU util avg {_num(s['gpu_util_avg'], '%')} "
            f"max {_num(s['gpu_util_max'], '%')}, GPU mem max {_num(s['gpu_mem_max_mib'], ' MiB')}, "
            f"CPU avg {_num(s['cpu_avg'], '%')}, RSS max {_num(s['rss_max_mib'], ' MiB')}",
            highlight=False,
        )
        columns = [
            Column("AT", key=True),
            Column("HOST", priority=1),
            Column("GPU %", justify="right"),
            Column("GPU MEM MiB", priority=2, justify="right"),
            Column("CPU %", justify="right"),
            Column("RSS MiB", priority=2, justify="right"),
            Column("PROCS", priority=3, justify="right"),
        ]
        rows: list[list[Cell]] = [
            [
                x["at"],
                literal(x["host_id"]),
                _num(x["gpu_util_pct"]),
                _num(x["gpu_mem_used_mib"]),
                _num(x["cpu_pct"]),
                _num(x["rss_mib"]),
                str(x["processes"]),
            ]
            for x in d["samples"]
        ]
        if rows:
            show(console, columns, rows, wide)

    render(output, data, table)


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)
    app.command("metrics")(metrics)
