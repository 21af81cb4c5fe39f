"""Job commands: submit, status, ls, cancel, events."""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from berth_tools.bundle import BundleError, local_code_dir, upload
from berth_tools.cli.listing import job_columns, job_rows, read_jobs, since_param
from berth_tools.cli.output import (
    OutputFormat,
    OutputOpt,
    api_errors,
    console,
    emit_json,
    err_console,
    fail,
    render,
)
from berth_tools.cli.queue_info import queue_rows
from berth_tools.cli.safe_text import literal
from berth_tools.cli.tables import Cell, Column, WideOpt, show
from berth_tools.client import BerthClient, ClientError, load_config

STATUS_STYLE = {
    "QUEUED": "yellow",
    "STARTING": "cyan",
    "RUNNING": "blue",
    "RETRYING": "magenta",
    "COMPLETED": "green",
    "FAILED": "red",
    "CANCELING": "dim",
    "CANCELED": "dim",
}


class SiteChoice(StrEnum):
    ONPREM = "onprem"
    CLOUD = "cloud"


ApiUrlOpt = Annotated[str | None, typer.Option("--api-url", envvar="BERTH_API_URL", help="Berth API URL")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="AWS profile to sign with")]


def client_for(api_url: str | None, profile: str | None) -> BerthClient:
    return BerthClient(load_config(api_url, profile))


def _status(s: str) -> str:
    return f"[{STATUS_STYLE.get(s, 'white')}]{s}[/]"


def _where(job: dict[str, Any]) -> str:
    p = job.get("placement") or {}
    if job.get("site") == "onprem":
        hosts = ",".join(h.get("host_id", "") for h in p.get("hosts", []))
        return f"onprem {p.get('pool', '')}/{hosts}"
    if job.get("site") == "cloud":
        return f"cloud {p.get('region', '')} {p.get('instance_type', '')}"
    return "-"


def _counts(job: dict[str, Any]) -> str:
    """An array's task counts, e.g. ``3 RUNNING, 7 QUEUED`` (in status order)."""
    counts = (job.get("array") or {}).get("counts") or {}
    return ", ".join(f"{counts[s]} {_status(s)}" for s in STATUS_STYLE if counts.get(s)) or "-"


def _job_table(job: dict[str, Any]) -> None:
    t = Table(show_header=False, box=None, pad_edge=False)
    res = job["spec"].get("resources", {})
    array = job.get("array")
    extra = (
        []
        if not array
        else [("tasks", f"{array['size']} ({array['created']} created)"), ("counts", _counts(job))]
    )
    task = job["spec"].get("array_task")
    if task:
        extra = [("array", f"{task['array_id']} task {task['index']} of {task['size']}")]
    for k, v in [
        ("id", job["id"]),
        ("name", job["spec"]["name"]),
        ("status", _status(job["status"])),
        ("reason", literal(job["reason"])),
        *queue_rows(job),
        ("tenant", job["tenant"]),
        ("owner", job["owner"]),
        ("resources", f"{res.get('gpus', 1)}x {res.get('gpu_type', '?')}"),
        ("where", _where(job)),
        ("attempts", str(job["attempts"])),
        ("cost", f"${job['cost_usd']:.2f}" if not array else "per task (berth ls --array)"),
        ("created", job["created_at"]),
        ("updated", job["updated_at"]),
        *_checkpoint_row(job),
        *extra,
    ]:
        t.add_row(f"[bold]{k}[/]", v)
    console.print(t)


def _checkpoint_row(job: dict[str, Any]) -> list[tuple[str, str]]:
    """``checkpoint: <time> (<size>, attempt N)`` once the job has one (an on-prem agent's report,
    or a cloud attempt's prefix read when it ended)."""
    ckpt = job.get("checkpoint")
    if not ckpt:
        return []
    size = ckpt.get("size_bytes")
    what = [] if size is None else [_bytes(int(size))]
    if ckpt.get("attempt") is not None:
        what.append(f"attempt {ckpt['attempt']}")
    return [("checkpoint", f"{ckpt['at']}" + (f" ({', '.join(what)})" if what else ""))]


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _read_spec(path: Path, output: OutputFormat) -> Any:
    def bad(message: str) -> NoReturn:
        fail(output, ClientError(0, "BadSpecFile", message))

    try:
        text = path.read_text() if str(path) != "-" else typer.get_text_stream("stdin").read()
    except OSError as exc:
        bad(f"cannot read {path}: {exc.strerror}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        bad(f"{path} is not valid YAML or JSON: {exc}")
    if not isinstance(data, dict):
        bad(f"{path} must hold a mapping (a job spec), not {type(data).__name__}")
    return data


def submit(
    file: Annotated[Path, typer.Option("--file", "-f", help="Job spec, YAML or JSON ('-' for stdin)")],
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Same key and spec give the same job")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until it ends (an array: a progress bar of its tasks)")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Validate, show where it would run now and its price; store no job"),
    ] = False,
    follow_job: Annotated[
        bool,
        typer.Option(
            "--follow", help="Then print its status changes and output until it ends (exit 0: COMPLETED)"
        ),
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Submit a training job from a spec file. ``code: ./dir`` (relative to the file) is packed and
    uploaded first, only if the control plane does not have it yet."""
    spec = _read_spec(file, output)
    with api_errors(output):
        client = client_for(api_url, profile)
        code = spec.get("code")
        directory = local_code_dir(code, file) if isinstance(code, str) else None
        if directory is not None:
            try:
                result = upload(client, directory)
            except BundleError as exc:
                fail(output, ClientError(0, "BadBundle", str(exc)))
            spec["code"] = result.code
            what = "uploaded" if result.uploaded else "already stored, nothing uploaded"
            typer.echo(
                f"bundle {result.code} {what} ({result.files} files, {result.bytes} bytes, "
                f"packed in {result.pack_s:.2f}s, upload {result.upload_s:.2f}s)",
                err=True,
            )
        if dry_run or follow_job:
            from berth_tools.cli import follow

            raise typer.Exit(follow.submit_and_follow(client, spec, idempotency_key, dry_run, output))
        job = client.submit(spec, idempotency_key)
        if output is not OutputFormat.JSON:
            console.print(f"submitted [bold]{job['id']}[/] ({_status(job['status'])})")
            defaults_note(job)
        if wait:
            job = wait_for(client, job, progress=output is not OutputFormat.JSON)
    if output is OutputFormat.JSON:
        emit_json(job)
    elif wait:
        _job_table(job)


def defaults_note(job: dict[str, Any]) -> None:
    """Say which resources Berth chose for the job because its spec did not (``defaults_applied``
    in the submit answer): a silent default GPU is a surprise on the bill."""
    applied = job.get("defaults_applied") or []
    if not applied:
        return
    res = job["spec"].get("resources", {})
    gpus, cpu, memory = res.get("gpus"), res.get("cpu", 0), res.get("memory_gib", 0)
    chosen = f"{gpus} x {res.get('gpu_type')}, {cpu:g} CPU, {memory:g} GiB"
    if applied == ["resources"]:
        what = "resources not given"
    else:
        what = ", ".join(a.removeprefix("resources.") for a in applied) + " not given"
    err_console.print(f"[yellow]{what}: using {chosen}[/] (set them under resources: in the spec)")


#: How often ``--wait`` polls the job.
WAIT_POLL_S = 2.0
_ENDED = ("COMPLETED", "FAILED", "CANCELED")


def wait_for(client: BerthClient, job: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Poll ``job`` until it ends; an array shows one bar of ended tasks and its counts by status."""
    if not job.get("array"):
        while job["status"] not in _ENDED:
            time.sleep(WAIT_POLL_S)
            job = client.get(job["id"])
        return job
    size = job["array"]["size"]
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
    )
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(job["id"], total=size, counts=_counts(job))
        while True:
            counts = job["array"]["counts"]
            ended = sum(counts.get(s, 0) for s in _ENDED)
            bar.update(task, completed=ended, counts=_counts(job))
            if ended >= size:
                return job
            time.sleep(WAIT_POLL_S)
            job = client.get(job["id"])


def status(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Show a job."""
    with api_errors(output):
        client = client_for(api_url, profile)
        job = client.get(job_id)
    render(output, job, _job_table)
    from berth_tools.cli.outputs_cmd import location_line

    location_line(client, job, output)


def ls(
    status_filter: Annotated[str | None, typer.Option("--status", help="Only jobs in this status")] = None,
    array: Annotated[str | None, typer.Option("--array", help="List this array's tasks instead")] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="This tenant's jobs (admins; default: your own)")
    ] = None,
    all_tenants: Annotated[
        bool, typer.Option("--all-tenants", help="Every tenant's jobs, newest first (admins)")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Created since: 30m, 2h, 1d, 1w ago, or a date or ISO time (UTC unless it says)"
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Name contains this, or matches it as a glob with * ? [ (resnet-*)"),
    ] = None,
    site: Annotated[SiteChoice | None, typer.Option("--site", help="Only jobs placed there")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="Page size")] = 50,
    all_pages: Annotated[bool, typer.Option("--all", help="Follow next_token to the end")] = False,
    next_token: Annotated[str | None, typer.Option("--next-token", help="Continue a listing")] = None,
    wide: WideOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """List your team's jobs, newest first (an array is one row with its task counts); with
    --array ID, that array's tasks in index order. Admins: --tenant T or --all-tenants. The filters
    run in the API; with --name or --site a page holds only the matches, so ls reads on until it has
    --limit rows."""
    status_q = status_filter.upper() if status_filter else None
    filters: dict[str, str | None] = {
        "tenant": tenant,
        "all_tenants": "true" if all_tenants else None,
        "since": None if since is None else since_param(since),
        "name": name,
        "site": None if site is None else site.value,
    }
    with api_errors(output):
        client = client_for(api_url, profile)
        result = read_jobs(
            lambda token: client.list(status_q, limit, token, array=array, **filters),
            limit,
            next_token,
            all_pages,
            filtered=name is not None or site is not None,
        )

    def table(data: dict[str, Any]) -> None:
        many = all_tenants or tenant is not None
        rows = job_rows(
            data["jobs"],
            many,
            lambda s: Text.from_markup(_status(s)),
            lambda j: Text.from_markup(_counts(j)) if j.get("array") else Text(_where(j)),
        )
        show(console, job_columns(many), rows, wide)
        if data.get("next_token"):
            console.print(f"more: --next-token {data['next_token']}", soft_wrap=True)

    render(output, result, table)


def cancel(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Cancel a job (queued jobs stop at once; running ones once their executor confirms), or every
    task of an array that has not ended."""
    with api_errors(output):
        job = client_for(api_url, profile).cancel(job_id)
    render(
        output,
        job,
        lambda j: console.print(
            Text.assemble(
                f"{j['id']}: ", Text.from_markup(_status(j["status"])), " (", literal(j["reason"]), ")"
            )
        ),
    )


def events(
    job_id: Annotated[str, typer.Argument(help="Job id")],
    wide: WideOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Show a job's state history."""
    with api_errors(output):
        data = client_for(api_url, profile).events(job_id)

    def table(d: dict[str, Any]) -> None:
        columns = [
            Column("AT", key=True),
            Column("FROM", priority=2),
            Column("TO"),
            Column("REASON", priority=1, flexible=True, min_width=20),
        ]
        rows: list[list[Cell]] = [
            [e["at"], e["from"] or "-", Text.from_markup(_status(e["to"])), literal(e["reason"])]
            for e in d["events"]
        ]
        show(console, columns, rows, wide)

    render(output, data, table)


def quota(
    tenant: Annotated[str, typer.Argument(help="Tenant (team)")],
    set_file: Annotated[
        Path | None, typer.Option("--set", help="Quota document (YAML/JSON) to set; admins only")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Show (or, as an admin, set) a tenant's quota."""
    with api_errors(output):
        client = client_for(api_url, profile)
        data = (
            client.put_quota(tenant, _read_spec(set_file, output)) if set_file else client.get_quota(tenant)
        )
    render(output, data, _quota_table)


def _quota_table(d: dict[str, Any]) -> None:
    budget = d.get("monthly_cloud_budget_usd")
    console.print(
        f"weight {d.get('weight', 1.0):g}, at most {d.get('max_active_jobs', '-')} active jobs, "
        + ("no monthly cloud budget" if budget is None else f"monthly cloud budget ${budget:,.2f}"),
        highlight=False,
    )
    gpus = d.get("gpus") or {}
    if not gpus:
        console.print("no GPUs guaranteed: the team borrows idle GPUs only")
        return
    columns = [
        Column("GPU MODEL", key=True),
        Column("GUARANTEED", justify="right"),
        Column("BORROW LIMIT", justify="right"),
    ]
    rows: list[list[Cell]] = [
        [model, str(q.get("guaranteed", 0)), str(q.get("borrow_limit", 0))]
        for model, q in sorted(gpus.items())
    ]
    show(console, columns, rows)


def _usage_table(d: dict[str, Any]) -> None:
    console.print(
        f"[bold]{d['tenant']}[/] in {d['month']}: ${d['total_cost_usd']:.2f}, "
        f"{d['total_gpu_hours']:.2f} GPU-hours, {d['attempts']} attempts"
    )
    columns = [
        Column("SITE", key=True),
        Column("GPU-HOURS", justify="right"),
        Column("COST USD", justify="right"),
    ]
    show(console, columns, [[s["site"], f"{s['gpu_hours']:.2f}", f"{s['cost_usd']:.2f}"] for s in d["sites"]])
    budget = d.get("monthly_budget_usd")
    if budget is None:
        console.print(f"cloud: ${d['cloud_cost_usd']:.2f} (no monthly cloud budget)")
    else:
        left = d["budget_left_usd"]
        note = " [red](spent: no more bursting this month)[/]" if left <= 0 else ""
        console.print(f"cloud: ${d['cloud_cost_usd']:.2f} of ${budget:.2f} budget, ${left:.2f} left{note}")


def usage(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Tenant (admins: any; default: your own)")
    ] = None,
    month: Annotated[str | None, typer.Option("--month", help="YYYY-MM (UTC); default: this month")] = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """A tenant's GPU-hours and cost in a month, per site, and its cloud budget left."""
    with api_errors(output):
        data = client_for(api_url, profile).usage(tenant, month)
    render(output, data, _usage_table)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("ls")(ls)
    app.command("cancel")(cancel)
    app.command("events")(events)
    app.command("quota")(quota)
    app.command("usage")(usage)


__all__ = ["emit_json", "register"]
