"""``GET /v1/jobs/{id}/logs`` with long lines: every page's proxy response stays under Lambda's 6 MB
(it answered 502 once), pages continue where the last one stopped, and a line longer than a page is
cut with a marker rather than failing the page."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import boto3

from tests.functional.conftest import TABLES, Invoke

#: Lambda's limit on a synchronous invocation's response.
LAMBDA_RESPONSE_LIMIT = 6 * 1024 * 1024


def _started_job(api: Invoke, spec: dict[str, Any], lines: list[str]) -> str:
    """A job whose attempt 1 printed ``lines`` (in its on-prem stream ``<job>/1``)."""
    from berth.dal.jobs import DynamoJobRepository

    _, job = api("POST", "/v1/jobs", body=spec)
    repo = DynamoJobRepository(
        TABLES["BERTH_JOBS_TABLE"], TABLES["BERTH_JOB_EVENTS_TABLE"], TABLES["BERTH_TENANTS_TABLE"]
    )
    stored = repo.get(job["id"])
    assert stored is not None
    repo.update(stored.updated(datetime.now(UTC), attempts=1))
    logs = boto3.client("logs", region_name="us-east-1")
    logs.create_log_group(logGroupName="/berth/jobs/vision")
    logs.create_log_stream(logGroupName="/berth/jobs/vision", logStreamName=f"{job['id']}/1")
    t0 = int(time.time() * 1000) - 60_000
    for i, line in enumerate(lines):  # one call per line: CloudWatch takes 1 MB a call
        logs.put_log_events(
            logGroupName="/berth/jobs/vision",
            logStreamName=f"{job['id']}/1",
            logEvents=[{"timestamp": t0 + i, "message": line}],
        )
    return str(job["id"])


def _read_all(api: Invoke, job_id: str) -> tuple[list[str], int]:
    """Every page until an empty one: the messages, and how many pages it took. Each answer is 200
    and its whole proxy response under Lambda's limit."""
    got: list[str] = []
    query: dict[str, str] = {}
    for pages in range(1, 50):
        status, resp = api("GET", f"/v1/jobs/{job_id}/logs", query=query, raw=True)
        assert status == 200, resp["body"][:300]
        assert len(json.dumps(resp)) < LAMBDA_RESPONSE_LIMIT
        body = json.loads(resp["body"])
        if not body["events"]:
            return got, pages
        got += [e["message"] for e in body["events"]]
        query = {"attempt": "1", "next_token": body["next_token"]}
    raise AssertionError("the pages never ended")


def test_long_lines_page_by_bytes_under_lambdas_response_limit(api: Invoke, spec: dict[str, Any]) -> None:
    # 2 MB lines that JSON escapes to 4 MB each (a quote takes two bytes, and two more in the body)
    lines = [f"{i}" + '"' * (2 * 1000 * 1000) for i in range(4)] + ["done"]
    job_id = _started_job(api, spec, lines)
    got, pages = _read_all(api, job_id)
    assert len(got) == len(lines) and pages > 2
    for i, message in enumerate(got[:4]):
        assert message.startswith(f"{i}" + '"' * 1000)
        assert message.endswith("not shown: longer than one page of logs]")
    assert got[4] == "done"


def test_short_lines_still_come_as_one_page(api: Invoke, spec: dict[str, Any]) -> None:
    lines = [f"step {i}: " + "y" * 1000 for i in range(50)]
    job_id = _started_job(api, spec, lines)
    got, pages = _read_all(api, job_id)
    assert got == lines and pages == 2  # the page, then the empty end


def test_a_rank_outside_the_gang_is_a_4xx_and_rank_zero_is_the_job(api: Invoke, spec: dict[str, Any]) -> None:
    """``?rank=`` (issue 23): a single-node job has rank 0 only; a rank it does not have is 422 with
    the node count, a negative or non-numeric one 422 naming the parameter: never a 5xx."""
    job_id = _started_job(api, spec, ["only line"])
    status, page = api("GET", f"/v1/jobs/{job_id}/logs", query={"rank": "0"})
    assert status == 200 and page["rank"] == 0 and [e["message"] for e in page["events"]] == ["only line"]
    status, body = api("GET", f"/v1/jobs/{job_id}/logs", query={"rank": "1"})
    assert status == 422, body
    assert body["error"]["details"] == {"nodes": 1} and "rank 1 does not exist" in body["error"]["message"]
    for bad in ("-1", "x"):
        status, body = api("GET", f"/v1/jobs/{job_id}/logs", query={"rank": bad})
        assert status == 422 and body["error"]["details"][0]["field"] == "query:rank", (bad, body)
