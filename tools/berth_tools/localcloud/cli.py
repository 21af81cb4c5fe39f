"""`berth local up`: the embedded local cloud in the foreground."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import typer

from berth_tools.cli.output import OutputFormat
from berth_tools.localcloud.state_dir import DEFAULT_STATE_DIR, StateDirBusy, render_exports

TEMPLATE_RELATIVE = Path("cdk.out/Berth.template.json")
#: What the template is synthesised from: a newer file here means the template is stale.
SYNTH_SOURCES = ("infra", "functions", "cdk.json")


def find_repo_root(start: Path | None = None) -> Path | None:
    """The directory holding cdk.json: upwards from the working directory, else from this package."""
    candidates = [start or Path.cwd(), Path(__file__).resolve()]
    for candidate in candidates:
        for directory in (candidate, *candidate.parents):
            if (directory / "cdk.json").is_file() and (directory / "infra").is_dir():
                return directory
    return None


def template_is_stale(template: Path, root: Path) -> bool:
    if not template.exists():
        return True
    built = template.stat().st_mtime
    for name in SYNTH_SOURCES:
        source = root / name
        if source.is_file() and source.stat().st_mtime > built:
            return True
        if source.is_dir():
            for path in source.rglob("*.py"):
                if "__pycache__" not in path.parts and path.stat().st_mtime > built:
                    return True
    return False


def synthesise(root: Path) -> None:
    env = dict(os.environ, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    env.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
    typer.echo("berth local: synthesising the CDK app (npx cdk synth --quiet)...", err=True)
    result = subprocess.run(
        ["npx", "cdk", "synth", "--quiet"], cwd=root, env=env, stdout=subprocess.DEVNULL, check=False
    )
    if result.returncode != 0:
        raise typer.Exit(code=result.returncode or 1)


def up(
    state_dir: Path = typer.Option(
        DEFAULT_STATE_DIR, "--state-dir", help="Where profiles and the env file go."
    ),
    port: int = typer.Option(0, "--port", help="Port of the API front door (0: a free one)."),
    moto_port: int = typer.Option(0, "--moto-port", help="Port of the moto server (0: a free one)."),
    template: Path | None = typer.Option(
        None, "--template", help="CloudFormation template to deploy (default: cdk.out/Berth.template.json)."
    ),
    agents: int = typer.Option(
        4,
        "--agents",
        min=0,
        max=64,
        help="On-prem hosts to start, each an agent with its own IAM identity (agents.json).",
    ),
    agent_kind: str = typer.Option(
        "process",
        "--agent-kind",
        help="process: real berth-agent processes running jobs' commands on simulated GPUs; "
        "scripted: in-process protocol clients whose jobs follow SCRIPTED_* env (tests, demo).",
    ),
    gpus_per_agent: int = typer.Option(8, "--gpus-per-agent", min=1, max=16, help="Simulated GPUs per host."),
    gpu_type: str | None = typer.Option(
        None, "--gpu-type", help="GPU model of every host (default: A100 and V100 in turn)."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No access log or handler logs on the console."),
    function_env: list[str] = typer.Option(
        [],
        "--function-env",
        help="KEY=VALUE over the local timings in the control-plane functions' environment (repeatable; "
        "only variables the template sets, e.g. BERTH_BATCH_SUBMIT_RATE=5).",
    ),
    aws_latency_ms: float = typer.Option(
        0.0,
        "--aws-latency-ms",
        min=0,
        max=1000,
        help="Once started, delay every control-plane AWS call by this many ms (see aws_latency).",
    ),
    output: OutputFormat = typer.Option(
        OutputFormat.TABLE, "--output", "-o", help="table: shell exports; json: one JSON object when ready"
    ),
) -> None:
    """Start the embedded local cloud in the foreground (Ctrl-C stops it)."""
    started = time.monotonic()
    # Once, here: agents run in directories of their own, so every path they are given is absolute.
    state_dir = state_dir.resolve()
    if agent_kind not in ("process", "scripted"):
        typer.echo("berth local: --agent-kind is process or scripted", err=True)
        raise typer.Exit(code=2)
    if template is None:
        root = find_repo_root()
        if root is None:
            typer.echo("berth local: no cdk.json found; pass --template", err=True)
            raise typer.Exit(code=2)
        template = root / TEMPLATE_RELATIVE
        if template_is_stale(template, root):
            synthesise(root)
    from berth_tools.localcloud.cloud import (
        LOCAL_TIMINGS,
        LocalCloud,
        LocalCloudError,
        load_batch_templates,
        load_template,
    )

    timings = dict(LOCAL_TIMINGS)
    for pair in function_env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            typer.echo(f"berth local: --function-env takes KEY=VALUE, not {pair!r}", err=True)
            raise typer.Exit(code=2)
        timings[key] = value
    from berth_tools.localcloud import memory_debug

    memory_debug.install(state_dir)  # opt-in: BERTH_LOCAL_TRACEMALLOC
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    console = sys.stderr
    cloud = LocalCloud(
        template=load_template(template),
        # The cloud regions' Batch stacks synthesised next to it (cdk.out/Berth-batch-<region>...).
        batch_templates=load_batch_templates(template),
        state_dir=state_dir,
        api_port=port,
        moto_port=moto_port,
        console=None if quiet else console,
        echo_handler_logs=not quiet,
        agents=agents,
        gpus_per_agent=gpus_per_agent,
        gpu_type=gpu_type,
        agent_kind=agent_kind,
        function_timings=timings,
    )
    try:
        try:
            cloud.start()
        except (LocalCloudError, StateDirBusy) as exc:
            typer.echo(f"berth local: {exc}", err=True)
            raise typer.Exit(code=1) from None
        if aws_latency_ms:
            from berth_tools.localcloud import aws_latency

            aws_latency.set_ms(aws_latency_ms)  # after the deploy: it is not the control plane's
        if output is OutputFormat.JSON:
            ready = {
                "api_url": cloud.api_url,
                "endpoint_url": cloud.endpoint_url,
                "profiles": list(cloud.profiles),
                "state_dir": str(state_dir),
                "env_file": str(state_dir / "env"),
                "env": dict(cloud.exports),
                "ready_s": round(time.monotonic() - started, 2),
            }
            typer.echo(json.dumps(ready, sort_keys=True))
        else:
            typer.echo(render_exports(cloud.exports), nl=False)
        sys.stdout.flush()
        typer.echo(
            f"berth local: API {cloud.api_url}, AWS endpoint {cloud.endpoint_url}; "
            f"profiles {', '.join(cloud.profiles)}; env in {state_dir / 'env'}",
            err=True,
        )
        steps = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in cloud.timings.items())
        typer.echo(
            f"berth local: ready in {time.monotonic() - started:.1f}s ({steps}); Ctrl-C to stop", err=True
        )
        while not stop.wait(0.5):
            pass
        typer.echo("berth local: stopping", err=True)
    finally:
        cloud.stop(exiting=stop.is_set())
        if stop.is_set():
            took = cloud.timings.get("stop", 0.0)
            typer.echo(f"berth local: stopped in {took:.1f}s", err=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.is_set():
        # Everything is stopped and written: end here. Python's own finalisation would first free the
        # emulator's objects one by one (measured: 13 s after a few minutes of use, growing with the
        # state), and Ctrl-C must end the local cloud within cloud.SHUTDOWN_S.
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(0)


def register(app: typer.Typer) -> None:
    local = typer.Typer(
        name="local", help="The embedded local cloud (moto + Berth's stack).", no_args_is_help=True
    )
    local.command("up")(up)
    from berth_tools.cli.fault_cmd import fault

    local.command("fault")(fault)
    app.add_typer(local, name="local")


def main() -> None:
    app = typer.Typer(pretty_exceptions_enable=False, no_args_is_help=True)
    register(app)
    app()
