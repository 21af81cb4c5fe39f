"""`berth bench e2e`: jobs through the whole service, from submit to RUNNING to their end.

Against a running Berth (``BERTH_API_URL``), it submits N small jobs from C clients, waits for each to
end, and reads every job's history: submit-to-RUNNING is the job's RUNNING event time minus its
creation time (both stamped by the service). On the local cloud it also reads the AWS meter
(``/_berth/meter`` on the moto endpoint, reset before the run): the control plane's own bill for the
run at list prices, per 1,000 jobs. Everything metered while the run lasts is counted, the fleet's
heartbeats and the scheduler's timer included.
"""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from berth_tools.bench import batch_audit
from berth_tools.client import BerthClient, ClientError, every_job

TERMINAL = ("COMPLETED", "FAILED", "CANCELED")


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


PLACEMENTS = ("onprem", "cloud")
#: What ``gpu_type="any"`` submits, in turn: the local fleet's models on-prem, a type of every default
#: cloud region's Batch compute environments (g5.xlarge) in the cloud.
ANY_GPU: dict[str, tuple[str, ...]] = {"onprem": ("A100", "V100"), "cloud": ("A10G",)}


def probe_spec(gpu_type: str, run_s: float, tag: str, i: int, placement: str = "onprem") -> dict[str, Any]:
    return {
        "name": f"bench-e2e-{tag}-{i}",
        "image": "busybox",
        "command": ["sleep", str(run_s)],
        "resources": {"gpu_type": gpu_type, "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": placement},
        # Honoured by the local cloud's scripted agents (real agents run the command).
        "env": {"SCRIPTED_RUN_S": str(run_s)},
        "timeout_minutes": 10,
    }


#: What each task of a ``--array-size`` run runs: a code bundle (grouped into Batch array jobs in the
#: cloud; an image task is a Batch job of its own), sleeping for its ``RUN_S``.
TASK_PY = "import os, time\ntime.sleep(float(os.environ.get('RUN_S', '1')))\n"


def array_spec(
    gpu_type: str, run_s: float, tag: str, i: int, size: int, code: str, placement: str = "onprem"
) -> dict[str, Any]:
    """Array ``i`` of a run: ``size`` tasks of the code bundle ``code`` (``sha256:...``)."""
    spec = probe_spec(gpu_type, run_s, tag, i, placement)
    del spec["image"]
    spec.update(
        code=code,
        command=["python3", "task.py"],
        env={**spec["env"], "RUN_S": str(run_s)},
        array={"size": size},
    )
    return spec


def bundle_code(client: BerthClient) -> str:
    """Upload the tasks' bundle (``TASK_PY``) once; its ``sha256:`` reference."""
    import tempfile
    from pathlib import Path

    from berth_tools.bundle import upload

    with tempfile.TemporaryDirectory(prefix="berth-bench-") as tmp:
        (Path(tmp) / "task.py").write_text(TASK_PY)
        return upload(client, Path(tmp)).code


def calls_per_job(requests: dict[str, dict[str, int]], jobs: int) -> dict[str, Any]:
    """AWS calls per finished job by service and operation, from the meter's request counts (the
    fleet's heartbeats and the scheduler's timer included, as everything metered in the run is)."""
    jobs = max(1, jobs)
    per = {
        service: {op: round(n / jobs, 3) for op, n in sorted(ops.items())}
        for service, ops in sorted(requests.items())
        if ops
    }
    total = sum(n for ops in requests.values() for n in ops.values())
    return {"aws_calls_per_job": per, "aws_calls_per_job_total": round(total / jobs, 2)}


def calls_per_job_by_caller(by_caller: dict[str, dict[str, dict[str, int]]], jobs: int) -> dict[str, float]:
    """All metered calls per finished job, by the function whose credentials signed them (the API
    function serves the bench's own polling; ``other``: the local cloud's event sources and the
    agents, which sign with their own keys)."""
    totals = {
        _function_name(caller): calls_per_job(services, jobs)["aws_calls_per_job_total"]
        for caller, services in by_caller.items()
    }
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def units_per_job_by_table(tables: dict[str, dict[str, float]], jobs: int) -> dict[str, dict[str, float]]:
    """DynamoDB read and write units per finished job, by table and index (the meter's
    ``<stack>-<logical id>-<suffix>[/<index>]`` names shortened to ``<logical id>[/<index>]``, in
    order of name): where a job's units go."""
    per: dict[str, dict[str, float]] = {}
    for name, units in tables.items():
        table, slash, index = name.partition("/")
        parts = table.split("-")
        short = (parts[1] if len(parts) >= 3 else table) + slash + index
        row = per.setdefault(short, {"read_units": 0.0, "write_units": 0.0})
        for kind in row:
            row[kind] += float(units.get(kind, 0.0)) / jobs
    rounded = {name: {k: round(v, 2) for k, v in row.items()} for name, row in per.items()}
    return dict(sorted(rounded.items()))


#: The API function (by `_function_name`): the bench's polling and history reads are its GET routes.
API_FUNCTION = "ApiFunction"


def bench_reads(
    by_activity: dict[str, dict[str, dict[str, dict[str, int]]]],
    activity_counts: dict[str, dict[str, int]] | None = None,
) -> dict[str, dict[str, int]]:
    """The AWS calls the API function made while serving a GET: the bench's own reads (it polls each
    job's status and reads its events; nothing in the control plane reads its own public API), and
    the Lambda invocations of those GETs (``activity_counts``: the meter's ``activities_by_caller``)."""
    reads: dict[str, dict[str, int]] = {}
    for caller, counts in (activity_counts or {}).items():
        if _function_name(caller) != API_FUNCTION:
            continue
        gets = sum(n for activity, n in counts.items() if activity.startswith("GET "))
        if gets:
            lam = reads.setdefault("lambda", {})
            lam["Invoke"] = lam.get("Invoke", 0) + gets
    for caller, activities in by_activity.items():
        if _function_name(caller) != API_FUNCTION:
            continue
        for activity, services in activities.items():
            if not activity.startswith("GET "):
                continue
            for service, ops in services.items():
                for op, n in ops.items():
                    reads.setdefault(service, {})
                    reads[service][op] = reads[service].get(op, 0) + n
    return reads


def control_plane_calls_per_job(
    requests: dict[str, dict[str, int]],
    by_activity: dict[str, dict[str, dict[str, dict[str, int]]]],
    jobs: int,
    activity_counts: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """Every metered call per job less those that served the bench's own reads (`bench_reads`: the
    calls made serving them and their invocations): the control plane's calls (functions, agents, the
    local cloud's event sources and emulated integrations) per finished job, by service and operation
    and in total."""
    reads = bench_reads(by_activity, activity_counts)
    rest = {
        service: {op: n - reads.get(service, {}).get(op, 0) for op, n in ops.items()}
        for service, ops in requests.items()
    }
    rest = {service: {op: n for op, n in ops.items() if n > 0} for service, ops in rest.items()}
    control = calls_per_job(rest, jobs)
    served = calls_per_job(reads, jobs)
    return {
        "aws_calls_per_job_control_plane": control["aws_calls_per_job"],
        "aws_calls_per_job_control_plane_total": control["aws_calls_per_job_total"],
        "aws_calls_per_job_bench_reads_total": served["aws_calls_per_job_total"],
    }


def _function_name(physical: str) -> str:
    """``Berth-WorkflowBatchEventsFunctionFD4CABB4-0YDW`` -> ``WorkflowBatchEventsFunction``."""
    parts = physical.split("-")
    if len(parts) >= 3 and parts[0] == "Berth":
        return re.sub(r"[0-9A-F]{8}$", "", parts[1])  # CDK's logical id hash
    return physical


def run_e2e(
    client: Callable[[], BerthClient],
    jobs: int,
    concurrency: int = 8,
    gpu_type: str = "A100",
    run_s: float = 1.0,
    timeout_s: float = 600.0,
    meter: Callable[[bool], dict[str, Any]] | None = None,
    rate: float | None = None,
    placement: str = "onprem",
    batch_jobs: Callable[[], Counter[str]] | None = None,
    array_size: int = 1,
    code_bundle: bool = False,
) -> dict[str, Any]:
    """``array_size`` > 1: the ``jobs`` are tasks of arrays of that size (the last may be smaller),
    each running a code bundle; submits, errors and the submit time are then per array.
    ``code_bundle``: single jobs run that bundle too (the same work per job as an array's task)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement is one of {', '.join(PLACEMENTS)}")
    if array_size < 1:
        raise ValueError("array_size is at least 1")
    tag = uuid.uuid4().hex[:8]
    sizes = [min(array_size, jobs - start) for start in range(0, jobs, array_size)]
    code = bundle_code(client()) if array_size > 1 or code_bundle else ""
    if meter is not None:
        meter(True)
    started = time.monotonic()
    submit_ms: list[float] = []
    ids: list[str] = []
    errors: dict[str, int] = {}

    def submit(i: int) -> None:
        if rate:
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        c = client()
        t0 = time.perf_counter()
        models = ANY_GPU[placement] if gpu_type == "any" else (gpu_type,)
        model = models[i % len(models)]
        try:
            if array_size > 1:
                spec = array_spec(model, run_s, tag, i, sizes[i], code, placement)
            elif code:
                spec = array_spec(model, run_s, tag, i, 1, code, placement)
                del spec["array"]
            else:
                spec = probe_spec(model, run_s, tag, i, placement)
            job = c.submit(spec)
        except ClientError as exc:
            key = f"{exc.status} {exc.code}: {exc.message[:120]}"
            errors[key] = errors.get(key, 0) + 1
            return
        submit_ms.append((time.perf_counter() - t0) * 1000)
        if array_size > 1:
            arrays.append(job["id"])
            ids.extend(f"{job['id']}:{k}" for k in range(sizes[i]))
        else:
            ids.append(job["id"])

    arrays: list[str] = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(submit, range(len(sizes) if array_size > 1 else jobs)))
    c = client()
    deadline = time.monotonic() + timeout_s
    pending = set(ids)
    final: dict[str, dict[str, Any]] = {}
    while pending and time.monotonic() < deadline:
        # The tenant's listing, a page of 100 per request, rather than a GET per job: the bench's own
        # reads stay a small part of what the API serves however many jobs are in flight. An array's
        # tasks are listed by array, once its counts say every task has ended.
        if arrays:
            for array_id in list(arrays):
                counts = c.get(array_id).get("array", {}).get("counts", {})
                if set(counts) <= set(TERMINAL):
                    arrays.remove(array_id)
                    for job in every_job(c, array=array_id):
                        final[job["id"]] = job
                        pending.discard(job["id"])
        else:
            for job in every_job(c):
                if job.get("id") in pending and job.get("status") in TERMINAL:
                    final[job["id"]] = job
                    pending.discard(job["id"])
        if pending:
            time.sleep(1.0)
    wall = time.monotonic() - started
    to_running: list[float] = []
    attempts: list[int] = []
    for job_id, job in final.items():
        events = c.events(job_id)["events"]
        running = next((e for e in events if e["to"] == "RUNNING"), None)
        if running is not None:
            to_running.append(_ts(running["at"]) - _ts(job["created_at"]))
        attempts.append(int(job["attempts"]))
    report: dict[str, Any] = {
        "jobs": jobs,
        "array_size": array_size,
        "code_bundle": bool(code),
        "submitted": len(ids),
        "completed": sum(1 for j in final.values() if j["status"] == "COMPLETED"),
        "failed": sum(1 for j in final.values() if j["status"] == "FAILED"),
        "unfinished": len(pending),
        "submit_errors": errors,
        "placement": placement,
        "gpu_type": gpu_type,
        "lost": len(ids) - sum(1 for j in final.values() if j["status"] == "COMPLETED"),
        "cloud_completed": sum(
            1 for j in final.values() if j["status"] == "COMPLETED" and j.get("site") == "cloud"
        ),
        "concurrency": concurrency,
        "rate_per_s": rate,
        "job_run_s": run_s,
        "submit_to_running_p50_s": round(percentile(to_running, 50), 3),
        "submit_to_running_p99_s": round(percentile(to_running, 99), 3),
        "submit_to_running_max_s": round(max(to_running), 3) if to_running else None,
        "submit_p50_ms": round(statistics.median(submit_ms), 1) if submit_ms else None,
        "attempts_mean": round(statistics.mean(attempts), 3) if attempts else None,
        "wall_s": round(wall, 2),
    }
    if meter is not None:
        time.sleep(2.0)  # the last notifications and passes land
        metered = meter(False)
        bill = metered["bill"]
        done = max(1, len(final))
        report["aws_cost_per_1000_jobs_usd"] = round(float(bill["total_usd"]) * 1000 / done, 4)
        report["aws_cost_per_1000_jobs_by_service_usd"] = {
            k: round(float(v) * 1000 / done, 4) for k, v in bill["per_service_usd"].items()
        }
        m = metered["meter"]
        report["per_job"] = {
            "state_transitions": round(m.get("stepfunctions", {}).get("state_transitions", 0) / done, 2),
            "lambda_invocations": round(m.get("lambda", {}).get("invocations", 0) / done, 2),
            "dynamodb_write_units": round(m.get("dynamodb", {}).get("write_units", 0) / done, 2),
            "dynamodb_read_units": round(m.get("dynamodb", {}).get("read_units", 0) / done, 2),
        }
        report["dynamodb_units_per_job_by_table"] = units_per_job_by_table(
            m.get("dynamodb", {}).get("tables", {}), done
        )
        report.update(calls_per_job(m.get("requests", {}), done))
        report["aws_calls_per_job_by_caller"] = calls_per_job_by_caller(m.get("requests_by_caller", {}), done)
        report.update(
            control_plane_calls_per_job(
                m.get("requests", {}),
                m.get("requests_by_activity", {}),
                done,
                m.get("activities_by_caller", {}),
            )
        )
        batch_calls = m.get("requests", {}).get("batch", {})
        report["batch_api_calls"] = sum(batch_calls.values())
        report["batch_api_calls_per_job"] = round(sum(batch_calls.values()) / max(1, len(ids)), 3)
        report["batch_api_calls_by_operation"] = dict(sorted(batch_calls.items()))
        submits = sum(n for op, n in batch_calls.items() if op.lower().endswith("submitjob"))
        report["batch_submit_jobs_per_job"] = round(submits / max(1, len(ids)), 3)
    if batch_jobs is not None:
        report.update(batch_audit.audit(final, batch_jobs()))
    return report
