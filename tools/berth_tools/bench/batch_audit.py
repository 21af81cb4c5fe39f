"""Count the AWS Batch jobs of a benchmark's Berth jobs: how many Batch jobs each attempt got.

The dispatcher names every Batch job ``<job_id>-a<attempt>`` (docs/workflow.md, "The cloud branch"),
so one ListJobs per Berth queue (``berth-<region>-<family>-<ondemand|spot>``, found with DescribeJobQueues)
in every region of the price file, with a ``JOB_NAME`` filter (which makes ListJobs return every
status), shows whether an attempt was submitted once, never or more than once. Run it after reading
the meter: these calls are the benchmark's, not the control plane's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import boto3

#: The prefix of Berth's Batch queues (infra/berth_infra/batch.py).
QUEUE_PREFIX = "berth-"


def price_file_regions() -> list[str]:
    """Every region of the shipped price file (the default cloud regions, docs/cloud.md)."""
    from berth.pricing.catalog import catalog_text, parse_catalog

    return sorted({offer.region for offer in parse_catalog(catalog_text())})


def batch_job_names(
    session: boto3.session.Session, endpoint_url: str | None, regions: Iterable[str], prefix: str = ""
) -> Counter[str]:
    """How many Batch jobs carry each name (starting with ``prefix``) in Berth's queues of ``regions``."""
    names: Counter[str] = Counter()
    for region in regions:
        batch = session.client("batch", region_name=region, endpoint_url=endpoint_url)
        queues = [
            q["jobQueueName"]
            for page in batch.get_paginator("describe_job_queues").paginate()
            for q in page.get("jobQueues", [])
            if q["jobQueueName"].startswith(QUEUE_PREFIX)
        ]
        for queue in queues:
            pages = batch.get_paginator("list_jobs").paginate(
                jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [f"{prefix}*"]}]
            )
            for page in pages:
                names.update(j["jobName"] for j in page.get("jobSummaryList", []))
    return names


def audit(jobs: dict[str, dict[str, Any]], names: Counter[str]) -> dict[str, Any]:
    """Per Berth job (id -> its final record, ``attempts`` its attempt count): ``duplicated`` the jobs
    with an attempt submitted more than once, ``batch_jobs`` the Batch jobs of these jobs, and
    ``cloud_without_batch_job`` the jobs that ran in the cloud but have no Batch job for their last
    attempt."""
    duplicated = 0
    batch_jobs = 0
    missing = 0
    for job_id, job in jobs.items():
        attempts = max(1, int(job.get("attempts") or 1))
        counts = [names.get(f"{job_id}-a{n}", 0) for n in range(1, attempts + 1)]
        batch_jobs += sum(counts)
        if any(c > 1 for c in counts):
            duplicated += 1
        if job.get("site") == "cloud" and counts[-1] == 0:
            missing += 1
    return {"duplicated": duplicated, "batch_jobs": batch_jobs, "cloud_without_batch_job": missing}
