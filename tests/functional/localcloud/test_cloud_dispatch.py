"""The cloud branch through the real template on the local cloud: the state machine's DispatchCloud
task, the FIFO submit queue and BatchSubmitFunction, the regional Batch stacks the local cloud
deploys and its local Batch (jobs run as processes, their state changes come back through
EventBridge), and a region whose Batch API is down (its submits fail, the job goes elsewhere and the
circuit opens)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from berth_tools.localcloud import faults
from berth_tools.localcloud.cloud import LOCAL_TIMINGS, LocalCloud, load_batch_templates, load_template

from .conftest import REAL_TEMPLATE
from .test_real_template import _cold_start_handlers
from .test_workflow import job, status_in, submit, transitions, wait_for

pytestmark = pytest.mark.usefixtures("real_template")  # missing: an error that says `make synth`


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    _cold_start_handlers()
    with LocalCloud(
        template=load_template(REAL_TEMPLATE),
        batch_templates=load_batch_templates(REAL_TEMPLATE),
        state_dir=tmp_path_factory.mktemp("state"),
        function_timings={
            **LOCAL_TIMINGS,
            "BERTH_CLOUD_ENABLED": "true",
            "BERTH_BACKOFF_BASE_S": "1",
            "BERTH_BACKOFF_CAP_S": "1",
        },
        timer_interval_s=1.0,
        example_hosts=False,
    ) as lc:
        # The local cloud deployed Berth's Batch stacks (both queues in each region of the price file)
        # and runs their jobs as processes; us-west-2's Batch API is down (every call answers 503, as in
        # a region whose API fails).
        faults.FAULTS.apply({"kind": "region-outage", "region": "us-west-2"})
        try:
            yield lc
        finally:
            faults.FAULTS.clear()
    _cold_start_handlers()


def _cloud_spec(**constraints: Any) -> dict[str, Any]:
    return {
        "name": "burst",
        "image": "python:3.11",
        "command": ["python3", "-c", "print(1)"],
        "resources": {"gpu_type": "A10G", "gpus": 1},
        "constraints": {"placement": "cloud", "spot": "never", **constraints},
    }


def test_a_cloud_job_is_submitted_to_batch_and_completes(cloud: LocalCloud) -> None:
    job_id = submit(cloud, _cloud_spec(regions=["us-east-1"]))
    done = wait_for(cloud, job_id, status_in("COMPLETED", "FAILED"), timeout=60)
    assert done["status"] == "COMPLETED", done
    assert done["site"] == "cloud" and done["placement"]["region"] == "us-east-1"
    assert transitions(cloud, job_id) == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    batch = cloud.session().client("batch", endpoint_url=cloud.endpoint_url, region_name="us-east-1")
    # The queue of the instance type it was priced on (issue 23): g5.xlarge, the cheapest A10G.
    assert done["placement"]["instance_type"] == "g5.xlarge"
    assert done["placement"]["queue"] == "berth-us-east-1-g5_xlarge-ondemand", done["placement"]
    listed = batch.list_jobs(
        jobQueue="berth-us-east-1-g5_xlarge-ondemand",
        filters=[{"name": "JOB_NAME", "values": [f"{job_id}-a1"]}],
    )["jobSummaryList"]
    assert len(listed) == 1  # submitted exactly once
    # Its output is served from the stream AWS Batch named (DescribeJobs' container.logStreamName).
    described = batch.describe_jobs(jobs=[listed[0]["jobId"]])["jobs"][0]
    stream = described["container"]["logStreamName"]
    assert re.fullmatch(r"batch/default/[0-9a-f]{32}", stream), stream
    status, page = cloud.request("GET", f"/v1/jobs/{job_id}/logs", "alice")
    assert status == 200 and isinstance(page, dict), page
    assert [e["message"] for e in page["events"]] == ["1"] and page["reason"] is None, page
    logs = cloud.session().client("logs", endpoint_url=cloud.endpoint_url, region_name="us-east-1")
    direct = logs.get_log_events(logGroupName="/berth/jobs/vision", logStreamName=stream, startFromHead=True)
    assert [e["message"] for e in direct["events"]] == ["1"]
    status, other = cloud.request("GET", f"/v1/jobs/{job_id}/logs", "bob")
    assert status == 404, other


def test_logs_of_a_cloud_job_waiting_for_capacity_are_empty_with_a_reason(cloud: LocalCloud) -> None:
    faults.FAULTS.apply({"kind": "capacity", "region": "us-east-1", "instance_type": "g5"})
    try:
        job_id = submit(cloud, _cloud_spec(regions=["us-east-1"]))
        wait_for(cloud, job_id, lambda j: j["status"] == "STARTING" and j["site"] == "cloud", timeout=30)
        status, page = cloud.request("GET", f"/v1/jobs/{job_id}/logs", "alice")
        assert status == 200 and isinstance(page, dict), page
        assert page["events"] == [] and page["next_token"] is None and page["status"] == "STARTING", page
        assert "AWS Batch names the log stream" in page["reason"], page
        # Batch's capacity reason (the local Batch gives it after a few seconds) is the job's reason
        # and in its events while it waits (finding 9)
        waiting = wait_for(
            cloud, job_id, lambda j: "INSUFFICIENT_INSTANCE_CAPACITY" in j["reason"], timeout=30
        )
        assert waiting["status"] == "STARTING" and "waiting for an instance in us-east-1" in waiting["reason"]
        _, events = cloud.request("GET", f"/v1/jobs/{job_id}/events", "alice")
        assert any("INSUFFICIENT_INSTANCE_CAPACITY" in e["reason"] for e in events["events"]), events
    finally:
        faults.FAULTS.clear()
        faults.FAULTS.apply({"kind": "region-outage", "region": "us-west-2"})  # the module's standing fault
    done = wait_for(cloud, job_id, status_in("COMPLETED", "FAILED"), timeout=60)
    assert done["status"] == "COMPLETED", done
    status, page = cloud.request("GET", f"/v1/jobs/{job_id}/logs", "alice")
    assert status == 200 and [e["message"] for e in page["events"]] == ["1"], page


def test_a_region_without_batch_fails_over_and_opens_its_circuit(cloud: LocalCloud) -> None:
    # us-west-2 is the only region allowed at first: its Batch API is down, every submit fails.
    ids = [submit(cloud, _cloud_spec(regions=["us-west-2"])) for _ in range(3)]
    for job_id in ids:
        # Its attempt failed (RETRYING, briefly), and it waits again with us-west-2 avoided, or failed.
        wait_for(
            cloud,
            job_id,
            lambda j: j["attempts"] >= 1 and j["status"] in ("RETRYING", "QUEUED", "FAILED"),
            60,
        )
    status, capacity = cloud.request("GET", "/v1/capacity", "alice")
    assert status == 200 and isinstance(capacity, dict)
    rows = {r["region"]: r for r in capacity["cloud"]["regions"]}
    assert rows["us-west-2"]["circuit"] == "open", rows["us-west-2"]
    assert rows["us-east-1"]["circuit"] == "closed"
    # A job free to go anywhere avoids the open region.
    other = submit(cloud, _cloud_spec())
    done = wait_for(cloud, other, status_in("COMPLETED", "FAILED"), timeout=60)
    assert done["status"] == "COMPLETED" and done["placement"]["region"] != "us-west-2", done
    for job_id in ids:
        cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "alice")
    assert job(cloud, ids[0])["attempts"] >= 1


def test_compute_environments_are_per_instance_type_so_one_familys_shortage_spares_the_others(
    cloud: LocalCloud,
) -> None:
    """Issues 11 and 23: each queue's compute environment holds one instance type. With no g5 (A10G)
    capacity in us-east-1, an A10G job waits RUNNABLE in ``berth-us-east-1-g5_xlarge-ondemand``, while
    an A100 job in the same region runs in ``berth-us-east-1-p4d_24xlarge-ondemand`` (a mixed compute
    environment would have started the A10G job on whatever instance it found)."""
    g5 = "berth-us-east-1-g5_xlarge-ondemand"
    batch = cloud.session().client("batch", endpoint_url=cloud.endpoint_url, region_name="us-east-1")

    def batch_status(queue: str, job_id: str) -> list[str]:
        listed = batch.list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [f"{job_id}-a1"]}])
        return [j["status"] for j in listed["jobSummaryList"]]

    faults.FAULTS.apply({"kind": "capacity", "region": "us-east-1", "instance_type": "g5"})
    try:
        a10g = submit(cloud, _cloud_spec(regions=["us-east-1"]))
        a100 = submit(
            cloud, {**_cloud_spec(regions=["us-east-1"]), "resources": {"gpu_type": "A100", "gpus": 1}}
        )
        done = wait_for(cloud, a100, status_in("COMPLETED", "FAILED"), timeout=60)
        assert done["status"] == "COMPLETED", done
        assert done["placement"]["queue"] == "berth-us-east-1-p4d_24xlarge-ondemand", done["placement"]
        assert done["placement"]["instance_type"] == "p4d.24xlarge"
        deadline = time.monotonic() + 20
        while batch_status(g5, a10g) != ["RUNNABLE"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert batch_status(g5, a10g) == ["RUNNABLE"]
        time.sleep(1)  # and it stays there
        waiting = job(cloud, a10g)
        assert waiting["status"] == "STARTING", waiting
        assert waiting["placement"]["queue"] == g5, waiting["placement"]
        assert batch_status(g5, a10g) == ["RUNNABLE"]
    finally:
        faults.FAULTS.clear()
        faults.FAULTS.apply({"kind": "region-outage", "region": "us-west-2"})  # the module's fault
    done = wait_for(cloud, a10g, status_in("COMPLETED", "FAILED"), timeout=60)
    assert done["status"] == "COMPLETED" and done["attempts"] == 1, done
    assert batch_status(g5, a10g) == ["SUCCEEDED"]


def test_a_command_that_does_not_exist_fails_the_job_and_no_circuit(cloud: LocalCloud) -> None:
    """Finding 9, as reported: a cloud job whose command does not exist cannot start its container
    (``CannotStartContainerError``). That is the job's mistake: it fails at once as ``BadImage``
    (permanent, one attempt) and no circuit hears of it, so every other team keeps the region."""
    spec = {**_cloud_spec(regions=["us-east-1"]), "command": ["berth-no-such-command"]}
    job_id = submit(cloud, spec)
    done = wait_for(
        cloud,
        job_id,
        lambda j: (
            j["status"] in ("COMPLETED", "FAILED", "RETRYING") or (j["status"] == "QUEUED" and j["attempts"])
        ),
        timeout=60,
    )
    _, evs = cloud.request("GET", f"/v1/jobs/{job_id}/events", "alice")
    assert done["status"] == "FAILED" and done["attempts"] == 1, (done, evs)
    assert done["reason"].startswith("BadImage (permanent)") and "CannotStartContainerError" in done["reason"]
    status, circuits = cloud.request("GET", "/v1/circuits", "admin")
    assert status == 200 and isinstance(circuits, dict), circuits
    east = [c for c in circuits["circuits"] if c["region"] == "us-east-1" and c["recent_failures"]]
    assert east == [], east
