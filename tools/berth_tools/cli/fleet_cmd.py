"""Fleet and policy commands: explain, capacity, circuits, drain, admit, gpu-clear, policy, offers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.text import Text

from berth_agent.isolation import LABEL as GPU_ISOLATION_LABEL
from berth_tools.cli.explain_view import explain_text
from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, _read_spec, _status, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.cli.safe_text import literal
from berth_tools.cli.tables import Cell, Column, WideOpt, show


def explain(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    every: Annotated[
        bool, typer.Option("--all", help="Every candidate site on its own row (default: one row per reason)")
    ] = False,
    wide: WideOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Why a job is pending (the scheduler core's outcome for it now, one row per distinct reason with
    how many candidate sites it covers), or where it runs, or how it ended."""
    with api_errors(output):
        data = client_for(api_url, profile).explain(job_id)
    render(
        output,
        data,
        lambda d: explain_text(console, d, lambda s: Text.from_markup(_status(s)), every=every, wide=wide),
    )


def _host_state(host: dict[str, Any]) -> Text:
    """Whether the scheduler may place on the host now, and if not why (worst first)."""
    if not host.get("alive", True):
        return Text("lost (lease expired)", style="red")
    if host.get("healthy") is False:
        return Text("unhealthy", style="red")
    if host.get("draining"):
        return Text("draining", style="yellow")
    if host.get("degraded"):
        return Text("degraded (GPU fault)", style="yellow")
    return Text("ok", style="green")


def _capacity_table(d: dict[str, Any], wide: bool = False) -> None:
    tot = d["totals"]
    console.print(
        f"[bold]{tot['hosts']} hosts[/], {tot['gpus']} GPUs: {tot['free_gpus']} free, "
        f"{tot['used_gpus']} used, {tot['unavailable_gpus']} unavailable"
        + (f", [red]{tot['faulted_gpus']} faulted[/]" if tot.get("faulted_gpus") else "")
        + f" (as of {d['as_of']}; policy v{d.get('policy_version', '-')})",
        highlight=False,
    )
    _pools_table(d["pools"], wide)
    _hosts_table(d["hosts"], wide)
    _gpu_faults_table(d["hosts"], wide)
    _regions_table(d["cloud"], wide)


def _pools_table(pools: list[dict[str, Any]], wide: bool) -> None:
    pool_rows: list[list[Cell]] = [
        [
            p["pool"],
            model,
            f"{p.get('healthy_hosts', '-')}/{p.get('hosts', '-')}",
            str(m["gpus"]),
            str(m["free_gpus"]),
            str(m["used_gpus"]),
            str(m["unavailable_gpus"]),
        ]
        for p in pools
        for model, m in sorted(p["models"].items())
    ]
    pool_columns = [
        Column("POOL", key=True),
        Column("MODEL", key=True),
        Column("HEALTHY HOSTS", priority=2, justify="right"),
        Column("GPUS", justify="right"),
        Column("FREE", justify="right"),
        Column("USED", priority=1, justify="right"),
        Column("UNAVAILABLE", priority=1, justify="right"),
    ]
    show(console, pool_columns, pool_rows, wide)


def _hosts_table(hosts: list[dict[str, Any]], wide: bool) -> None:
    host_columns = [
        Column("HOST", key=True),
        Column("STATE"),
        Column("FREE/GPUS", justify="right"),
        Column("MODEL", priority=1),
        Column("POOL", priority=2),
        Column("ADMITTED", priority=5, justify="right"),
        Column("CONTAINMENT", priority=4),
        Column("GPU ISOLATION", priority=4),
        Column("ATTEMPTS", priority=3, flexible=True, min_width=16),
    ]
    host_rows: list[list[Cell]] = [
        [
            literal(host["host_id"]),
            _host_state(host),
            f"{host['free_gpus']}/{host['gpus']}",
            host["gpu_type"],
            host["pool"],
            "-" if host.get("admitted_gpus") is None else str(host["admitted_gpus"]),
            host.get("containment") or "-",
            (host.get("labels") or {}).get(GPU_ISOLATION_LABEL, "unknown"),
            ", ".join(host["attempts"]) or "-",
        ]
        for host in hosts
    ]
    show(console, host_columns, host_rows, wide)


def _regions_table(cloud: dict[str, Any], wide: bool) -> None:
    if not cloud.get("enabled", True):
        console.print("cloud: disabled (nothing is placed in the cloud)")
        return
    region_rows: list[list[Cell]] = []
    for r in cloud["regions"]:
        bad = [
            f"{it['instance_type']}={it['circuit']}"
            for it in r["instance_types"]
            if it["circuit"] != "closed"
        ]
        region_rows.append(
            [r["region"], _circuit(r["circuit"]), str(len(r["instance_types"])), ", ".join(bad) or "-"]
        )
    region_columns = [
        Column("REGION", key=True),
        Column("CIRCUIT"),
        Column("INSTANCE TYPES", priority=2, justify="right"),
        Column("NOT CLOSED", priority=1, flexible=True, min_width=16),
    ]
    show(console, region_columns, region_rows, wide)


_CIRCUIT_COLOUR = {"open": "red", "half-open": "yellow", "closed": "green"}


def _circuit(state: str) -> Text:
    return Text(state, style=_CIRCUIT_COLOUR.get(state, "white"))


def _gpu_faults_table(hosts: list[dict[str, Any]], wide: bool) -> None:
    """Degraded hosts' GPUs (fatal: out of placement until `berth gpu-clear`) and GPU warnings."""
    rows: list[list[Cell]] = [
        [
            literal(host["host_id"]),
            literal(f["gpu_id"] if f["index"] is None else f"{f['index']} ({f['gpu_id']})"),
            Text("fatal: out of placement", style="red")
            if f["severity"] == "fatal"
            else Text("warning", style="yellow"),
            literal(f["reason"]),
            f["at"],
        ]
        for host in hosts
        for f in host.get("gpu_faults") or ()
    ]
    if not rows:
        return
    console.print("GPU faults (berth gpu-clear HOST GPU once repaired):", highlight=False)
    columns = [
        Column("HOST", key=True),
        Column("GPU", key=True),
        Column("SEVERITY"),
        Column("FAULT", flexible=True, min_width=16),
        Column("SINCE", priority=1),
    ]
    show(console, columns, rows, wide)


def capacity(
    wide: WideOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """The fleet now: pools, hosts (ok, draining, unhealthy or lost; free and used GPUs), cloud
    regions and their circuit state."""
    with api_errors(output):
        data = client_for(api_url, profile).capacity()
    render(output, data, lambda d: _capacity_table(d, wide))


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
        console.print(f"[bold]{kind}[/] version {d['version']} ({escape(str(d['source']))}{escape(by)})")
        if kind == OFFERS_KIND and isinstance(d["document"].get("offers"), list):
            _offers_table(d["document"]["offers"])
        else:  # the policy: YAML, as an admin writes it for --set
            console.print(literal(yaml.safe_dump(d["document"], sort_keys=False).rstrip()))

    render(output, data, table)


OFFERS_KIND = "offers"


def _offers_table(offers: list[dict[str, Any]]) -> None:
    columns = [
        Column("REGION", key=True),
        Column("ZONE", key=True),
        Column("INSTANCE TYPE", key=True),
        Column("GPU"),
        Column("GPUS", justify="right"),
        Column("ON-DEMAND USD/H", justify="right"),
        Column("SPOT USD/H", priority=1, justify="right"),
        Column("AVAILABLE", priority=2),
        Column("VCPUS", priority=3, justify="right"),
        Column("MEMORY GIB", priority=3, justify="right"),
        Column("QUEUE", priority=4, flexible=True, min_width=12),
    ]

    def usd(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"

    rows: list[list[Cell]] = [
        [
            str(o.get("region")),
            str(o.get("zone") or "-"),
            str(o.get("instance_type")),
            str(o.get("gpu_type")),
            str(o.get("gpus")),
            usd(o.get("on_demand_usd_h")),
            usd(o.get("spot_usd_h")),
            {True: "yes", False: "no"}.get(o.get("available"), "-"),  # type: ignore[arg-type]
            str(o.get("vcpus", "-")),
            str(o.get("memory_gib", "-")),
            literal(str(o.get("queue") or "-")),
        ]
        for o in offers
    ]
    show(console, columns, rows, wide_flag=False)


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
    _document(OFFERS_KIND, set_file, version, if_match, output, api_url, profile)


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
    columns = [
        Column("REGION", key=True),
        Column("TYPE", key=True),
        Column("STATE", flexible=True, min_width=10),
        Column("FAILURES", priority=1, justify="right"),
        Column("LAST FAILURE", priority=2),
    ]
    rows: list[list[Cell]] = []
    for c in d["circuits"]:
        state = _circuit(c["state"])
        if c["effective_state"] != c["state"]:
            state.append(f" ({c['effective_state']} by its region)")
        rows.append(
            [
                literal(c["region"]),
                literal(c["instance_type"]),
                state,
                str(c["recent_failures"]),
                c["last_failure_at"] or "-",
            ]
        )
    show(console, columns, rows, wide_flag=False)


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
