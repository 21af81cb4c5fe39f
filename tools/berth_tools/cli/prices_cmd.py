"""``berth prices refresh``: the stored cloud offers with current AWS prices (admins store them)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, err_console, render
from berth_tools.prices import default_clients, refresh_document


def refresh(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change; store nothing")] = False,
    aws_profile: Annotated[
        str | None,
        typer.Option("--aws-profile", help="AWS profile to read prices with (default: the standard chain)"),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Read the cloud offers the control plane uses (the shipped catalog until an admin stores
    others), update their prices from the AWS Price List API and EC2 spot price history where
    those answer, and store the result as a new offers version (admins; If-Match on the version
    read). Sources that cannot be reached leave their prices as they were."""
    with api_errors(output):
        client = client_for(api_url, profile)
        current = client.get_document("offers")
        result = refresh_document(current["document"], default_clients(aws_profile))
        stored = None
        if result.changed and not dry_run:
            stored = client.put_document("offers", result.document, current["version"])
    data: dict[str, Any] = {
        "read_version": current["version"],
        "source": current["source"],
        **result.report.as_dict(),
        "stored_version": None if stored is None else stored["version"],
        "dry_run": dry_run,
    }

    def table(d: dict[str, Any]) -> None:
        for note in d["notes"]:
            err_console.print(f"[yellow]{note}[/]")
        console.print(
            f"offers version {d['read_version']} ({d['source']}): {d['on_demand_updated']} on-demand and "
            f"{d['spot_updated']} spot prices changed, {d['unchanged']} offers unchanged"
        )
        if d["stored_version"] is not None:
            console.print(f"stored as version {d['stored_version']}")
        elif d["on_demand_updated"] or d["spot_updated"]:
            console.print("dry run: nothing stored")
        else:
            console.print(
                "nothing stored: the prices in use stay"
                + (" (the shipped catalog)" if d["source"] == "default" else "")
            )

    render(output, data, table)


def register(app: typer.Typer) -> None:
    prices = typer.Typer(help="Cloud prices: refresh the offers from AWS's price APIs.", no_args_is_help=True)
    prices.command("refresh")(refresh)
    app.add_typer(prices, name="prices")
