"""``berth ui``: the web console on 127.0.0.1, signing with your own AWS credentials (docs/console.md)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from berth_tools.cli.output import OutputFormat, api_errors
from berth_tools.client import BerthClient, load_config

DEFAULT_PORT = 8765


def ui(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1 (0: any free)")] = (
        DEFAULT_PORT
    ),
    api_url: Annotated[
        str | None, typer.Option("--api-url", envvar="BERTH_API_URL", help="Berth API URL")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="AWS profile to sign with")] = None,
) -> None:
    """Serve the web console on 127.0.0.1 (jobs, a job's logs and usage, queue, fleet, costs). Requests
    are signed with your AWS credentials as the CLI signs them; the browser never holds them."""
    from berth_tools.console.server import ConsoleInfo, ConsoleServer

    with api_errors(OutputFormat.TABLE):
        config = load_config(api_url, profile)
        client = BerthClient(config)
    shown = config.profile or os.environ.get("AWS_PROFILE")
    try:
        server = ConsoleServer(client, ConsoleInfo(config.api_url, shown, config.region), port)
    except OSError as exc:
        typer.echo(f"berth ui: cannot listen on 127.0.0.1:{port}: {exc.strerror}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"Berth console: {server.url}  (signing as profile {shown or 'default'}; Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
