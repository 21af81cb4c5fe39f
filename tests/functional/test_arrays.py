"""Job arrays on moto: the API routes, the expander (chunks, resume after a crash, cancel of tasks not
yet created), counts, quotas and idempotency, and the failure path of each remote call."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from tests.functional.conftest import TABLES, Invoke


class RecordingExecutions:
    def __init__(self, fail: set[str] | None = None) -> None:
        self.started: list[str] = []
        self.fail = fail or set()

    def start(self, job_id: str, payload: dict[str, Any]) -> None:
        from berth.domain.errors import StoreUnavailable

        if job_id in self.fail:
            raise StoreUnavailable(f"could not start the workflow of {job_id}")
        self.started.append(job_id)


@pytest.fixture
def arrays_api(api: Invoke) -> Iterator[Invoke]:
    from berth.handlers import runtime, services

    for f in (services.arrays, runtime.array_repository, runtime.job_repository, runtime.array_expander):
        f.cache_clear()  # type: ignore[attr-defined]
    yield api


def expander(executions: RecordingExecutions | None = None, budget_s: float = 60.0) -> Any:
    from berth.handlers import runtime
    from berth.logic.arrays import ArrayExpander
    from berth.logic.jobs import JobService

    jobs = JobService(
        jobs=runtime.job_repository(), tenants=runtime.tenant_repository(), clock=lambda: datetime.now(UTC)
    )
    return ArrayExpander(
        arrays=runtime.array_repository(),
        jobs=jobs,
        executions=executions or RecordingExecutions(),
        clock=lambda: datetime.now(UTC),
        workflow_input=lambda j: {"job_id": j},
        budget_s=budget_s,
    )


def sweep(spec: dict[str, Any], **array: Any) -> dict[str, Any]:
    return {**spec, "name": "sweep", "command": ["python", "train.py", "--lr", "{lr}"], "array": array}


def items() -> int:
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    return int(ddb.scan(TableName=TABLES["BERTH_JOBS_TABLE"], Select="COUNT")["Count"])


def test_submit_expand_get_list_counts(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    params = [{"lr": 0.1 * (i + 1), "Opt": "adam"} for i in range(250)]
    status, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, parameters=params))
    assert status == 201, arr
    assert arr["array"] == {"size": 250, "counts": {"QUEUED": 250}, "created": 0}
    assert arr["status"] == "QUEUED" and arr["spec"]["array"] == {"size": 250}
    # Nothing is expanded in the request: the parent, its chunk, no task.
    assert arrays_api("GET", f"/v1/jobs/{arr['id']}:0")[0] == 404

    ex = RecordingExecutions()
    assert expander(ex).run() is False
    assert len(ex.started) == 250 and ex.started[0] == f"{arr['id']}:0"
    status, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert status == 200 and got["array"] == {"size": 250, "counts": {"QUEUED": 250}, "created": 250}

    status, task = arrays_api("GET", f"/v1/jobs/{arr['id']}:7")
    assert status == 200 and task["status"] == "QUEUED"
    assert task["spec"]["command"] == ["python", "train.py", "--lr", str(0.1 * 8)]
    assert task["spec"]["array_task"] == {
        "array_id": arr["id"],
        "index": 7,
        "size": 250,
        "params": {"lr": str(0.1 * 8), "Opt": "adam"},
    }
    from berth.domain.job_spec import JobSpec

    env = JobSpec.model_validate(task["spec"]).array_task.env()  # type: ignore[union-attr]
    assert (
        env["BERTH_ARRAY_INDEX"] == "7"
        and env["BERTH_ARRAY_SIZE"] == "250"
        and env["BERTH_PARAM_OPT"] == "adam"
    )

    # The tenant's listing shows the array as one row with its counts; ?array= lists its tasks.
    status, page = arrays_api("GET", "/v1/jobs")
    assert status == 200 and [j["id"] for j in page["jobs"]] == [arr["id"]]
    assert page["jobs"][0]["array"]["counts"] == {"QUEUED": 250}
    status, tasks = arrays_api("GET", "/v1/jobs", query={"array": arr["id"], "limit": "100"})
    assert status == 200 and [t["id"] for t in tasks["jobs"]][:2] == [f"{arr['id']}:0", f"{arr['id']}:1"]
    assert len(tasks["jobs"]) == 100 and tasks["next_token"] == "100"
    _, last = arrays_api("GET", "/v1/jobs", query={"array": arr["id"], "limit": "100", "next_token": "200"})
    assert len(last["jobs"]) == 50 and last["next_token"] is None

    # A task is a job: its cancel moves the array's counts.
    assert arrays_api("POST", f"/v1/jobs/{arr['id']}:3/cancel")[0] == 202
    _, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert got["array"]["counts"] == {"QUEUED": 249, "CANCELED": 1}


def test_other_tenant_gets_404(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=3))
    expander().run()
    for method, path, query in [
        ("GET", f"/v1/jobs/{arr['id']}", None),
        ("GET", f"/v1/jobs/{arr['id']}:1", None),
        ("POST", f"/v1/jobs/{arr['id']}/cancel", None),
        ("GET", "/v1/jobs", {"array": arr["id"]}),
    ]:
        status, body = arrays_api(method, path, user="bob", query=query)
        assert status == 404, (path, body)
    _, page = arrays_api("GET", "/v1/jobs", user="bob")
    assert page["jobs"] == []


@pytest.mark.parametrize(
    ("array", "needle"),
    [
        ({"size": 0}, "array.size: must be at least 1"),
        ({"size": 10_001}, "array.size: must be at most 10000"),
        ({"size": 2, "parameters": [{"a": 1}, {"a": 2}]}, "exactly one of"),
        ({}, "exactly one of"),
        ({"parameters": []}, "at least 1"),
        ({"parameters": [{"bad-name": 1}]}, "BERTH_PARAM_"),
        ({"parameters": [{"a": 1, "A": 2}]}, "differ only in case"),
        ({"parameters": [{"a": [1]}]}, "parameters"),
        ({"size": 2, "extra": 1}, "extra"),
    ],
)
def test_bad_arrays_are_4xx_and_store_nothing(
    arrays_api: Invoke, spec: dict[str, Any], array: dict[str, Any], needle: str
) -> None:
    status, body = arrays_api("POST", "/v1/jobs", body={**spec, "array": array})
    assert 400 <= status < 500 and needle in str(body), body
    assert items() == 0


def test_array_task_cannot_be_submitted(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    body = {**spec, "array_task": {"array_id": "j-" + "0" * 26, "index": 0, "size": 1}}
    status, err = arrays_api("POST", "/v1/jobs", body=body)
    assert status == 400 and "array_task" in err["error"]["message"]
    assert items() == 0


def test_quota_counts_tasks_and_refuses_whole(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    assert arrays_api("PUT", "/v1/tenants/vision/quota", user="admin", body={"max_active_jobs": 10})[0] == 200
    status, err = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=11))
    assert status == 422 and err["error"]["details"]["max_active_jobs"] == 10
    assert items() == 0
    assert arrays_api("POST", "/v1/jobs", body=sweep(spec, size=8))[0] == 201
    status, err = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=3))
    assert status == 429 and err["error"]["details"]["active"] == 8
    assert arrays_api("POST", "/v1/jobs", body=spec)[0] == 201  # 9 of 10
    assert arrays_api("POST", "/v1/jobs", body=spec)[0] == 201  # 10 of 10
    assert arrays_api("POST", "/v1/jobs", body=spec)[0] == 429


def test_idempotency_key(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    body = sweep(spec, size=5)
    s1, a1 = arrays_api("POST", "/v1/jobs", body=body, headers={"Idempotency-Key": "k1"})
    s2, a2 = arrays_api("POST", "/v1/jobs", body=body, headers={"Idempotency-Key": "k1"})
    assert s1 == s2 == 201 and a1["id"] == a2["id"]
    s3, _ = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=6), headers={"Idempotency-Key": "k1"})
    assert s3 == 409


def test_cancel_reaches_created_and_uncreated_tasks(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=230))
    ex = expander()
    ex.step(arr["id"])  # tasks 0..99 exist
    status, got = arrays_api("POST", f"/v1/jobs/{arr['id']}/cancel")
    assert status == 202 and "cancel requested" in got["reason"]
    assert arrays_api("POST", f"/v1/jobs/{arr['id']}/cancel")[0] == 202  # repeatable
    assert ex.run() is False
    _, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert got["array"] == {"size": 230, "counts": {"CANCELED": 230}, "created": 230}
    assert got["status"] == "CANCELED"
    _, t0 = arrays_api("GET", f"/v1/jobs/{arr['id']}:0")
    _, t200 = arrays_api("GET", f"/v1/jobs/{arr['id']}:200")
    assert t0["status"] == t200["status"] == "CANCELED" and "before the task was created" in t200["reason"]
    # Every task gave its active-job count back.
    from berth.handlers import runtime

    assert runtime.job_repository().count_active("vision") == 0
    assert runtime.array_repository().pending() == []


def test_expansion_resumes_after_a_crash_without_duplicates(
    arrays_api: Invoke, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.dal.arrays import DynamoArrayRepository

    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=150))
    calls = {"n": 0}
    real = DynamoArrayRepository.advance

    def crash_once(self: Any, *a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("killed between writing the chunk and advancing")
        real(self, *a, **k)

    monkeypatch.setattr(DynamoArrayRepository, "advance", crash_once)
    ex = RecordingExecutions()
    with pytest.raises(RuntimeError):
        expander(ex).run()
    assert expander(ex).run() is False
    _, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert got["array"] == {"size": 150, "counts": {"QUEUED": 150}, "created": 150}
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    events = ddb.scan(TableName=TABLES["BERTH_JOB_EVENTS_TABLE"])["Items"]
    assert len(events) == 150  # one first event per task, none twice
    assert sorted(set(ex.started)) == sorted(f"{arr['id']}:{i}" for i in range(150))


def test_crash_while_creating_canceled_tasks_counts_them_once(
    arrays_api: Invoke, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.dal.arrays import DynamoArrayRepository

    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=120))
    arrays_api("POST", f"/v1/jobs/{arr['id']}/cancel")
    real = DynamoArrayRepository.advance
    calls = {"n": 0}

    def crash_once(self: Any, *a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("killed")
        real(self, *a, **k)

    monkeypatch.setattr(DynamoArrayRepository, "advance", crash_once)
    with pytest.raises(RuntimeError):
        expander().run()
    assert expander().run() is False
    _, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert got["array"]["counts"] == {"CANCELED": 120}
    from berth.handlers import runtime

    assert runtime.job_repository().count_active("vision") == 0


def test_failed_execution_start_leaves_the_task_queued(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=4))
    ex = expander(RecordingExecutions(fail={f"{arr['id']}:2"}))
    assert ex.run() is False and ex.stats["starts_failed"] == 1
    status, task = arrays_api("GET", f"/v1/jobs/{arr['id']}:2")
    assert status == 200 and task["status"] == "QUEUED"  # the pass's repair_executions starts it


def test_store_down_during_expansion_loses_nothing(
    arrays_api: Invoke, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.dal.arrays import DynamoArrayRepository
    from berth.domain.errors import StoreUnavailable

    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=5))

    def down(self: Any, *a: Any, **k: Any) -> None:
        raise StoreUnavailable("create array tasks: state store unavailable")

    with monkeypatch.context() as m:
        m.setattr(DynamoArrayRepository, "put_tasks", down)
        with pytest.raises(StoreUnavailable):
            expander().run()
    assert expander().run() is False
    _, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert got["array"]["created"] == 5


def test_submit_survives_a_lost_pass_trigger(
    arrays_api: Invoke, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "BERTH_SCHEDULER_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/missing"
    )
    from berth.handlers import services

    services.arrays.cache_clear()  # type: ignore[attr-defined]
    status, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=2))
    assert status == 201  # the poke failed (no such queue); the timer's invocation expands it
    assert expander().run() is False
    assert arrays_api("GET", f"/v1/jobs/{arr['id']}:1")[0] == 200


def test_scheduler_handler_runs_the_expander(arrays_api: Invoke, spec: dict[str, Any]) -> None:
    from berth.handlers import scheduler
    from tests.functional.conftest import FakeContext

    _, arr = arrays_api("POST", "/v1/jobs", body=sweep(spec, size=3))
    out = scheduler.lambda_handler({"Records": []}, FakeContext())  # type: ignore[arg-type]
    assert out["batchItemFailures"] == []
    _, got = arrays_api("GET", f"/v1/jobs/{arr['id']}")
    assert got["array"]["created"] == 3
