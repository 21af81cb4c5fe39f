"""`berth bench e2e` (jobs through the running service), `berth bench pass` (one scheduling pass
over a large store on an embedded local cloud) and `berth bench replay` (one trace through `berth sim`
and through the local cloud)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from berth_tools.cli.jobs_cmd import ApiUrlOpt, ProfileOpt, client_for
from berth_tools.cli.output import OutputFormat, OutputOpt, api_errors, console, render
from berth_tools.cli.tables import metric_table

AwsLatencyOpt = Annotated[
    float,
    typer.Option(
        "--aws-latency-ms",
        min=0,
        max=1000,
        help="Delay every control-plane AWS call by this many ms (the local cloud's; see aws_latency)",
    ),
]


def _table(d: dict[str, Any]) -> None:
    metric_table(console, d)


def e2e(
    jobs: Annotated[int, typer.Option("-n", "--jobs", min=1, max=100_000, help="Jobs to run")] = 100,
    concurrency: Annotated[int, typer.Option("-c", "--concurrency", min=1, max=128)] = 8,
    gpu_type: Annotated[
        str, typer.Option("--gpu-type", help="GPU model of the probe jobs ('any': A100 and V100 in turn)")
    ] = "any",
    run_s: Annotated[float, typer.Option("--run-s", min=0, max=3600, help="How long each job runs")] = 1.0,
    timeout_s: Annotated[float, typer.Option("--timeout", min=1, help="Give up waiting after")] = 600.0,
    rate: Annotated[
        float | None,
        typer.Option("--rate", min=0.01, help="Submits per second (default: as fast as C clients go)"),
    ] = None,
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url",
            envvar="AWS_ENDPOINT_URL",
            help="The local cloud's AWS endpoint, for its meter (none: no AWS cost figure)",
        ),
    ] = None,
    placement: Annotated[
        str,
        typer.Option(
            "--placement",
            help="onprem, or cloud: the jobs burst to AWS Batch (gpu 'any': A10G); adds Batch API calls "
            "per job and, with --endpoint-url, duplicated Batch submits",
        ),
    ] = "onprem",
    aws_latency_ms: AwsLatencyOpt = 0.0,
    array_size: Annotated[
        int,
        typer.Option(
            "--array-size",
            min=1,
            max=10_000,
            help="Submit the N jobs as arrays of this many tasks running a code bundle (in the cloud "
            "they run as Batch array jobs); 1: single image jobs",
        ),
    ] = 1,
    code_bundle: Annotated[
        bool,
        typer.Option(
            "--code-bundle",
            help="Single jobs run the same code bundle as --array-size tasks (a like-for-like baseline)",
        ),
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Submit N one-GPU jobs, wait for each to end: submit-to-RUNNING p50/p99 and, on the local cloud,
    the control plane's AWS bill per 1,000 jobs (metered, list prices)."""
    from berth_tools.bench.e2e_bench import PLACEMENTS, run_e2e

    if placement not in PLACEMENTS:
        raise typer.BadParameter(f"one of {', '.join(PLACEMENTS)}", param_hint="--placement")

    meter = None
    if endpoint_url:
        from berth_tools.localcloud.metering import read_meter

        def meter(reset: bool) -> dict[str, Any]:
            return read_meter(endpoint_url, reset=reset)

    batch_jobs = None
    if endpoint_url and placement == "cloud":
        import boto3

        from berth_tools.bench import batch_audit

        def batch_jobs() -> Counter[str]:
            session = boto3.Session(profile_name=profile) if profile else boto3.Session()
            return batch_audit.batch_job_names(session, endpoint_url, batch_audit.price_file_regions())

    previous_latency = None
    if aws_latency_ms:
        if not endpoint_url:
            raise typer.BadParameter("needs the local cloud's --endpoint-url", param_hint="--aws-latency-ms")
        from berth_tools.localcloud import aws_latency

        previous_latency = aws_latency.get_remote(endpoint_url)
        aws_latency.set_remote(endpoint_url, aws_latency_ms)
    with api_errors(output):
        try:
            report = run_e2e(
                lambda: client_for(api_url, profile),
                jobs,
                concurrency=concurrency,
                gpu_type=gpu_type,
                run_s=run_s,
                timeout_s=timeout_s,
                meter=meter,
                rate=rate,
                placement=placement,
                batch_jobs=batch_jobs,
                array_size=array_size,
                code_bundle=code_bundle,
            )
        finally:
            if previous_latency is not None and endpoint_url:
                aws_latency.set_remote(endpoint_url, previous_latency)
    if aws_latency_ms:
        report = {**report, "aws_latency_ms": aws_latency_ms}
    render(output, report, _table)


def pass_(
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=20_000)] = 1000,
    pending: Annotated[int, typer.Option("--pending", min=1, max=200_000)] = 10_000,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    template: Annotated[
        Path, typer.Option("--template", help="The synthesised template (make synth)")
    ] = Path("cdk.out/Berth.template.json"),
    aws_latency_ms: AwsLatencyOpt = 0.0,
    lambda_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--lambda-timeout",
            min=1,
            max=900,
            help="The pass's deadline is this timeout (default: the function's configured one)",
        ),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """One pass of the scheduler service over HOSTS hosts and PENDING queued jobs in the local cloud's
    DynamoDB: load, decide and apply times, AWS calls per placement and DynamoDB units per pass."""
    from berth_tools.bench.pass_bench import run_pass_bench

    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    report = run_pass_bench(template, hosts, pending, seed, aws_latency_ms, lambda_timeout_s)
    render(output, report, _table)


def replay(
    trace: Annotated[Path, typer.Option("--trace", exists=True, dir_okay=False, help="Trace CSV")],
    cluster: Annotated[
        Path, typer.Option("--cluster", exists=True, dir_okay=False, help="Cluster YAML (one pool)")
    ] = Path("examples/clusters/replay-a10g.yaml"),
    policy: Annotated[str, typer.Option("--policy", help="Policy name or file")] = "berth",
    factor: Annotated[
        float, typer.Option("--factor", min=1, help="Time compression of the service run")
    ] = 10.0,
    gpu_type: Annotated[
        str | None, typer.Option("--gpu-type", help="Run every trace job on this GPU model (the pool's)")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N jobs")] = None,
    work_dir: Annotated[
        Path | None, typer.Option("--work-dir", help="Where the local cloud's state and log go")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """One trace through `berth sim` and through the local cloud (real agents and local Batch, time
    compressed by FACTOR): where the GPU-hours went on each side, and the difference."""
    from dataclasses import replace as dc_replace

    from berth_tools.bench.replay import ReplayError, replay
    from berth_tools.sim.cluster import load_cluster
    from berth_tools.sim.policies import resolve_policy
    from berth_tools.sim.trace import load_trace

    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    try:
        jobs = load_trace(trace)[:limit]
        spec = load_cluster(cluster)
        pol = resolve_policy(policy)
        model = gpu_type or spec.pools[0].gpu_type if spec.pools else gpu_type
        if model:
            jobs = [dc_replace(j, gpu_type=model) for j in jobs]
        report = replay(jobs, spec, pol, factor, work_dir=work_dir)
    except (ReplayError, ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    render(output, report, _table)


def array(
    size: Annotated[int, typer.Option("-n", "--size", min=1, max=10_000, help="Tasks in the array")] = 10_000,
    gpu_type: Annotated[str, typer.Option("--gpu-type", help="GPU model of the tasks")] = "A100",
    timeout_s: Annotated[float, typer.Option("--timeout", min=1, help="Give up waiting after")] = 900.0,
    cancel_at_once: Annotated[
        bool,
        typer.Option(
            "--cancel-at-once", help="Cancel right after the submit: every task is created CANCELED"
        ),
    ] = False,
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url", envvar="AWS_ENDPOINT_URL", help="The local cloud's AWS endpoint, for its meter"
        ),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
    api_url: ApiUrlOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Submit one array of N tasks: time to accept it, to create every task, to bulk-cancel it; with
    the local cloud's meter, AWS calls of the submit and per task, and the cost per 1,000 tasks."""
    from berth_tools.bench.array_bench import run_array

    meter = None
    if endpoint_url:
        from berth_tools.localcloud.metering import read_meter

        def meter(reset: bool) -> dict[str, Any]:
            return read_meter(endpoint_url, reset=reset)

    with api_errors(output):
        report = run_array(
            lambda: client_for(api_url, profile),
            size,
            gpu_type=gpu_type,
            timeout_s=timeout_s,
            meter=meter,
            cancel_at_once=cancel_at_once,
        )
    render(output, report, _table)


def chaos(
    minutes: Annotated[
        float, typer.Option("--minutes", min=0.5, max=600, help="How long faults go on")
    ] = 10.0,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the workload and the fault plan")] = 1,
    agents: Annotated[int, typer.Option("--agents", min=1, max=16, help="On-prem hosts (2 GPUs each)")] = 4,
    jobs_per_minute: Annotated[float, typer.Option("--jobs-per-minute", min=0.5, max=600)] = 24.0,
    cloud_share: Annotated[float, typer.Option("--cloud-share", min=0, max=1)] = 0.2,
    detach_share: Annotated[
        float, typer.Option("--detach-share", min=0, max=1, help="Jobs that leave a detached process")
    ] = 0.2,
    kinds: Annotated[
        str | None, typer.Option("--kinds", help="Comma-separated fault kinds (default: all)")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Run a mixed workload on a fresh local cloud while injecting seeded faults; count jobs lost,
    run twice at once, GPUs double-booked, orphan processes and quota counters against the truth."""
    from berth_tools.bench.chaos_bench import Workload
    from berth_tools.bench.chaos_plan import ALL_KINDS
    from berth_tools.bench.chaos_run import run_on_fresh_local_cloud

    chosen = ALL_KINDS if kinds is None else tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = set(chosen) - set(ALL_KINDS)
    if unknown:
        raise typer.BadParameter(f"unknown {', '.join(sorted(unknown))}; kinds: {', '.join(ALL_KINDS)}")
    workload = Workload(jobs_per_minute=jobs_per_minute, cloud_share=cloud_share, detach_share=detach_share)
    report = run_on_fresh_local_cloud(
        minutes=minutes, seed=seed, agents=agents, workload=workload, kinds=chosen
    )
    render(output, report, _table)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("array")(array)
    bench_app.command("chaos")(chaos)
    bench_app.command("e2e")(e2e)
    bench_app.command("pass")(pass_)
    bench_app.command("replay")(replay)
