"""Fleet and policy commands: explain, capacity, circuits, drain, admit, gpu-clear, policy, offers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from berth_agent.isolation import LABEL as GPU_ISOLATION_LABEL
from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, _read_spec, _status, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.cli.safe_text import literal


def _explain_table(d: dict[str, Any]) -> None:
    console.print(
        Text.assemble(
            Text(d["job_id"], style="bold"),
            " ",
            Text.from_markup(_status(d["status"])),
            ": ",
            literal(d["reason"]),
        )
    )
    ex = d.get("explanation")
    if ex is None:
        where = d.get("placement")
        console.print(
            f"outcome: [bold]{d['outcome']}[/]" + (f" at {escape(json.dumps(where))}" if where else "")
        )
        return
    console.print(f"outcome now: [bold]{ex['outcome']}[/]: {escape(ex['summary'])}")
    console.print(
        f"fair share: {ex['fair_share']:.3f} (rank {ex['fair_share_rank']} of {ex['tenants']} tenants); "
        f"rules: {', '.join(ex['rules']) or '-'}"
    )
    t = Table("SITE", "ELIGIBLE", "RULE", "USD/H", "WHY")
    for c in ex["candidates"]:
        usd = "-" if c["hourly_usd"] is None else f"{c['hourly_usd']:.2f}"
        mark = "[green]chosen[/]" if c["chosen"] else ("yes" if c["eligible"] else "[red]no[/]")
        t.add_row(c["site"], mark, c["rule"] or "-", usd, literal(c["message"]))
    console.print(t)


def explain(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Why a job is pending (the scheduler core's outcome for it now), or where it runs."""
    with api_errors(output):
        data = client_for(api_url, profile).explain(job_id)
    render(output, data, _explain_table)


def _capacity_table(d: dict[str, Any]) -> None:
    tot = d["totals"]
    console.print(
        f"[bold]{tot['hosts']} hosts[/], {tot['gpus']} GPUs: {tot['free_gpus']} free, "
        f"{tot['used_gpus']} used, {tot['unavailable_gpus']} unavailable"
        + (f", [red]{tot['faulted_gpus']} faulted[/]" if tot.get("faulted_gpus") else "")
        + f" (as of {d['as_of']})"
    )
    t = Table("POOL", "MODEL", "GPUS", "FREE", "USED", "UNAVAILABLE")
    for p in d["pools"]:
        for model, m in sorted(p["models"].items()):
            t.add_row(
                p["pool"],
                model,
                str(m["gpus"]),
                str(m["free_gpus"]),
                str(m["used_gpus"]),
                str(m["unavailable_gpus"]),
            )
    console.print(t)
    h = Table("HOST", "POOL", "MODEL", "FREE/GPUS", "ALIVE", "CONTAINMENT", "GPU ISOLATION", "ATTEMPTS")
    for host in d["hosts"]:
        alive = "[green]yes[/]" if host["alive"] else "[red]no[/]"
        h.add_row(
            host["host_id"],
            host["pool"],
            host["gpu_type"],
            f"{host['free_gpus']}/{host['gpus']}",
            alive,
            host.get("containment") or "-",
            (host.get("labels") or {}).get(GPU_ISOLATION_LABEL, "unknown"),
            ", ".join(host["attempts"]) or "-",
        )
    console.print(h)
    _gpu_faults_table(d["hosts"])
    c = Table("REGION", "CIRCUIT", "INSTANCE TYPES", "NOT CLOSED")
    for r in d["cloud"]["regions"]:
        bad = [
            f"{it['instance_type']}={it['circuit']}"
            for it in r["instance_types"]
            if it["circuit"] != "closed"
        ]
        c.add_row(r["region"], r["circuit"], str(len(r["instance_types"])), ", ".join(bad) or "-")
    console.print(c)


def _gpu_faults_table(hosts: list[dict[str, Any]]) -> None:
    """Degraded hosts' GPUs (fatal: out of placement until `berth gpu-clear`) and GPU warnings."""
    rows = [(host, f) for host in hosts for f in host.get("gpu_faults") or ()]
    if not rows:
        return
    t = Table("HOST", "GPU", "SEVERITY", "FAULT", "SINCE", title="GPU faults")
    for host, f in rows:
        gpu = f["gpu_id"] if f["index"] is None else f"{f['index']} ({f['gpu_id']})"
        severity = "[red]fatal: out of placement[/]" if f["severity"] == "fatal" else "[yellow]warning[/]"
        t.add_row(host["host_id"], literal(gpu), severity, literal(f["reason"]), f["at"])
    console.print(t)


def capacity(
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """The fleet now: pools, hosts, free and used GPUs; cloud regions and their circuit state."""
    with api_errors(output):
        data = client_for(api_url, profile).capacity()
    render(output, data, _capacity_table)


SetOpt = Annotated[Path | None, typer.Option("--set", help="New document (YAML/JSON) to store; admins only")]
VersionOpt = Annotated[int | None, typer.Option("--version", help="Show this stored version")]
IfMatchOpt = Annotated[
    int | None, typer.Option("--if-match", help="Refuse the write unless this is still the current version")
]


def _document(
    kind: str,
    set_file: Path | None,
    version: int | None,
    if_match: int | None,
    output: OutputFormat,
    api_url: str | None,
    profile: str | None,
) -> None:
    with api_errors(output):
        client = client_for(api_url, profile)
        if set_file is not None:
            data = client.put_document(kind, _read_spec(set_file, output), if_match)
        else:
            data = client.get_document(kind, version)

    def table(d: dict[str, Any]) -> None:
        by = f" by {d['updated_by']} at {d['updated_at']}" if d["updated_by"] else ""
        console.print(f"[bold]{kind}[/] version {d['version']} ({d['source']}{by})")
        console.print_json(json.dumps(d["document"]))

    render(output, data, table)


def policy(
    set_file: SetOpt = None,
    version: VersionOpt = None,
    if_match: IfMatchOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Show (or, as an admin, replace) the scheduling policy; every version is kept."""
    _document("policy", set_file, version, if_match, output, api_url, profile)


def offers(
    set_file: SetOpt = None,
    version: VersionOpt = None,
    if_match: IfMatchOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Show (or, as an admin, replace) the cloud offers; every version is kept."""
    _document("offers", set_file, version, if_match, output, api_url, profile)


def drain(
    host: Annotated[str, typer.Argument(help="The on-prem host's id (as `berth capacity` lists it)")],
    undo: Annotated[bool, typer.Option("--undo", help="Lift the drain: the host takes work again")] = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Drain an on-prem host (admins): nothing more is placed there, its agent stops taking work and
    its running jobs finish. `--undo` lifts it."""
    with api_errors(output):
        data = client_for(api_url, profile).drain_host(host, not undo)

    def table(d: dict[str, Any]) -> None:
        state = "draining: no new work" if d["drain_requested"] else "takes work again"
        console.print(f"host [bold]{d['host_id']}[/]: {state}")

    render(output, data, table)


def gpu_clear(
    host: Annotated[str, typer.Argument(help="The on-prem host's id (as `berth capacity` lists it)")],
    gpu: Annotated[str, typer.Argument(help="The GPU's index on the host, or its UUID")],
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Clear a GPU's fault (admins), once it is repaired or reset: it is placed on again."""
    with api_errors(output):
        data = client_for(api_url, profile).clear_gpu_fault(host, gpu)

    def table(d: dict[str, Any]) -> None:
        console.print(
            Text.assemble(
                f"host {d['host_id']} GPU ", literal(d["gpu_id"]), ": cleared ", literal(d["cleared"])
            )
        )

    render(output, data, table)


def admit(
    host: Annotated[str, typer.Argument(help="The on-prem host's id (as `berth capacity` lists it)")],
    gpu_type: Annotated[str, typer.Option("--gpu-type", help="The GPU model it may register")],
    gpus: Annotated[int, typer.Option("--gpus", help="How many GPUs it may register at most")],
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Admit what an on-prem host may register at most (admins): its first registration fixed it;
    more GPUs, or another type, are refused until an admin admits them."""
    with api_errors(output):
        data = client_for(api_url, profile).admit_host(host, gpu_type, gpus)

    def table(d: dict[str, Any]) -> None:
        a = d["admitted"]
        console.print(
            f"host [bold]{escape(d['host_id'])}[/] may register up to {a['gpus']} {escape(a['gpu_type'])}"
        )

    render(output, data, table)


def _circuits_table(d: dict[str, Any]) -> None:
    if "reset" in d:
        done = ", ".join(f"{c['region']}/{c['instance_type']}" for c in d["reset"])
        console.print(f"reset (closed): {escape(done)}")
        return
    rule = d["rule"]
    console.print(
        f"circuits as of {d['as_of']}: open after {rule['failure_threshold']} failures within "
        f"{rule['window_s']:g} s, for {rule['open_s']:g} s"
    )
    t = Table("REGION", "TYPE", "STATE", "FAILURES", "LAST FAILURE")
    colour = {"open": "red", "half-open": "yellow", "closed": "green"}
    for c in d["circuits"]:
        state = f"[{colour.get(c['state'], 'white')}]{escape(c['state'])}[/]"
        if c["effective_state"] != c["state"]:
            state += f" ({escape(c['effective_state'])} by its region)"
        row = (c["region"], c["instance_type"], str(c["recent_failures"]), c["last_failure_at"] or "-")
        region, instance_type, failures, last = (escape(str(x)) for x in row)
        t.add_row(region, instance_type, state, failures, last)
    console.print(t)


def parse_circuit(text: str) -> tuple[str, str | None]:
    """``REGION`` or ``REGION/INSTANCE_TYPE`` (``*``: the region's API circuit)."""
    region, sep, instance_type = text.partition("/")
    if not region or (sep and not instance_type):
        raise typer.BadParameter("REGION or REGION/INSTANCE_TYPE, e.g. us-east-1/p5.48xlarge")
    return region, instance_type or None


def circuits(
    reset: Annotated[
        str | None,
        typer.Option(
            "--reset",
            metavar="REGION[/INSTANCE_TYPE]",
            help="Close a region's circuits, or one (`us-east-1/p5.48xlarge`, `us-east-1/*` for its API)",
        ),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """The cloud's circuits and their state (admins); `--reset` closes them."""
    target = None if reset is None else parse_circuit(reset)
    with api_errors(output):
        client = client_for(api_url, profile)
        data = client.circuits() if target is None else client.reset_circuits(*target)
    render(output, data, _circuits_table)


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
    app.command("capacity")(capacity)
    app.command("circuits")(circuits)
    app.command("drain")(drain)
    app.command("admit")(admit)
    app.command("gpu-clear")(gpu_clear)
    app.command("policy")(policy)
    app.command("offers")(offers)
