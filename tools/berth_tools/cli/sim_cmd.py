"""`berth sim` (replay a trace through the scheduler core) and `berth bench scheduler`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from berth_tools.bench.scheduler_bench import bench_scheduler
from berth_tools.cli.tables import Column, metric_table, show
from berth_tools.sim.cluster import load_cluster
from berth_tools.sim.estimates import EstimateMode
from berth_tools.sim.policies import POLICY_NAMES, resolve_policy
from berth_tools.sim.runner import simulate
from berth_tools.sim.trace import load_trace

_SUMMARY_COLUMNS = (
    ("policy", "policy"),
    ("estimates", "estimates"),
    ("completed", "done"),
    ("avg_wait_s", "avg wait s"),
    ("p95_wait_s", "p95 wait s"),
    ("avg_jct_s", "avg JCT s"),
    ("onprem_gpu_utilization", "on-prem util"),
    ("cloud_gpu_hours", "cloud GPU-h"),
    ("total_cost_usd", "cost USD"),
    ("cost_lower_bound_usd", "cost LB USD"),
    ("jain_fairness", "Jain"),
    ("sim_wall_s", "wall s"),
)


def _check_output(output: str) -> str:
    if output not in ("json", "table"):
        raise typer.BadParameter("--output must be json or table")
    return output


def _policies(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if part == "all":
                out.extend(p for p in POLICY_NAMES if p not in out)
            elif part and part not in out:
                out.append(part)
    return out or ["berth"]


def _render_sim(results: list[dict[str, Any]], console: Console) -> None:
    # Every figure matters when comparing policies: only the mode, the wall time and the lower bound
    # may be left out on a narrow terminal (tables.py; -o json has all).
    optional = {"estimates": 3, "sim_wall_s": 2, "cost_lower_bound_usd": 1}
    columns = [
        Column(title, key=key == "policy", priority=optional.get(key, 0), justify="right")
        for key, title in _SUMMARY_COLUMNS
    ]
    console.print("berth sim", style="bold")
    show(
        console,
        columns,
        [[str(r.get(key, "")) for key, _ in _SUMMARY_COLUMNS] for r in results],
        wide_flag=False,
    )
    tenant_fields = ("tenant", "jobs", "avg_wait_s", "onprem_gpu_hours", "cloud_gpu_hours", "cost_usd")
    for r in results:
        console.print(f"tenants ({r['policy']})", style="bold")
        tenant_columns = [Column(c, key=c == "tenant", justify="right") for c in tenant_fields]
        show(
            console,
            tenant_columns,
            [[str(row[c]) for c in tenant_fields] for row in r["tenants"]],
            wide_flag=False,
        )
        if "data_locality" in r:
            _render_locality(r, console)


def _tib(n: Any) -> str:
    return f"{n / 1024**4:,.2f} TiB"


def _render_locality(r: dict[str, Any], console: Console) -> None:
    loc = r["data_locality"]
    keys = (
        "bytes_staged",
        "bytes_staged_onprem",
        "bytes_staged_cloud",
        "cache_hits",
        "cache_misses",
        "staging_hours",
        "second_job_holder_free",
        "second_job_staging_ratio_p50",
        "second_job_staging_ratio_p90",
        "avg_wait_s",
        "total_cost_usd",
    )
    rows = [
        [key, *((_tib if key.startswith("bytes") else str)(loc[side][key]) for side in ("with", "without"))]
        for key in keys
    ]
    rows.append(["bytes_saved", f"{_tib(loc['bytes_saved'])} ({loc['bytes_saved_fraction']:.1%})", ""])
    show(
        console,
        [
            Column("METRIC", key=True),
            Column("WITH PREFERENCE", justify="right"),
            Column("WITHOUT", justify="right"),
        ],
        rows,
        title=f"data locality ({r['policy']}; datasets: {loc['with']['datasets']})",
        wide_flag=False,
    )


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    @app.command("sim")
    def sim(
        trace: Path = typer.Option(..., "--trace", exists=True, dir_okay=False, help="Trace CSV"),
        cluster: Path = typer.Option(..., "--cluster", exists=True, dir_okay=False, help="Cluster YAML"),
        policy: list[str] = typer.Option(
            ["berth"], "--policy", help=f"{', '.join(POLICY_NAMES)}, 'all', or a policy file; repeatable"
        ),
        estimates: str = typer.Option(
            "predictor",
            "--estimates",
            help="predictor: what the service would know (default); oracle: true run times (an upper bound)",
        ),
        estimate_noise: float | None = typer.Option(
            None, "--estimate-noise", min=0.0, help="Users give estimates: true run time x lognormal(sigma)"
        ),
        data_locality: bool = typer.Option(
            False,
            "--data-locality",
            help="Model datasets and host caches (the cluster's data: section; synthetic datasets when "
            "the trace has no dataset column) and replay with and without the locality preference",
        ),
        output: str = typer.Option("table", "--output", "-o", help="json or table"),
    ) -> None:
        """Replay a workload trace through the scheduler core and print the metrics."""
        _check_output(output)
        if estimates not in tuple(EstimateMode):
            raise typer.BadParameter("--estimates must be predictor or oracle")
        try:
            jobs = load_trace(trace)
            spec = load_cluster(cluster)
            policies = [resolve_policy(p) for p in _policies(policy)]
        except (ValueError, OSError) as exc:
            raise typer.BadParameter(str(exc)) from exc
        results = []
        for pol in policies:
            result = simulate(jobs, spec, pol, EstimateMode(estimates), estimate_noise, data_locality)
            results.append(result)
            if output == "json":
                typer.echo(json.dumps(result))
        if output == "table":
            _render_sim(results, Console())

    @bench_app.command("scheduler")
    def bench(
        nodes: int = typer.Option(1000, "--nodes", min=1, help="On-prem hosts (8 GPUs each)"),
        pending: int = typer.Option(10000, "--pending", min=0, help="Pending jobs"),
        tenants: int = typer.Option(50, "--tenants", min=1, help="Tenants"),
        policy: str = typer.Option("berth", "--policy", help="Policy name or file"),
        seed: int = typer.Option(0, "--seed"),
        repeat: int = typer.Option(1, "--repeat", min=1, help="Passes to time (best is reported)"),
        output: str = typer.Option("table", "--output", "-o", help="json or table"),
    ) -> None:
        """Time one full scheduling pass on a generated snapshot."""
        _check_output(output)
        try:
            pol = resolve_policy(policy)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        result = bench_scheduler(nodes, pending, tenants, pol, seed=seed, repeat=repeat)
        if output == "json":
            typer.echo(json.dumps(result))
            return
        metric_table(Console(), result)
