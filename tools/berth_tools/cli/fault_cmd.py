"""`berth local fault`: inject a fault into a running local cloud (`POST /_berth/fault` on its front door)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import typer

from berth_tools.cli.output import OutputFormat
from berth_tools.localcloud.faults import FAULT_PATH
from berth_tools.localcloud.state_dir import STATE_DIR_ENV, locate, parse_exports

USAGE = (
    "region-outage REGION | capacity REGION INSTANCE_TYPE | spot-interrupt JOB_ID | control-plane-outage"
    " | partition HOST_ID | heal HOST_ID | ddb-throttle FRACTION [SEED] | sqs-duplicate FRACTION [SEED]"
    " | agent-kill HOST_ID | lambda-kill FUNCTION | gpu-error HOST_ID [GPU] | clear | show"
)
_ARITY = {
    "region-outage": ("region",),
    "capacity": ("region", "instance_type"),
    "spot-interrupt": ("job_id",),
    "partition": ("host_id",),
    "heal": ("host_id",),
    "agent-kill": ("host_id",),
    "lambda-kill": ("function",),
}
#: Kinds that take a fraction of calls and an optional seed.
_FRACTIONS = ("ddb-throttle", "sqs-duplicate")


def fault_url(state_dir: Path) -> str:
    """The front door's fault endpoint, from the state dir's `env` (BERTH_API_URL)."""
    env_file = state_dir / "env"
    if not env_file.is_file():
        raise FileNotFoundError(
            f"{env_file} is missing: is `berth local up --state-dir {state_dir}` running? (Without "
            f"--state-dir, this command looks in ${STATE_DIR_ENV}, set by sourcing the env file, then in "
            ".berth/local here and at the top of the repository.)"
        )
    api_url = parse_exports(env_file.read_text()).get("BERTH_API_URL")
    if not api_url:
        raise FileNotFoundError(f"{env_file} has no BERTH_API_URL")
    parts = urllib.parse.urlsplit(api_url)
    return f"{parts.scheme}://{parts.netloc}{FAULT_PATH}"


def request_body(kind: str, args: list[str]) -> dict[str, Any] | None:
    """The JSON body for `kind ARGS` (None for `show`); ValueError naming the usage otherwise."""
    if kind == "show" and not args:
        return None
    if kind in ("clear", "control-plane-outage") and not args:
        return {"kind": kind}
    if kind == "gpu-error" and len(args) in (1, 2):
        # GPU: an index or a UUID (default 0); the XID is 79, "fallen off the bus"
        return {"kind": kind, "host_id": args[0], **({"gpu": args[1]} if len(args) == 2 else {})}
    if kind in _FRACTIONS and len(args) in (1, 2):
        try:
            body: dict[str, Any] = {"kind": kind, "fraction": float(args[0])}
            if len(args) == 2:
                body["seed"] = int(args[1])
        except ValueError:
            raise ValueError(
                f"usage: berth local fault {USAGE} (FRACTION a number, SEED an integer)"
            ) from None
        return body
    names = _ARITY.get(kind)
    if names is None or len(args) != len(names):
        raise ValueError(f"usage: berth local fault {USAGE}")
    return {"kind": kind, **dict(zip(names, args, strict=True))}


def send(url: str, body: dict[str, Any] | None, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="GET" if body is None else "POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"{}")
        except ValueError:
            return exc.code, {"message": raw.decode(errors="replace")}


def fault(
    kind: str = typer.Argument(
        ...,
        help="region-outage, capacity, spot-interrupt, control-plane-outage, partition, heal, "
        "ddb-throttle, sqs-duplicate, agent-kill, lambda-kill, gpu-error, clear or show.",
    ),
    args: list[str] | None = typer.Argument(
        None, help="REGION [INSTANCE_TYPE] | JOB_ID | HOST_ID [GPU] | FRACTION [SEED] | FUNCTION"
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        help=f"The running local cloud's state dir (default: ${STATE_DIR_ENV}, else .berth/local here "
        "or at the top of the repository).",
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o", help="table or json"),
) -> None:
    """Inject a fault into the running local cloud: region-outage REGION | capacity REGION INSTANCE_TYPE |
    spot-interrupt JOB_ID | control-plane-outage (Berth's API answers 503) | partition HOST_ID (its
    calls to Berth's API answer 503) | heal HOST_ID | ddb-throttle FRACTION [SEED] (DynamoDB calls
    throttled) | sqs-duplicate FRACTION [SEED] (SQS messages delivered twice) | agent-kill HOST_ID
    (SIGKILL, restarted) | lambda-kill FUNCTION (SIGKILL one sandbox) | gpu-error HOST_ID [GPU] (the
    simulated GPU, index or UUID, default 0, reports XID 79: out of placement until `berth gpu-clear`)
    | clear (show: list the faults in force)."""
    try:
        body = request_body(kind, list(args or []))
    except ValueError as exc:
        typer.echo(f"berth local fault: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        url = fault_url(locate(state_dir))
    except FileNotFoundError as exc:
        typer.echo(f"berth local fault: {exc}", err=True)
        raise typer.Exit(code=1) from None
    try:
        status, answer = send(url, body)
    except OSError as exc:
        typer.echo(f"berth local fault: the local cloud at {url} does not answer: {exc}", err=True)
        raise typer.Exit(code=1) from None
    if status != 200:
        typer.echo(f"berth local fault: {answer.get('message', answer)} (HTTP {status})", err=True)
        raise typer.Exit(code=2 if status == 400 else 1)
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(answer, sort_keys=True))
        return
    typer.echo(summary(kind if body is not None else None, answer))


def summary(kind: str | None, answer: dict[str, Any]) -> str:
    """One line for a fault's answer (`kind` None: `show`)."""
    faults = answer.get("faults", {})
    outages = ", ".join(faults.get("region_outages", [])) or "none"
    capacity = ", ".join(f"{c['region']}/{c['instance_type']}" for c in faults.get("capacity", [])) or "none"
    done = ""
    if kind is not None:
        if "batch_job_id" in answer:
            done = f"Batch job {answer['batch_job_id']} interrupted; "
        elif "killed_pid" in answer:
            done = f"agent of {answer['host_id']} (pid {answer['killed_pid']}) killed, restarting; "
        elif kind == "lambda-kill":
            done = f"sandbox pid {answer['pid']} of {answer['function']} killed; "
        elif kind == "gpu-error":
            done = f"{answer['gpu_id']} of {answer['host_id']} reports XID {answer['xid']}; "
        done = f"{kind}: {done}"
    extra = ""
    if faults.get("control_plane_outage"):
        extra += "; control plane DOWN"
    if faults.get("partitions"):
        extra += f"; partitioned: {', '.join(faults['partitions'])}"
    for name in ("ddb_throttle", "sqs_duplicate"):
        fault = faults.get(name)
        if fault:
            extra += (
                f"; {name.replace('_', '-')} {fault['fraction']:g} ({fault['hits']}/{fault['calls']} hit)"
            )
    return f"{done}region outages: {outages}; no capacity: {capacity}{extra}"
