"""`berth bench api`: submit latency over HTTP against a running Berth API."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.loadtest.submit_latency import as_dict, measure


def api(
    requests: Annotated[
        int, typer.Option("--requests", "-n", min=1, max=100_000, help="Sequential submits")
    ] = 200,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the probe jobs queued (default: cancel them)")
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Measure submit latency: N sequential signed POST /v1/jobs, p50/p90/p99 in milliseconds."""
    with api_errors(output):
        report = as_dict(measure(client_for(api_url, profile), requests, cancel_after=not keep))

    def table(d: dict[str, float]) -> None:
        t = Table("metric", "value")
        for k, v in d.items():
            t.add_row(k, str(v))
        console.print(t)

    render(output, report, table)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("api")(api)
