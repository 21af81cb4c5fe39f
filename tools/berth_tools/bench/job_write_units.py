"""DynamoDB write units of one job's life, metered by the local cloud (``metering.METER``).

``python -m berth_tools.bench.job_write_units [N]`` deploys the stack's template into an embedded
local cloud and takes N jobs through the repository writes the services make: created (the API's
transaction), its execution parks a placement token, the pass writes its waiting reason once, places
it (STARTING), it runs (RUNNING), accrues cost twice, completes. It prints the write units per job,
by table and index (``table/index``): what the index projections cost, independent of the machine.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from berth_tools.bench.pass_bench import _function_environment, _scheduler_function
from berth_tools.localcloud.cloud import LocalCloud, load_template
from berth_tools.localcloud.metering import METER
from berth_tools.localcloud.seed import process_environment

SPEC: dict[str, Any] = {
    "name": "train-resnet",
    "image": "ghcr.io/acme/train:1.2",
    "command": ["python", "train.py", "--epochs", "90", "--lr", "0.1"],
    "env": {"WANDB_PROJECT": "vision", "BATCH": "256"},
    "data": [{"source": "s3://berth-data/vision/imagenet/", "mount": "/data"}],
    "resources": {"gpu_type": "A100", "gpus": 4, "cpu": 16, "memory_gib": 64},
    "constraints": {"max_cost_usd": 50},
    "expected_duration_minutes": 120,
}


def _lifecycles(n: int) -> None:
    from berth.domain.job import new_job, new_job_id
    from berth.domain.job_spec import JobSpec
    from berth.domain.placement import HostGpus, OnPremPlacement, Site
    from berth.domain.queue import queue_entry
    from berth.domain.status import JobStatus as S
    from berth.handlers.runtime import job_repository

    repo = job_repository()
    spec = JobSpec.model_validate(SPEC)
    now = datetime.now(UTC)
    gpus = ("GPU-a", "GPU-b", "GPU-c", "GPU-d")
    where = OnPremPlacement(pool="p", gpu_type="A100", hosts=(HostGpus(host_id="h1", gpus=4, gpu_ids=gpus),))
    for i in range(n):
        t = now + timedelta(milliseconds=i)
        job, ev = new_job(new_job_id(t), "vision", "arn:aws:iam::123456789012:user/alice", spec, t)
        repo.create(job, ev, max_active=10**6)
        job = job.updated(t, run=job.run.model_copy(update={"placement_token": "tok-" + "x" * 600}))
        repo.update(job)
        reason = "waiting for placement (capacity): on-prem: no room of 4 x A100 now"
        repo.set_reason(queue_entry(job), reason)
        job = job.model_copy(update={"reason": reason})
        job, ev = job.transition(
            S.STARTING, "placed on-prem pool p: h1 (4)", t, site=Site.ONPREM, placement=where
        )
        repo.save(job, ev)
        job, ev = job.transition(S.RUNNING, "running on h1", t)
        repo.save(job, ev)
        for cost in (1.5, 3.0):
            job = job.updated(t, cost_usd=cost)
            repo.update(job)
        job, ev = job.transition(S.COMPLETED, "exit 0", t)
        repo.save(job, ev)


def main(n: int = 50, template: Path = Path("cdk.out/Berth.template.json")) -> dict[str, Any]:
    cloud = LocalCloud(template=load_template(template), agents=0, example_hosts=False, scheduled_rules=False)
    with cloud, process_environment(_function_environment(cloud, _scheduler_function(cloud))):
        METER.reset()
        _lifecycles(n)
        snap = METER.snapshot()["dynamodb"]
    by_table = {
        name.split("-", 1)[1] if "-" in name else name: round(units["write_units"] / n, 2)
        for name, units in sorted(snap["tables"].items())
        if units["write_units"]
    }
    return {"jobs": n, "write_units_per_job": round(snap["write_units"] / n, 2), "by_table": by_table}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50), indent=1))
