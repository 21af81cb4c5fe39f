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
    from berth.cli import jobs_cmd

    jobs_cmd.register(app)
    try:
        from berth.cli import sim_cmd
    except ImportError:  # pragma: no cover - during bootstrap only
        pass
    else:
        sim_cmd.register(app)
    try:
        from berth.localcloud import cli as local_cli
    except ImportError:  # pragma: no cover - local extra not installed
        pass
    else:
        local_cli.register(app)


_register()

if __name__ == "__main__":
    app()
