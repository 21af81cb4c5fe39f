"""`berth` command line. Each concern registers its commands from its own module."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

app = typer.Typer(
    name="berth",
    help="Berth: hybrid-cloud GPU allocation for ML training jobs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"berth {_installed_version()}")
        raise typer.Exit()


def _installed_version() -> str:
    try:
        return version("berth")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


@app.callback()
def _main(
    _show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the installed version and exit"
        ),
    ] = False,
) -> None:
    """Berth: hybrid-cloud GPU allocation for ML training jobs."""


def _register() -> None:
    from berth_tools.cli import (
        bench_cmd,
        fleet_cmd,
        jobs_cmd,
        loadtest_cmd,
        observe_cmd,
        outputs_cmd,
        prices_cmd,
        queue_cmd,
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
    queue_cmd.register(app)
    ui_cmd.register(app)


_register()

if __name__ == "__main__":
    app()
