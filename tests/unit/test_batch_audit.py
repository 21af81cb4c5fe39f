"""`berth bench e2e --placement cloud`: counting each attempt's Batch jobs by name, and the report's
Batch figures from the meter (a fake client and meter: no service)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from berth_tools.bench import e2e_bench
from berth_tools.bench.batch_audit import audit, price_file_regions


def test_audit_finds_duplicated_and_missing_batch_jobs() -> None:
    jobs = {
        "j1": {"attempts": 1, "site": "cloud"},  # once: fine
        "j2": {"attempts": 2, "site": "cloud"},  # its second attempt submitted twice
        "j3": {"attempts": 1, "site": "cloud"},  # never reached Batch
        "j4": {"attempts": 1, "site": "onprem"},  # ran on-prem: no Batch job expected
    }
    names = Counter({"j1-a1": 1, "j2-a1": 1, "j2-a2": 2, "other-a1": 3})
    assert audit(jobs, names) == {"duplicated": 1, "batch_jobs": 4, "cloud_without_batch_job": 1}
    assert audit({"j1": {"attempts": 1, "site": "cloud"}}, Counter({"j1-a1": 1}))["duplicated"] == 0


def test_price_file_regions_are_the_default_cloud_regions() -> None:
    assert {"us-east-1", "us-east-2", "us-west-2"} <= set(price_file_regions())


class _FakeClient:
    """Accepts every submit; each job COMPLETED in the cloud, RUNNING one second after creation."""

    def __init__(self, specs: list[dict[str, Any]]) -> None:
        self.specs = specs

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.specs.append(spec)
        return {"id": f"j{len(self.specs)}"}

    def get(self, job_id: str) -> dict[str, Any]:
        status = "FAILED" if job_id == "j3" else "COMPLETED"
        return {
            "id": job_id,
            "status": status,
            "site": "cloud",
            "attempts": 1,
            "created_at": "2026-01-01T00:00:00Z",
        }

    def list(
        self, limit: int = 50, next_token: str | None = None, array: str | None = None
    ) -> dict[str, Any]:
        # Three a page (the bench asks for 100), and a job of an earlier run the bench must ignore.
        jobs = [self.get(f"j{i + 1}") for i in range(len(self.specs))]
        jobs.append({**self.get("old-1"), "status": "RUNNING"})
        start = int(next_token or 0)
        more = start + 3 < len(jobs)
        return {"jobs": jobs[start : start + 3], "next_token": str(start + 3) if more else None}

    def events(self, job_id: str) -> dict[str, Any]:
        return {"events": [{"to": "RUNNING", "at": "2026-01-01T00:00:01Z"}]}


def test_cloud_report_counts_batch_calls_per_job_lost_and_duplicated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e_bench.time, "sleep", lambda _s: None)
    specs: list[dict[str, Any]] = []
    batch = {"POST /v1/submitjob": 5, "POST /v1/describejobs": 7}
    metered = {
        "meter": {"requests": {"batch": batch, "sqs": {"SendMessage": 9}}},
        "bill": {"total_usd": "0", "per_service_usd": {}},
    }
    report = e2e_bench.run_e2e(
        lambda: _FakeClient(specs),  # type: ignore[arg-type,return-value]
        jobs=4,
        concurrency=1,
        gpu_type="any",
        placement="cloud",
        meter=lambda _reset: metered,
        batch_jobs=lambda: Counter({"j1-a1": 1, "j2-a1": 2, "j4-a1": 1}),
    )
    assert {s["constraints"]["placement"] for s in specs} == {"cloud"}
    assert {s["resources"]["gpu_type"] for s in specs} == {"A10G"}  # 'any' in the cloud
    assert report["batch_api_calls"] == 12 and report["batch_api_calls_per_job"] == 3.0
    assert report["batch_api_calls_by_operation"] == batch
    assert report["lost"] == 1 and report["completed"] == 3 and report["cloud_completed"] == 3
    assert report["duplicated"] == 1 and report["cloud_without_batch_job"] == 1
    assert report["submit_to_running_p50_s"] == 1.0
    with pytest.raises(ValueError):
        e2e_bench.run_e2e(lambda: _FakeClient([]), jobs=1, placement="mars")  # type: ignore[arg-type,return-value]


def test_calls_per_job_divides_every_metered_operation_by_the_jobs_that_ended() -> None:
    from berth_tools.bench.e2e_bench import calls_per_job

    requests = {"states": {"SendTaskSuccess": 20}, "dynamodb": {"GetItem": 45, "BatchGetItem": 3}, "sqs": {}}
    assert calls_per_job(requests, 10) == {
        "aws_calls_per_job": {
            "dynamodb": {"BatchGetItem": 0.3, "GetItem": 4.5},
            "states": {"SendTaskSuccess": 2.0},
        },
        "aws_calls_per_job_total": 6.8,
    }
    assert calls_per_job({}, 0) == {"aws_calls_per_job": {}, "aws_calls_per_job_total": 0.0}


def test_calls_per_job_by_caller_names_each_function_by_its_logical_name() -> None:
    from berth_tools.bench.e2e_bench import calls_per_job_by_caller

    by_caller = {
        "Berth-ApiFunction685AAB5B-VZ14DK27OFKA": {"dynamodb": {"GetItem": 30, "Query": 2}},
        "Berth-WorkflowBatchEventsFunctionFD4CABB4-0YDW": {"batch": {"POST /v1/describejobs": 4}},
        "other": {"sqs": {"ReceiveMessage": 10}},
    }
    assert calls_per_job_by_caller(by_caller, 2) == {
        "ApiFunction": 16.0,
        "other": 5.0,
        "WorkflowBatchEventsFunction": 2.0,
    }


def test_units_per_job_by_table_name_each_table_and_index_by_its_logical_id() -> None:
    from berth_tools.bench.e2e_bench import units_per_job_by_table

    tables = {
        "Berth-DataJobsTable49BDAC44-B6VZ": {"read_units": 10.0, "write_units": 40.0},
        "Berth-DataJobsTable49BDAC44-B6VZ/by_placed": {"read_units": 0.0, "write_units": 12.0},
        "Berth-DataHostsTable06173A0F-3W42": {"read_units": 4.0, "write_units": 60.0},
        "plain": {"write_units": 2.0},
    }
    assert units_per_job_by_table(tables, 4) == {
        "DataHostsTable06173A0F": {"read_units": 1.0, "write_units": 15.0},
        "DataJobsTable49BDAC44": {"read_units": 2.5, "write_units": 10.0},
        "DataJobsTable49BDAC44/by_placed": {"read_units": 0.0, "write_units": 3.0},
        "plain": {"read_units": 0.0, "write_units": 0.5},
    }


def test_control_plane_calls_leave_out_what_served_the_benchs_own_reads() -> None:
    from berth_tools.bench.e2e_bench import control_plane_calls_per_job

    requests = {"dynamodb": {"GetItem": 50, "TransactWriteItems": 10}, "sqs": {"ReceiveMessage": 20}}
    by_activity = {
        "Berth-ApiFunction685AAB5B-X": {
            "GET /v1/jobs/{id}": {"dynamodb": {"GetItem": 40}},  # the bench polling: left out
            "POST /v1/jobs": {"dynamodb": {"GetItem": 2, "TransactWriteItems": 10}},  # submits: kept
        },
        "Berth-AgentApiFunctionABCDEF12-Y": {"GET /v1/agent/work": {"dynamodb": {"GetItem": 5}}},  # kept
    }
    report = control_plane_calls_per_job(requests, by_activity, 10)
    assert report["aws_calls_per_job_bench_reads_total"] == 4.0
    assert report["aws_calls_per_job_control_plane"] == {
        "dynamodb": {"GetItem": 1.0, "TransactWriteItems": 1.0},
        "sqs": {"ReceiveMessage": 2.0},
    }
    assert report["aws_calls_per_job_control_plane_total"] == 4.0

    # the GETs' own invocations (the meter's activities_by_caller) are the bench's too
    requests["lambda"] = {"Invoke": 45}
    counts = {
        "Berth-ApiFunction685AAB5B-X": {"GET /v1/jobs/{id}": 20, "POST /v1/jobs": 10},
        "Berth-AgentApiFunctionABCDEF12-Y": {"GET /v1/agent/work": 5},
    }
    report = control_plane_calls_per_job(requests, by_activity, 10, counts)
    assert report["aws_calls_per_job_bench_reads_total"] == 6.0
    assert report["aws_calls_per_job_control_plane"]["lambda"] == {"Invoke": 2.5}
    assert report["aws_calls_per_job_control_plane_total"] == 6.5


def test_an_api_gateway_invocation_is_named_by_its_method_and_resource() -> None:
    from berth_tools.localcloud.lambda_runtime import activity_of

    event = {"httpMethod": "GET", "resource": "/v1/jobs/{id}", "path": "/v1/jobs/j-1"}
    assert activity_of(event) == "GET /v1/jobs/{id}"
    assert activity_of({"Records": []}) == "" and activity_of([1, 2]) == "" and activity_of(None) == ""


class _FakeArrayClient(_FakeClient):
    """Arrays: each submit is an array of ``size`` tasks, all COMPLETED in the cloud, tasks 0 and 1 of
    each in one Batch group; the bundle is already stored."""

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.specs.append(spec)
        return {"id": f"j-{len(self.specs):026d}", "array": spec["array"]}

    def request_bundle(self, digest: str, size: int) -> dict[str, Any]:
        return {"present": True}

    def get(self, job_id: str) -> dict[str, Any]:
        if ":" not in job_id:
            size = next(
                s["array"]["size"] for i, s in enumerate(self.specs) if job_id.endswith(f"{i + 1:026d}")
            )
            return {"id": job_id, "array": {"size": size, "counts": {"COMPLETED": size}}}
        index = int(job_id.rsplit(":", 1)[1])
        group = {"first": 0, "size": 2} if index < 2 else None
        return {**super().get("x"), "id": job_id, "placement": {"group": group}}

    def list(
        self, limit: int = 50, next_token: str | None = None, array: str | None = None
    ) -> dict[str, Any]:
        assert array is not None, "an array run lists tasks by array"
        size = self.get(array)["array"]["size"]
        return {"jobs": [self.get(f"{array}:{k}") for k in range(size)], "next_token": None}


def test_an_array_run_submits_arrays_and_audits_grouped_batch_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from berth.domain.cloud import batch_group_name
    from berth.domain.placement import BatchGroup

    monkeypatch.setattr(e2e_bench.time, "sleep", lambda _s: None)
    specs: list[dict[str, Any]] = []
    first = f"j-{1:026d}"
    names = Counter(
        {batch_group_name(first, BatchGroup(first=0, size=2), 1): 1, f"{first}_2-a1": 1, f"{first}_3-a1": 1}
    )
    report = e2e_bench.run_e2e(
        lambda: _FakeArrayClient(specs),  # type: ignore[arg-type,return-value]
        jobs=7,
        concurrency=1,
        placement="cloud",
        array_size=4,
        meter=lambda _reset: {
            "meter": {"requests": {"batch": {"SubmitJob": 3}}},
            "bill": {"total_usd": "0", "per_service_usd": {}},
        },
        batch_jobs=lambda: names,
    )
    assert [s["array"] for s in specs] == [{"size": 4}, {"size": 3}]  # the last array is smaller
    assert all(s["code"].startswith("sha256:") and "image" not in s for s in specs)
    assert report["submitted"] == 7 and report["completed"] == 7 and report["lost"] == 0
    assert report["batch_submit_jobs_per_job"] == round(3 / 7, 3)
    # the first array: one group (tasks 0-1) and two single jobs, each submitted once
    assert report["duplicated"] == 0 and report["batch_jobs"] == 3
    # the second array's tasks have no Batch job in ``names``
    assert report["cloud_without_batch_job"] == 3


def test_a_code_bundle_baseline_runs_single_jobs_of_the_same_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e2e_bench.time, "sleep", lambda _s: None)
    specs: list[dict[str, Any]] = []

    class _Bundled(_FakeClient):
        def request_bundle(self, digest: str, size: int) -> dict[str, Any]:
            return {"present": True}

    report = e2e_bench.run_e2e(
        lambda: _Bundled(specs),  # type: ignore[arg-type,return-value]
        jobs=2,
        concurrency=1,
        placement="cloud",
        code_bundle=True,
    )
    assert report["code_bundle"] and report["array_size"] == 1 and report["submitted"] == 2
    assert all(s["code"].startswith("sha256:") and "array" not in s and "image" not in s for s in specs)
    assert specs[0]["command"] == ["python3", "task.py"]
