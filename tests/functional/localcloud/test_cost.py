"""Cost accounting on the local cloud (the real template, the real state machine, scripted agents):
a running job accrues ``cost_usd`` and publishes it in its events, ``max_cost_usd`` stops a job
(FAILED, ``CostLimit``, not retried), the usage route sums the ledger, and a spent monthly cloud
budget keeps a tenant's jobs from bursting.

The on-prem rate is set high through the stored policy (``accounting``) so that seconds of a
scripted job cost dollars."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from berth_tools.localcloud.cloud import LocalCloud, load_template

from .conftest import REAL_TEMPLATE
from .test_real_template import _cold_start_handlers
from .test_workflow import TERMINAL, TIMINGS, Hosts, spec, status_in, submit, transitions, wait_for

pytestmark = pytest.mark.usefixtures("real_template")  # missing: an error that says `make synth`

#: 360 USD per GPU-hour: 0.1 USD per GPU-second; costs are written at every pass.
ACCOUNTING = {"onprem_usd_per_gpu_hour": 360.0, "accrual_step_usd": 0.01, "accrual_interval_s": 0.0}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    _cold_start_handlers()
    with LocalCloud(
        template=load_template(REAL_TEMPLATE),
        state_dir=tmp_path_factory.mktemp("state"),
        # Cloud offers on (no cloud dispatcher yet: the budget test never lets a job reach it).
        function_timings={**TIMINGS, "BERTH_CLOUD_ENABLED": "true"},
        timer_interval_s=1.0,
        example_hosts=False,
    ) as lc:
        status, current = lc.request("GET", "/v1/policy", "admin")
        assert status == 200 and isinstance(current, dict), current
        policy = {**current["document"], "accounting": ACCOUNTING}
        status, stored = lc.request("PUT", "/v1/policy", "admin", policy)
        assert status == 200, stored
        yield lc
    _cold_start_handlers()


@pytest.fixture
def hosts(cloud: LocalCloud, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    h = Hosts(cloud, request.node.name.replace("test_", "")[:24].replace("_", "-"))
    yield h
    h.close()


def _bus_events(cloud: LocalCloud, job_id: str, want: int, timeout: float = 15) -> list[dict[str, Any]]:
    sqs = cloud.session().client("sqs", endpoint_url=cloud.endpoint_url)
    queue = cloud.output("JobEventsQueueUrl")
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        for m in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            detail = json.loads(m["Body"])["detail"]
            if detail["job_id"] == job_id:
                seen.append(detail)
    return sorted(seen, key=lambda d: d["seq"])


def test_a_running_job_accrues_cost_and_publishes_it(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(1)
    job_id = submit(cloud, spec(gpus=2, env={"SCRIPTED_RUN_S": "6"}))
    running = wait_for(cloud, job_id, lambda j: j["status"] == "RUNNING" and j["cost_usd"] > 0)
    assert running["placement"]["hourly_usd"] == 720.0  # 2 GPUs at the policy's internal rate
    done = wait_for(cloud, job_id, status_in(*TERMINAL))
    assert done["status"] == "COMPLETED"
    # 6 s and more at 0.2 USD/s (the scripted run, then its report and the workflow's finalize)
    assert 1.0 <= done["cost_usd"] <= 6.0, done["cost_usd"]
    details = _bus_events(cloud, job_id, want=4)
    assert [d["to"] for d in details] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert details[-1]["cost_usd"] == done["cost_usd"]

    status, usage = cloud.request("GET", "/v1/tenants/vision/usage", "alice")
    assert status == 200 and isinstance(usage, dict), usage
    onprem = {s["site"]: s for s in usage["sites"]}["onprem"]
    assert onprem["cost_usd"] >= done["cost_usd"] - 1e-6 and onprem["gpu_hours"] > 0


def test_max_cost_usd_stops_a_job_for_good(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(1)
    body = spec(gpus=1, env={"SCRIPTED_RUN_S": "120"})
    body["constraints"] = {"max_cost_usd": 2.0}
    body["retry"] = {"max_attempts": 3}
    job_id = submit(cloud, body)
    done = wait_for(cloud, job_id, status_in(*TERMINAL), timeout=60)
    assert done["status"] == "FAILED" and done["attempts"] == 1, done
    assert done["reason"].startswith("CostLimit (permanent): cost limit max_cost_usd=2.00 reached"), done
    assert 0.5 <= done["cost_usd"] <= 2.0, done["cost_usd"]  # stopped before it would exceed 2 USD
    assert transitions(cloud, job_id) == ["QUEUED", "STARTING", "RUNNING", "FAILED"]
    assert any(e[0] == "failed" and e[1] == job_id for e in hosts.agents[0].log)  # the host stopped it


def test_a_spent_budget_blocks_bursting(cloud: LocalCloud, hosts: Hosts) -> None:
    # The tenant's month already holds 100 USD of cloud use (a record in the ledger, as a cloud
    # job's attempt writes it), and its budget is 100 USD.
    month = datetime.now(UTC).strftime("%Y-%m")
    usage = (
        cloud.session()
        .resource("dynamodb", endpoint_url=cloud.endpoint_url)
        .Table(cloud.output("UsageTableName"))
    )
    usage.put_item(
        Item={
            "pk": f"nlp#{month}",
            "sk": "j-earlier#0001",
            "tenant": "nlp",
            "month": month,
            "job_id": "j-earlier",
            "attempt": 1,
            "site": "cloud",
            "location": "us-east-1",
            "gpus": 8,
            "seconds": 3600,
            "hourly_usd": 100,
            "final": True,
        }
    )
    status, _ = cloud.request("PUT", "/v1/tenants/nlp/quota", "admin", {"monthly_cloud_budget_usd": 100.0})
    assert status == 200
    status, left = cloud.request("GET", "/v1/usage", "bob")
    assert status == 200 and isinstance(left, dict)
    assert left["cloud_cost_usd"] == 100.0 and left["budget_left_usd"] == 0.0

    body = spec(gpus=1)
    body["constraints"] = {"placement": "cloud"}
    body["expected_duration_minutes"] = 60
    status, job = cloud.request("POST", "/v1/jobs", "bob", body)
    assert status == 201, job  # feasible (the budget may be raised or the month end): it waits
    assert isinstance(job, dict)
    job_id = str(job["id"])
    deadline = time.monotonic() + 20
    while True:
        status, current = cloud.request("GET", f"/v1/jobs/{job_id}", "bob")
        assert status == 200 and isinstance(current, dict)
        if "tenant.monthly_budget_usd" in current["reason"]:
            break
        assert time.monotonic() < deadline, current
        time.sleep(0.25)
    assert current["status"] == "QUEUED" and current["placement"] is None
    status, why = cloud.request("GET", f"/v1/jobs/{job_id}/explain", "bob")
    assert status == 200 and isinstance(why, dict)
    assert "tenant.monthly_budget_usd" in why["explanation"]["rules"]
    cloud.request("POST", f"/v1/jobs/{job_id}/cancel", "bob")
