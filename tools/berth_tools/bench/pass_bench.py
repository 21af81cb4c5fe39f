"""`berth bench pass`: one scheduling pass of the real scheduler service over a large store.

It starts an embedded local cloud (the deployed template, no agents), writes ``--hosts`` registered
8-GPU hosts and ``--pending`` queued jobs through Berth's own repositories, and runs the scheduler
service exactly as its Lambda does (same code, the function's own environment) against moto's
DynamoDB: the time to load the snapshot, decide and apply is reported separately, with what was
placed and written.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from berth_tools.localcloud.cloud import LocalCloud, load_template
from berth_tools.localcloud.seed import host_gpu_ids, process_environment

MODELS = ("A100", "V100")
SHAPES = (1, 1, 1, 2, 2, 4, 8)
TENANTS = ("vision", "nlp")


def _function_environment(cloud: LocalCloud, name: str) -> dict[str, str]:
    lam = cloud.session().client("lambda", endpoint_url=cloud.endpoint_url)
    env = lam.get_function_configuration(FunctionName=name)["Environment"]["Variables"]
    return {
        **env,
        "AWS_ENDPOINT_URL": cloud.endpoint_url,
        "AWS_REGION": cloud.region,
        "AWS_DEFAULT_REGION": cloud.region,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        # The seeded jobs have no workflow executions; the pass must not start 10,000 of them.
        "BERTH_EXECUTION_REPAIR_S": str(10**9),
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
            batch.save(jobs._row(job))


def run_pass_bench(template: Path, hosts: int, pending: int, seed: int = 0) -> dict[str, Any]:
    started = time.monotonic()
    with LocalCloud(
        template=load_template(template), agents=0, example_hosts=False, scheduled_rules=False
    ) as cloud:
        env = _function_environment(cloud, _scheduler_function(cloud))
        with process_environment(env):
            t0 = time.perf_counter()
            seed_store(hosts, pending, seed)
            seeded_s = time.perf_counter() - t0
            from berth.handlers.runtime import scheduler_service

            report = scheduler_service().run_pass()
            second = scheduler_service().run_pass()
    out = report.as_dict()
    out.pop("lost_hosts", None)
    return {
        "hosts": hosts,
        "pending_jobs": pending,
        "load_s": out.pop("load_s"),
        "decide_s": out.pop("decide_s"),
        "apply_s": out.pop("apply_s"),
        "pass_s": round(report.load_s + report.decide_s + report.apply_s, 3),
        **out,
        "second_pass_s": round(second.load_s + second.decide_s + second.apply_s, 3),
        "second_pass_placed": second.placed,
        "seed_s": round(seeded_s, 2),
        "wall_s": round(time.monotonic() - started, 2),
    }
