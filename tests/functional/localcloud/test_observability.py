"""Logs and metrics through the local cloud's front door and the deployed template: a host sends
usage samples for its attempt (fenced like a report), the job's owner reads them and the attempt's
CloudWatch Logs stream; another tenant gets 404, exactly as for ``GET /v1/jobs/{id}``."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from berth_tools.localcloud.cloud import LocalCloud
from berth_tools.localcloud.scripted_agent import AgentApiError

from .test_workflow import Hosts, cloud, hosts, spec, status_in, submit, wait_for

__all__ = ["cloud", "hosts"]  # the fixtures, shared with the workflow tests' module


def _sample(at: datetime, util: float, cpu: float = 50.0) -> dict[str, Any]:
    return {
        "at": at.isoformat(),
        "cpu_pct": cpu,
        "rss_mib": 256.0,
        "processes": 1,
        "gpus": [{"uuid": "GPU-sim-0", "utilization_pct": util, "memory_used_mib": 2048}],
    }


def _get(cloud: LocalCloud, path: str, who: str = "alice", **query: Any) -> tuple[int, Any]:
    qs = urlencode({k: v for k, v in query.items() if v is not None}, quote_via=quote)
    return cloud.request("GET", path + (f"?{qs}" if qs else ""), who)


def test_metrics_from_the_attempts_host_reach_its_owner_only(cloud: LocalCloud, hosts: Hosts) -> None:
    first, other = hosts.add(2)
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "6"}))
    running = wait_for(cloud, job_id, status_in("RUNNING"))
    placed = running["placement"]["hosts"][0]["host_id"]
    owner, stranger = (first, other) if first.identity.host_id == placed else (other, first)
    ref = {"job_id": job_id, "attempt": 1, "fencing_token": owner.running[(job_id, 1)].fencing_token}
    now = datetime.now(UTC)
    batch = [_sample(now - timedelta(seconds=2), 40.0), _sample(now - timedelta(seconds=1), 80.0, 150.0)]
    answer = owner.call("metrics", {**ref, "samples": batch})
    assert answer["stored"] == 2 and answer["status"] == "RUNNING"
    owner.call("metrics", {**ref, "samples": batch})  # a retried batch is kept once

    # Fenced like a report: another host, a forged token; bad samples refused whole.
    with pytest.raises(AgentApiError) as refused:
        stranger.call("metrics", {**ref, "samples": batch})
    assert refused.value.status == 404
    with pytest.raises(AgentApiError) as forged:
        owner.call("metrics", {**ref, "fencing_token": "guess", "samples": batch})
    assert forged.value.status == 409
    for bad in (
        [],
        [_sample(now, 40.0)] * 121,
        [_sample(now + timedelta(hours=1), 40.0)],
        [{**_sample(now, 40.0), "cpu_pct": -1}],
        [{**_sample(now, 40.0), "extra": 1}],
    ):
        with pytest.raises(AgentApiError) as invalid:
            owner.call("metrics", {**ref, "samples": bad})
        assert invalid.value.status == 422, invalid.value

    status, body = _get(cloud, f"/v1/jobs/{job_id}/metrics")
    assert status == 200, body
    assert body["attempt"] == 1 and len(body["samples"]) == 2
    assert [s["gpu_util_pct"] for s in body["samples"]] == [40.0, 80.0]
    assert body["samples"][0]["host_id"] == placed
    assert body["summary"] == {
        "samples": 2,
        "gpu_util_avg": 60.0,
        "gpu_util_max": 80.0,
        "gpu_mem_max_mib": 2048,
        "cpu_avg": 100.0,
        "rss_max_mib": 256.0,
    }
    assert _get(cloud, f"/v1/jobs/{job_id}/metrics", "bob")[0] == 404
    assert _get(cloud, f"/v1/jobs/{job_id}/metrics", attempt=2)[0] == 422
    assert _get(cloud, f"/v1/jobs/{job_id}/metrics", limit=0)[0] == 422
    assert wait_for(cloud, job_id, status_in("COMPLETED"))["status"] == "COMPLETED"
    # The attempt is over: its token no longer admits samples.
    with pytest.raises(AgentApiError) as late:
        owner.call("metrics", {**ref, "samples": batch})
    assert late.value.status == 409


def test_logs_of_an_attempt_page_in_order_for_its_owner_only(cloud: LocalCloud, hosts: Hosts) -> None:
    hosts.add(1)
    job_id = submit(cloud, spec(env={"SCRIPTED_RUN_S": "3"}))
    status, body = _get(cloud, f"/v1/jobs/{job_id}/logs")
    assert status == 200 and body["events"] == [] and body["next_token"] is None, body
    wait_for(cloud, job_id, status_in("RUNNING"))
    # Nothing printed yet: no stream, an empty page (not an error).
    status, body = _get(cloud, f"/v1/jobs/{job_id}/logs")
    assert status == 200 and body["events"] == [] and body["attempt"] == 1, body

    logs = cloud.session().client("logs", endpoint_url=cloud.endpoint_url)
    group, stream = "/berth/jobs/vision", f"{job_id}/1"
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    t0 = int(time.time() * 1000) - 10_000
    logs.put_log_events(
        logGroupName=group,
        logStreamName=stream,
        logEvents=[{"timestamp": t0 + i * 1000, "message": f"step {i}"} for i in range(5)],
    )
    status, first = _get(cloud, f"/v1/jobs/{job_id}/logs", limit=3)
    assert status == 200, first
    assert [e["message"] for e in first["events"]] == ["step 0", "step 1", "step 2"]
    assert {e["attempt"] for e in first["events"]} == {1} and first["status"] in ("RUNNING", "COMPLETED")
    status, rest = _get(cloud, f"/v1/jobs/{job_id}/logs", attempt=1, next_token=first["next_token"])
    assert status == 200 and [e["message"] for e in rest["events"]] == ["step 3", "step 4"], rest
    since = datetime.fromtimestamp((t0 + 3000) / 1000, UTC).isoformat().replace("+00:00", "Z")
    status, later = _get(cloud, f"/v1/jobs/{job_id}/logs", since=since)
    assert [e["message"] for e in later["events"]] == ["step 3", "step 4"], later
    status, later = _get(cloud, f"/v1/jobs/{job_id}/logs", since=str(t0 + 4000))
    assert [e["message"] for e in later["events"]] == ["step 4"], later

    assert _get(cloud, f"/v1/jobs/{job_id}/logs", "bob")[0] == 404
    assert _get(cloud, f"/v1/jobs/{job_id}/logs", since="yesterday")[0] == 400
    assert _get(cloud, f"/v1/jobs/{job_id}/logs", next_token="forged.token")[0] == 400
    assert _get(cloud, f"/v1/jobs/{job_id}/logs", attempt=0)[0] == 422
    done = wait_for(cloud, job_id, status_in("COMPLETED"))
    status, end = _get(cloud, f"/v1/jobs/{job_id}/logs", attempt=1, next_token=rest["next_token"])
    assert status == 200 and end["events"] == [] and end["status"] == done["status"] == "COMPLETED"
