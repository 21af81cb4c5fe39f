"""Count the AWS Batch jobs of a benchmark's Berth jobs: how many Batch jobs each attempt got.

The dispatcher names every Batch job ``<job_id>-a<attempt>`` (docs/workflow.md, "The cloud branch"),
or, for array tasks grouped into one Batch array job, ``<array id>_<first>-<last>-g<attempt>``,
so one ListJobs per Berth queue (``berth-<region>-<family>_<size>-<ondemand|spot>``, found with
DescribeJobQueues) in every region of the price file, with a ``JOB_NAME`` filter (which makes
ListJobs return every status), shows whether an attempt was submitted once, never or more than
once. Run it after reading the meter: these calls are the benchmark's, not the control plane's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import boto3

from berth.domain.arrays import parse_task_id
from berth.domain.cloud import batch_group_name, batch_job_name
from berth.domain.placement import BatchGroup

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
                # an array job's children share its name (only an emulator lists them here)
                names.update(j["jobName"] for j in page.get("jobSummaryList", []) if ":" not in j["jobId"])
    return names


def audit(jobs: dict[str, dict[str, Any]], names: Counter[str]) -> dict[str, Any]:
    """Per Berth job (id -> its final record, ``attempts`` its attempt count): ``duplicated`` the jobs
    with an attempt submitted more than once, ``batch_jobs`` the Batch jobs of these jobs, and
    ``cloud_without_batch_job`` the jobs that ran in the cloud but have no Batch job for their last
    attempt."""
    duplicated = 0
    missing = 0
    seen: set[str] = set()
    for job_id, job in jobs.items():
        attempts = max(1, int(job.get("attempts") or 1))
        expected = [batch_job_name(job_id, n) for n in range(1, attempts + 1)]
        group = (job.get("placement") or {}).get("group")
        array = parse_task_id(job_id)
        if group and array:  # the last attempt ran as a child of its group's array job
            expected[-1] = batch_group_name(array[0], BatchGroup.model_validate(group), attempts)
        counts = [names.get(n, 0) for n in expected]
        seen.update(expected)
        if any(c > 1 for c in counts):
            duplicated += 1
        if job.get("site") == "cloud" and counts[-1] == 0:
            missing += 1
    return {
        "duplicated": duplicated,
        "batch_jobs": sum(names.get(n, 0) for n in seen),
        "cloud_without_batch_job": missing,
    }
