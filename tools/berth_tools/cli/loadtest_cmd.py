"""`berth bench api`: submit throughput and latency over HTTP against a running Berth API."""

from __future__ import annotations

from typing import Annotated

import typer

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.cli.tables import metric_table
from berth_tools.client import load_config
from berth_tools.loadtest.submit_latency import as_dict, local_cloud_pid, measure


def api(
    requests: Annotated[int, typer.Option("--requests", "-n", min=1, max=100_000, help="Submits")] = 200,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, max=256, help="Concurrent clients")
    ] = 1,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, max=1000, help="Submits first, not counted (cold caches)")
    ] = 0,
    pid: Annotated[
        int | None,
        typer.Option(
            "--pid", help="Process whose RSS/CPU to sample (default: the local cloud serving the API)"
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the probe jobs queued (default: cancel them)")
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Submit N jobs from C concurrent clients: throughput, p50/p90/p99 (ms), lost/duplicated jobs and,
    on the local cloud, its RSS before/after and growth per submit."""
    with api_errors(output):
        config = load_config(api_url, profile)
        server_pid = pid if pid is not None else local_cloud_pid(config.api_url)
        report = as_dict(
            measure(
                lambda: client_for(api_url, profile),
                requests,
                concurrency=concurrency,
                cancel_after=not keep,
                pid=server_pid,
                warmup=warmup,
            )
        )

    render(output, report, lambda d: metric_table(console, d))


def register(bench_app: typer.Typer) -> None:
    bench_app.command("api")(api)
