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
    from berth.cli import jobs_cmd, sim_cmd
    from berth.localcloud import cli as local_cli

    jobs_cmd.register(app)
    sim_cmd.register(app)
    local_cli.register(app)


_register()

if __name__ == "__main__":
    app()
