"""`berth` command line. Each concern registers its commands from its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="berth",
    help="Berth: hybrid-cloud GPU allocation for ML training jobs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from berth_tools.cli import (
        bench_cmd,
        fleet_cmd,
        jobs_cmd,
        loadtest_cmd,
        observe_cmd,
        outputs_cmd,
        prices_cmd,
        sim_cmd,
        ui_cmd,
    )
    from berth_tools.localcloud import cli as local_cli

    bench = typer.Typer(
        help="Benchmarks: the scheduler core and pass, the API, jobs end to end.", no_args_is_help=True
    )
    app.add_typer(bench, name="bench")
    jobs_cmd.register(app)
    fleet_cmd.register(app)
    sim_cmd.register(app, bench)
    loadtest_cmd.register(bench)
    bench_cmd.register(bench)
    local_cli.register(app)
    observe_cmd.register(app)
    outputs_cmd.register(app)
    prices_cmd.register(app)
    ui_cmd.register(app)


_register()

if __name__ == "__main__":
    app()
