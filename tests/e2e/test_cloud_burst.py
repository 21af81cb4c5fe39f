"""A burst of cloud jobs through the Batch submit throttle (issue 11): its own `berth local up` with a
low submit rate (`--function-env BERTH_BATCH_SUBMIT_RATE=1.5`, one submit instance), 60
`placement: cloud` jobs submitted at once; every one COMPLETES in the cloud, each attempt has exactly
one Batch job (ListJobs by name in every region), every task token is answered once, the events
function reads Batch once per batch of events (the local cloud's meter), and the SubmitJobs are
spread over time as the rate allows. `berth bench e2e --placement cloud` is the long form
(docs/operations.md)."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3

from berth_tools.bench.batch_audit import price_file_regions
from berth_tools.localcloud.metering import read_meter

JOBS = 60
#: Batch calls a second over all submit instances: below the API's intake here, so the burst queues
#: behind the throttle (one instance: the whole rate, a bucket of SUBMIT_RATE tokens).
SUBMIT_RATE = 1.5


def _spec(i: int) -> dict[str, Any]:
    return {
        "name": f"burst-{i}",
        "image": "busybox",
        "command": ["true"],
        "resources": {"gpu_type": "A10G", "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "cloud"},
        "timeout_minutes": 10,
    }


def test_a_burst_of_cloud_jobs_through_the_submit_throttle_loses_none_and_submits_each_once(
    start_local_cloud: Any, tmp_path: Path
) -> None:
    cloud = start_local_cloud(
        tmp_path / "state",
        "--agents",
        "0",
        "--quiet",
        "--function-env",
        f"BERTH_BATCH_SUBMIT_RATE={SUBMIT_RATE}",
        "--function-env",
        "BERTH_BATCH_SUBMIT_CONCURRENCY=1",
    )
    alice = cloud.client("alice")

    def submit(i: int) -> str:
        for _ in range(20):  # the tenant's API rate limit answers 429: try again
            r = alice.post("/v1/jobs", json=_spec(i))
            if r.status != 429:
                break
            time.sleep(0.5)
        assert r.status == 201, r.text
        return str(r.json()["id"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = list(pool.map(submit, range(JOBS)))
    assert len(set(ids)) == JOBS

    deadline = time.monotonic() + 75
    final: dict[str, dict[str, Any]] = {}
    while len(final) < JOBS and time.monotonic() < deadline:
        for job_id in ids:
            if job_id not in final:
                r = alice.get(f"/v1/jobs/{job_id}")
                if r.status == 429:  # the tenant's API rate limit: read it on the next round
                    continue
                assert r.status == 200, r.text
                job = r.json()
                if job["status"] in ("COMPLETED", "FAILED", "CANCELED"):
                    final[job_id] = job
        time.sleep(0.5)
    statuses = Counter(j["status"] for j in final.values())
    assert statuses == {"COMPLETED": JOBS}, (statuses, JOBS - len(final), cloud.log_tail())
    assert all(j["site"] == "cloud" for j in final.values())

    creds = cloud.credentials("admin")
    session = boto3.Session(
        aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key, region_name=cloud.region
    )
    names: Counter[str] = Counter()
    created: list[int] = []
    for region in price_file_regions():
        batch = session.client("batch", region_name=region, endpoint_url=cloud.env["AWS_ENDPOINT_URL"])
        for queue in batch.describe_job_queues()["jobQueues"]:
            if not queue["jobQueueName"].startswith("berth-"):
                continue
            listed = batch.list_jobs(
                jobQueue=queue["jobQueueName"], filters=[{"name": "JOB_NAME", "values": ["*"]}]
            )["jobSummaryList"]
            names.update(j["jobName"] for j in listed)
            created += [int(j["createdAt"]) for j in listed]
    expected = {f"{job_id}-a{final[job_id]['attempts']}" for job_id in ids}
    assert {n: c for n, c in names.items() if c > 1} == {}, "an attempt was submitted twice"
    assert set(names) >= expected and sum(names[n] for n in expected) == JOBS
    assert sum(int(final[j]["attempts"]) for j in ids) == JOBS, "a job needed a second attempt"
    # Calls per job (the local cloud's meter, by the signing function): no dispatch token answered
    # twice by the events (the sweep leaves a fresh outcome to its event; before, early events read
    # after the outcome answered 45 more; every job COMPLETED, so each was answered), and the events
    # function reads Batch once per SQS batch of events, not once per event (it was six DescribeJobs
    # a job before the rules forwarded only RUNNING, SUCCEEDED and FAILED). The scheduler's placement
    # answers are not counted: a placement whose dispatch is slower than the local orphan grace
    # (10 s) is answered again, by design (Step Functions refuses the second answer).
    by_caller = read_meter(cloud.env["AWS_ENDPOINT_URL"])["meter"]["requests_by_caller"]
    (events_fn,) = [c for name, c in by_caller.items() if "BatchEventsFunction" in name]
    assert events_fn["states"]["SendTaskSuccess"] <= JOBS, events_fn  # never twice (was 105 for 60)
    assert events_fn["batch"]["POST /v1/describejobs"] <= JOBS / 2, events_fn
    # The throttle: SUBMIT_RATE a second, a bucket of SUBMIT_RATE, so the SubmitJobs take at least
    # (JOBS - SUBMIT_RATE) / SUBMIT_RATE = 39 s, longer than the API takes the 60 jobs in (about 27 s
    # on the 2-core VM under load): without the throttle they would follow the intake.
    span_s = (max(created) - min(created)) / 1000
    intake = sorted(_ts(j["created_at"]) for j in final.values())
    print(f"API intake {intake[-1] - intake[0]:.1f} s, SubmitJobs {span_s:.1f} s")  # (pytest -s)
    assert span_s >= 0.9 * (JOBS - SUBMIT_RATE) / SUBMIT_RATE, span_s


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
