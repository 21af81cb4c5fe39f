"""`berth bench pass`: one scheduling pass of the real scheduler service over a large store.

It starts an embedded local cloud (the deployed template, no agents), writes ``--hosts`` registered
8-GPU hosts and ``--pending`` queued jobs through Berth's own repositories, and runs the scheduler
service exactly as its Lambda does (same code, the function's own environment) against moto's
DynamoDB: the time to load the snapshot, decide and apply is reported separately, with what was
placed and written, the AWS calls the pass made (by operation, and per placement) and the DynamoDB
units they cost, as the local cloud's meter counts them (``metering``).

The pass gets the deadline its Lambda would: the function's configured timeout (or
``lambda_timeout_s``, to measure the apply phase on a machine too loaded to load the snapshot in
time), counted from the start of the pass (``time_left``). ``aws_latency_ms`` adds that much
latency to every AWS call of the pass (``aws_latency``; the store is seeded without it), so the
figures show the design's cost at AWS latency rather than the emulator's. The pass's calls are served
in process (``moto_transport.in_process_clients``): the same SDK calls, without the loopback socket and
the server thread moto's werkzeug server starts for each of them (about 2.3 ms of CPU a call here,
under the GIL the pass's pool shares with the emulator).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from berth_tools.localcloud import aws_latency, metering
from berth_tools.localcloud.cloud import LocalCloud, load_template
from berth_tools.localcloud.moto_transport import in_process_clients
from berth_tools.localcloud.seed import host_gpu_ids, process_environment

MODELS = ("A100", "V100")
SHAPES = (1, 1, 1, 2, 2, 4, 8)
TENANTS = ("vision", "nlp")
#: The meter's tag of the pass's own calls (``metering.caller``), counted apart from the rest of the
#: local cloud's (the notifier's stream reads, event source polls).
PASS_CALLER = "scheduler-pass"
#: The access key the pass signs with (the seed's calls use the same; the meter is reset after it).
PASS_ACCESS_KEY = "bench"


def _function_environment(cloud: LocalCloud, name: str) -> dict[str, str]:
    lam = cloud.session().client("lambda", endpoint_url=cloud.endpoint_url)
    env = lam.get_function_configuration(FunctionName=name)["Environment"]["Variables"]
    # The pass asks for the next pass (deferred placements) on a queue of its own: on the deployed
    # trigger queue the local cloud would run the deployed function's pass beside the bench's second
    # one, both deciding the same jobs (the loser's transactions fail, safely, and it places nothing).
    sqs = cloud.session().client("sqs", endpoint_url=cloud.endpoint_url)
    trigger = sqs.create_queue(QueueName="berth-bench-pass-trigger")["QueueUrl"]
    return {
        **env,
        "BERTH_SCHEDULER_QUEUE_URL": trigger,
        # No executions park the seeded tokens: Step Functions refuses every answer, and re-answering
        # them after the local cloud's short orphan grace would fill the second pass with refusals.
        "BERTH_ORPHAN_GRACE_S": str(10**9),
        "AWS_ENDPOINT_URL": cloud.endpoint_url,
        "AWS_REGION": cloud.region,
        "AWS_DEFAULT_REGION": cloud.region,
        "AWS_ACCESS_KEY_ID": PASS_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": "bench",
        # The seeded jobs have no workflow executions; the pass must not start 10,000 of them.
        "BERTH_EXECUTION_REPAIR_S": str(10**9),
        # moto's Query walks and copies the whole table per page (BRIEF): on a loaded machine reading
        # 10,000 entries takes longer than the 10 s a pass gives itself on AWS; the emulator's cost
        # must not cut the read (what was not read is printed as ``not_considered``).
        "BERTH_QUEUE_READ_DEADLINE_S": "600",
    }


def _scheduler_function(cloud: LocalCloud) -> str:
    assert cloud.stack is not None
    for kind, physical in cloud.stack.resources.values():
        if kind == "AWS::Lambda::Function" and "SchedulerFunction" in physical:
            return physical
    raise RuntimeError("the deployed stack has no scheduler function")


def seed_store(hosts: int, pending: int, seed: int = 0) -> None:
    """Hosts and queued jobs through Berth's repositories (needs the scheduler's environment)."""
    from berth.dal.models import job_model
    from berth.domain.fleet import HostInventory
    from berth.domain.job import new_job, new_job_id
    from berth.domain.job_spec import JobSpec
    from berth.handlers.runtime import host_repository, job_repository
    from berth.handlers.settings import settings

    rng = random.Random(seed)
    lease = datetime.now(UTC) + timedelta(hours=1)
    repo = host_repository()
    for i in range(hosts):
        host_id = f"bench-{i:05d}"
        repo.register(
            HostInventory(
                host_id=host_id,
                pool=f"pool-{i // 250:02d}",
                gpu_type=MODELS[i % len(MODELS)],
                gpu_ids=host_gpu_ids(host_id, 8),
                cpu=96,
                memory_gib=768,
            ),
            lease,
        )
    jobs = job_repository()
    Row = job_model(settings().jobs_table)
    now = datetime.now(UTC)
    with Row.batch_write() as batch:
        for i in range(pending):
            gpus = rng.choice(SHAPES)
            spec = JobSpec.model_validate(
                {
                    "name": f"bench-pass-{i % 20}",
                    "image": "busybox",
                    "command": ["true"],
                    "resources": {
                        "gpu_type": MODELS[i % len(MODELS)],
                        "gpus": gpus,
                        "cpu": gpus,
                        "memory_gib": 8,
                    },
                    "constraints": {"placement": "onprem"},
                }
            )
            created = now - timedelta(seconds=pending - i)
            job, _ = new_job(new_job_id(created), TENANTS[i % len(TENANTS)], "bench", spec, created)
            # A parked placement token, as every queued job's execution has: the pass answers it
            # (Step Functions refuses it, there is no execution, but the call is made and metered).
            run = job.run.model_copy(update={"placement_token": f"bench-token-{i}"})
            batch.save(jobs._row(job.model_copy(update={"run": run})))
    # The tenants' active-job counters and directory key, as the jobs' own creation leaves them (the
    # pass reads the queue of each tenant with active jobs).
    from berth.dal.models import tenant_model

    Tenant = tenant_model(settings().tenants_table)
    for t, tenant in enumerate(TENANTS):
        count = len(range(t, pending, len(TENANTS)))
        Tenant("TENANT#" + tenant).update(actions=[Tenant.active_jobs.add(count), Tenant.directory.set("T")])


def _pass_meter(snapshot: dict[str, Any], placed: int) -> dict[str, Any]:
    """The meter's view of one pass: the pass's own calls by operation and per placement, and the
    DynamoDB units they cost (by table: every caller's, the pass being the only writer)."""
    mine = dict((snapshot.get("by_caller") or {}).get(PASS_CALLER, {}))
    read_units, write_units = mine.pop("dynamodb_read_units", 0.0), mine.pop("dynamodb_write_units", 0.0)
    emulator_s = mine.pop("emulator_s", 0.0)
    calls = {op: int(n) for op, n in sorted(mine.items())}
    total = sum(calls.values())
    per = {op: round(n / placed, 3) for op, n in calls.items()} if placed else {}
    per["total"] = round(total / placed, 3) if placed else float(total)
    # What applying one placement costs: its transaction and its token's answer.
    apply_calls = calls.get("dynamodb:TransactWriteItems", 0) + calls.get("states:SendTaskSuccess", 0)
    per["apply"] = round(apply_calls / placed, 3) if placed else 0.0
    dynamodb = snapshot["dynamodb"]
    return {
        "emulator_s": round(emulator_s, 2),
        "aws_calls": {**calls, "total": total},
        "aws_calls_per_placement": per,
        "dynamodb_read_units": round(read_units, 1),
        "dynamodb_write_units": round(write_units, 1),
        "dynamodb_units_by_table": {
            name.split("-", 1)[-1] if "/" not in name else name: {k: round(v, 1) for k, v in units.items()}
            for name, units in sorted(dynamodb["tables"].items())
        },
    }


def _metered_pass(run: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    metering.METER.reset()
    # The pass's calls reach the moto server's threads over HTTP, where its context is not seen:
    # its credentials name it.
    metering.METER.tag_access_key(PASS_ACCESS_KEY, PASS_CALLER)
    with metering.caller(PASS_CALLER):
        report = run()
    return report, _pass_meter(metering.METER.snapshot(), report.placed)


def _time_left(timeout_s: float) -> Callable[[], float]:
    """What ``LambdaContext.get_remaining_time_in_millis`` tells the handler, in seconds."""
    started = time.monotonic()
    return lambda: timeout_s - (time.monotonic() - started)


def run_pass_bench(
    template: Path,
    hosts: int,
    pending: int,
    seed: int = 0,
    aws_latency_ms: float = 0.0,
    lambda_timeout_s: float | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    with LocalCloud(
        template=load_template(template), agents=0, example_hosts=False, scheduled_rules=False
    ) as cloud:
        function = _scheduler_function(cloud)
        env = _function_environment(cloud, function)
        lam = cloud.session().client("lambda", endpoint_url=cloud.endpoint_url)
        configured_s = float(lam.get_function_configuration(FunctionName=function)["Timeout"])
        timeout_s = configured_s if lambda_timeout_s is None else lambda_timeout_s
        # The pass runs in the local cloud's own process: its SDK calls (and the seed's) are served in
        # process, without the loopback socket and the server thread per call (moto_transport); the
        # production code and its calls are the same, and each still waits the added AWS latency.
        with process_environment(env), in_process_clients(cloud.endpoint_url):
            t0 = time.perf_counter()
            seed_store(hosts, pending, seed)
            seeded_s = time.perf_counter() - t0
            from berth.handlers.runtime import scheduler_service

            previous = aws_latency.set_ms(aws_latency_ms)
            try:
                report, meter = _metered_pass(
                    lambda: scheduler_service().run_pass(time_left=_time_left(timeout_s))
                )
                second, second_meter = _metered_pass(
                    lambda: scheduler_service().run_pass(time_left=_time_left(timeout_s))
                )
            finally:
                aws_latency.set_ms(previous)
    out = report.as_dict()
    out.pop("lost_hosts", None)
    return {
        "hosts": hosts,
        "pending_jobs": pending,
        "aws_latency_ms": aws_latency_ms,
        "transport": "in-process",
        "lambda_timeout_s": timeout_s,
        "configured_timeout_s": configured_s,
        "load_s": out.pop("load_s"),
        "decide_s": out.pop("decide_s"),
        "apply_s": out.pop("apply_s"),
        "pass_s": round(report.load_s + report.decide_s + report.apply_s, 3),
        # moto serves the pass's calls in this process, under the GIL the pass's pool needs too: the
        # wall time it was serving any of them (the added latency not in it) taken off the pass. What
        # the pass would take with an emulator that cost nothing: a bound on the design at AWS
        # latency (a faster emulator would also have freed the pool's CPU), printed beside the
        # measured figure, never instead of it.
        "pass_s_less_emulator_bound": round(
            max(report.load_s + report.decide_s + report.apply_s - meter["emulator_s"], 0.0), 3
        ),
        **out,
        **meter,
        "second_pass_s": round(second.load_s + second.decide_s + second.apply_s, 3),
        "second_pass_placed": second.placed,
        "second_pass_deferred": second.deferred,
        "second_pass_aws_calls": second_meter["aws_calls"],
        "seed_s": round(seeded_s, 2),
        "wall_s": round(time.monotonic() - started, 2),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
