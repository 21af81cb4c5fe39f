"""`berth sim` and `berth bench scheduler` through typer."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from berth_tools.cli import sim_cmd

ROOT = Path(__file__).resolve().parents[3]


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    sim_cmd.register(app, bench)
    return app


def test_sim_json_one_object_per_policy() -> None:
    res = CliRunner().invoke(
        _app(),
        [
            "sim",
            "--trace",
            str(ROOT / "examples/traces/tiresias-60.csv"),
            "--cluster",
            str(ROOT / "examples/clusters/small.yaml"),
            "--policy",
            "all",
            "--output",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.output.splitlines() if line.strip()]
    assert [r["policy"] for r in lines] == ["berth", "fifo-onprem", "burst-nowait", "cloud-cheapest"]


def test_sim_table_and_bad_policy() -> None:
    args = [
        "sim",
        "--trace",
        str(ROOT / "examples/traces/tiresias-60.csv"),
        "--cluster",
        str(ROOT / "examples/clusters/small.yaml"),
    ]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0 and "berth sim" in res.output
    res = CliRunner().invoke(_app(), [*args, "--policy", "nope"])
    assert res.exit_code != 0 and "unknown policy" in res.output


def test_bench_json() -> None:
    res = CliRunner().invoke(
        _app(),
        ["bench", "scheduler", "--nodes", "50", "--pending", "500", "--tenants", "5", "--output", "json"],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert (
        out["pending"] == 500 and out["decisions"] == 500 and out["decisions_per_s"] > 0 and out["pass_s"] > 0
    )
