"""``berth outputs JOB [--get DIR]``: where a job's outputs and checkpoints are, what is there, and a
copy of it fetched through the presigned GETs the API hands out (the caller needs no S3 rights)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import urllib3
from rich.table import Table

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, fail, render
from berth_tools.cli.safe_text import literal
from berth_tools.client import BerthClient, ClientError

#: Objects per page asked of the API.
PAGE = 1000


def all_outputs(client: BerthClient, job_id: str) -> dict[str, Any]:
    """Every page of the job's objects, as one answer (``next_token`` followed to the end)."""
    page = client.outputs(job_id, limit=PAGE)
    objects = list(page["objects"])
    while page.get("next_token"):
        page = client.outputs(job_id, limit=PAGE, next_token=page["next_token"])
        objects.extend(page["objects"])
    return {**page, "objects": objects, "next_token": None}


def local_path(root: Path, relative: str) -> Path:
    """Where object ``relative`` (a path under the job's prefix) goes under ``root``; ValueError for a
    path that would leave it (``..``, absolute, empty parts)."""
    parts = relative.split("/")
    if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise ValueError(f"refusing to write object {relative!r} outside {root}")
    return root.joinpath(*parts)


def download(objects: list[dict[str, Any]], root: Path, timeout_s: float = 300.0) -> int:
    """Fetch each object into ``root`` (kept relative paths); the bytes written."""
    total = 0
    http = urllib3.PoolManager()
    for obj in objects:
        target = local_path(root, obj["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        resp = http.request("GET", obj["url"], preload_content=False, timeout=timeout_s)
        try:
            if resp.status != 200:
                raise ClientError(
                    resp.status, "DownloadFailed", f"GET {obj['path']} answered {resp.status}; try again"
                )
            partial = target.with_name(target.name + ".partial")
            with partial.open("wb") as fh:
                for chunk in resp.stream(1 << 20):
                    fh.write(chunk)
                    total += len(chunk)
            partial.replace(target)
        finally:
            resp.release_conn()
    return total


def _table(d: dict[str, Any]) -> None:
    console.print(literal(f"location: {d['location']}"))
    if d.get("outputs"):
        console.print(literal(f"outputs ($BERTH_OUTPUT_DIR): {d['outputs']}"))
        console.print(literal(f"checkpoints ($BERTH_CHECKPOINT_DIR): {d['checkpoints']}"))
    if not d["objects"]:
        console.print("nothing stored yet")
        return
    t = Table("PATH", "SIZE", "MODIFIED")
    for o in d["objects"]:
        t.add_row(literal(o["path"]), str(o["size"]), o["last_modified"])
    console.print(t)


def outputs(
    job_id: Annotated[str, typer.Argument(help="Job, array or array task id")],
    get: Annotated[
        Path | None, typer.Option("--get", help="Fetch every object into this directory (kept paths)")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Where a job's outputs and checkpoints are (what it wrote to $BERTH_OUTPUT_DIR and
    $BERTH_CHECKPOINT_DIR), every object with its size and time; ``--get DIR`` fetches them."""
    with api_errors(output):
        data = all_outputs(client_for(api_url, profile), job_id)
        if get is not None:
            try:
                written = download(data["objects"], get)
            except (ValueError, OSError, urllib3.exceptions.HTTPError) as exc:
                fail(output, ClientError(0, "DownloadFailed", str(exc)))
            data["fetched"] = {"directory": str(get), "objects": len(data["objects"]), "bytes": written}
    render(output, data, _table)
    fetched = data.get("fetched")
    if fetched and output is not OutputFormat.JSON:
        console.print(
            literal(
                f"fetched {fetched['objects']} objects ({fetched['bytes']} bytes) into {fetched['directory']}"
            )
        )


def location_line(client: BerthClient, job: dict[str, Any], output: OutputFormat) -> None:
    """``berth status``'s line naming where the job's outputs are (table output only)."""
    if output is OutputFormat.JSON:
        return
    try:
        where = client.outputs(job["id"], limit=1)["location"]
    except ClientError:
        return  # the job is shown; its outputs' location is a courtesy
    console.print(literal(f"{'outputs':<11}{where}  (berth outputs {job['id']})"))


def register(app: typer.Typer) -> None:
    app.command("outputs")(outputs)
