"""Job arrays, the pure parts: spec validation, task ids and specs, counts, the array's status, the
names AWS gets for a task, and the environment a task's process sees (agent and cloud launcher)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from berth.dal.arrays import CHUNK_BYTES, chunk_parameters
from berth.domain.arrays import (
    JobArray,
    array_parent_spec,
    array_status,
    aws_name,
    counts_from_deltas,
    order_id,
    parse_task_id,
    substitute,
    task_id,
    task_spec,
)
from berth.domain.cloud import batch_job_name, parse_batch_job_name
from berth.domain.job import new_job
from berth.domain.job_spec import MAX_ARRAY_SIZE, JobSpec
from berth.domain.observability import is_log_stream_name, log_stream
from berth.domain.queue import queue_sort_key
from berth.domain.status import JobStatus

BASE: dict[str, Any] = {
    "name": "sweep",
    "image": "python:3.11-slim",
    "command": ["python3", "t.py", "--lr", "{lr}"],
}
AID = "j-" + "0123456789abcdefghjkmnpqrs"


def spec(**array: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, "array": array})


def test_size_and_parameters() -> None:
    assert spec(size=1).array.count == 1  # type: ignore[union-attr]
    assert spec(size=MAX_ARRAY_SIZE).array.count == MAX_ARRAY_SIZE  # type: ignore[union-attr]
    assert spec(parameters=[{"lr": 0.1}, {"lr": 0.2}]).array.count == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("array", "needle"),
    [
        ({"size": 0}, "greater than or equal to 1"),
        ({"size": MAX_ARRAY_SIZE + 1}, "less than or equal to 10000"),
        ({"size": 1.5}, "integer"),
        ({"size": True}, "integer"),
        ({}, "exactly one of"),
        ({"size": 2, "parameters": [{"a": 1}]}, "exactly one of"),
        ({"parameters": []}, "at least 1"),
        ({"parameters": [{"a": 1}] * (MAX_ARRAY_SIZE + 1)}, "at most 10000"),
        ({"parameters": [{"9lr": 1}]}, "BERTH_PARAM_"),
        ({"parameters": [{"l-r": 1}]}, "BERTH_PARAM_"),
        ({"parameters": [{"lr": 1, "LR": 2}]}, "differ only in case"),
        ({"parameters": [{"lr": {"nested": 1}}]}, "parameters"),
        ({"parameters": [{"lr": "a\x00b"}]}, "NUL"),
        ({"parameters": [{"lr": "x" * 1025}]}, "at most 1024"),
        ({"parameters": [{"v": "x" * 1000}] * 3100}, "bytes as JSON"),
        ({"size": 2, "unknown": 1}, "Extra inputs"),
    ],
)
def test_bad_arrays_are_refused_clearly(array: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(**array)
    assert needle in str(info.value)


def test_task_ids_and_aws_names() -> None:
    tid = task_id(AID, 42)
    assert tid == f"{AID}:42" and parse_task_id(tid) == (AID, 42)
    assert parse_task_id(AID) is None and parse_task_id(f"{AID}:x") is None
    name = aws_name(tid)
    assert ":" not in name
    assert parse_batch_job_name(batch_job_name(tid, 3)) == (tid, 3)
    assert parse_batch_job_name(batch_job_name(AID, 1)) == (AID, 1)
    assert is_log_stream_name(log_stream(tid, 1)) and log_stream(AID, 2) == f"{AID}/2"


def test_task_spec_substitutes_and_carries_its_place() -> None:
    s = spec(parameters=[{"lr": 0.5, "on": True, "name": "x"}])
    t = task_spec(s, AID, 0, 1, {"lr": 0.5, "on": True, "name": "x"})
    assert t.array is None and t.command == ["python3", "t.py", "--lr", "0.5"]
    assert t.array_task is not None and t.array_task.env() == {
        "BERTH_ARRAY_ID": AID,
        "BERTH_ARRAY_INDEX": "0",
        "BERTH_ARRAY_SIZE": "1",
        "BERTH_PARAM_LR": "0.5",
        "BERTH_PARAM_ON": "true",
        "BERTH_PARAM_NAME": "x",
    }
    # A stored task spec reads back as a spec (array_task is Berth's field, never refused on read).
    assert JobSpec.model_validate(t.model_dump(mode="json")) == t
    assert substitute(["{a}", "{b}", "{}", "x{a}y"], {"a": "1"}) == ["1", "{b}", "{}", "x1y"]
    assert array_parent_spec(s).array.model_dump(exclude_none=True) == {"size": 1}  # type: ignore[union-attr]


def test_counts_and_status() -> None:
    assert counts_from_deltas(10, {}) == {"QUEUED": 10}
    counts = counts_from_deltas(10, {"QUEUED": -4, "RUNNING": 1, "STARTING": 0, "COMPLETED": 3})
    assert counts == {"QUEUED": 6, "RUNNING": 1, "COMPLETED": 3}
    assert array_status(counts) is JobStatus.RUNNING
    assert array_status({"QUEUED": 2}) is JobStatus.QUEUED
    assert array_status({"COMPLETED": 2}) is JobStatus.COMPLETED
    assert array_status({"COMPLETED": 2, "FAILED": 1, "CANCELED": 1}) is JobStatus.FAILED
    assert array_status({"COMPLETED": 2, "CANCELED": 1}) is JobStatus.CANCELED


def test_array_public_is_a_job_with_counts() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    a = JobArray(
        id=AID, tenant="vision", owner="o", spec=array_parent_spec(spec(size=3)), size=3,
        created_at=now, updated_at=now, expanded=2, counts={"QUEUED": 2, "RUNNING": 1},
    )  # fmt: skip
    out = a.public()
    assert out["array"] == {"size": 3, "counts": {"QUEUED": 2, "RUNNING": 1}, "created": 2}
    assert out["status"] == "RUNNING" and not a.done


def test_parameter_chunks_fit_an_item() -> None:
    params = [{"v": "x" * 1000, "i": i} for i in range(1000)]
    chunks = chunk_parameters(params)
    assert len(chunks) > 1 and [e for _, c in chunks for e in c] == params
    assert [s for s, _ in chunks] == [sum(len(c) for _, c in chunks[:k]) for k in range(len(chunks))]
    import json

    assert all(len(json.dumps(c, separators=(",", ":"))) <= CHUNK_BYTES + 10 for _, c in chunks)


def test_agent_gives_the_task_its_array_env(tmp_path: Path) -> None:
    from berth_agent.executors.base import Launch, job_environment

    env = {"BERTH_ARRAY_INDEX": "3", "BERTH_PARAM_LR": "0.1", "BERTH_JOB_ID": "forged", "AWS_X": "no"}
    launch = Launch(
        job_id=f"{AID}:3", attempt=1, tenant="vision", command=("true",), workdir=tmp_path, array_env=env
    )
    out = job_environment(launch, home=str(tmp_path), output_dir=None, checkpoint_dir=None)
    assert out["BERTH_ARRAY_INDEX"] == "3" and out["BERTH_PARAM_LR"] == "0.1"
    assert out["BERTH_JOB_ID"] == f"{AID}:3" and "AWS_X" not in out  # only array names pass
    assert ":" not in launch.name


def test_cloud_launch_carries_the_array_env() -> None:
    import json

    from berth.domain.cloud import CloudSettings, submission
    from berth.domain.job import new_job
    from berth.domain.placement import CloudPlacement
    from berth_agent.launch import LaunchSpec

    t = task_spec(spec(parameters=[{"lr": 0.1}]), AID, 0, 1, {"lr": 0.1})
    job, _ = new_job(task_id(AID, 0), "vision", "o", t, datetime(2026, 1, 1, tzinfo=UTC))
    job = job.model_copy(update={"attempts": 1})
    placement = CloudPlacement(
        region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G", hourly_usd=1.0
    )
    sub = submission(job, placement, CloudSettings(artifacts_bucket="a", data_bucket="d"))
    assert sub.environment["BERTH_PARAM_LR"] == "0.1" and ":" not in sub.name
    launch = LaunchSpec.parse(json.loads(sub.environment["BERTH_LAUNCH"]))
    assert launch.array_env["BERTH_ARRAY_INDEX"] == "0"


def test_tasks_sort_in_their_index_order() -> None:
    ids = [task_id(AID, i) for i in (10, 2, 9999, 0, 100, 1)]
    assert sorted(ids, key=order_id) == [task_id(AID, i) for i in (0, 1, 2, 10, 100, 9999)]
    assert order_id(AID) == AID and order_id("j-plan") == "j-plan"  # not a task: as it is
    assert order_id(f"{AID}:x") == f"{AID}:x"
    # the queue index's sort key (the pass reads each team's head in that order) agrees
    created = datetime(2026, 12, 4, tzinfo=UTC)
    jobs = [
        new_job(tid, "vision", "alice", task_spec(spec(size=10_000), AID, 0, 10_000, None), created)[0]
        for tid in ids
    ]
    by_key = [j.id for j in sorted(jobs, key=queue_sort_key)]
    assert by_key == [task_id(AID, i) for i in (0, 1, 2, 10, 100, 9999)]
