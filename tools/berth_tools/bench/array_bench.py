"""`berth bench array`: one job array through the running service. It times the submit (the API
answers once the array is stored, whatever its size), then the background expansion until every task
exists, then one bulk cancel until every task has ended; with the local cloud's meter it counts the
AWS calls and DynamoDB units of the submit and per task (docs/workflow.md, "Job arrays")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

ENDED = ("COMPLETED", "FAILED", "CANCELED")


def _spec(size: int, gpu_type: str) -> dict[str, Any]:
    return {
        "name": "bench-array",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", "import os; print(os.environ['BERTH_ARRAY_INDEX'])"],
        "resources": {"gpu_type": gpu_type, "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "onprem"},
        "array": {"size": size},
    }


def _calls(meter: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for service, ops in (meter.get("requests") or {}).items():
        for op, n in ops.items():
            out[f"{service}:{op}"] = int(n)
    return dict(sorted(out.items()))


def run_array(
    client_factory: Callable[[], Any],
    size: int,
    *,
    gpu_type: str = "A100",
    timeout_s: float = 900.0,
    meter: Callable[[bool], dict[str, Any]] | None = None,
    poll_s: float = 1.0,
    cancel_at_once: bool = False,
) -> dict[str, Any]:
    """``cancel_at_once``: cancel right after the submit, so the expander creates every task
    CANCELED (no execution, nothing runs): the submit and the bulk cancel alone."""
    client = client_factory()
    if meter is not None:
        meter(True)
    t0 = time.monotonic()
    arr = client.submit(_spec(size, gpu_type))
    accept_s = time.monotonic() - t0
    report: dict[str, Any] = {"size": size, "array_id": arr["id"], "accept_s": round(accept_s, 3)}
    report["load_avg_at_accept"] = [round(x, 2) for x in os.getloadavg()]
    if meter is not None:
        m = meter(False)["meter"]
        report["submit_aws_calls"] = _calls(m)
        report["submit_dynamodb_write_units"] = m.get("dynamodb", {}).get("write_units", 0)
    deadline = t0 + timeout_s
    if cancel_at_once:
        client.cancel(arr["id"])
    while True:
        got = client.get(arr["id"])
        if got["array"]["created"] >= size:
            break
        if time.monotonic() > deadline:
            report["unfinished"] = "expansion"
            return report
        time.sleep(poll_s)
    report["expand_s"] = round(time.monotonic() - t0, 2)
    report["counts_at_expanded"] = got["array"]["counts"]
    c0 = time.monotonic()
    if not cancel_at_once:
        client.cancel(arr["id"])
    while True:
        got = client.get(arr["id"])
        counts = got["array"]["counts"]
        if sum(counts.get(s, 0) for s in ENDED) >= size:
            break
        if time.monotonic() > deadline:
            report["unfinished"] = "cancel"
            break
        time.sleep(poll_s)
    report["cancel_s"] = round(time.monotonic() - c0, 2)
    report["final_counts"] = got["array"]["counts"]
    report["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    if meter is not None:
        time.sleep(2.0)
        metered = meter(False)
        m = metered["meter"]
        calls = _calls(m)
        report["aws_calls_per_task"] = {k: round(v / size, 3) for k, v in calls.items()}
        report["aws_calls_per_task_total"] = round(sum(calls.values()) / size, 2)
        report["dynamodb_write_units_per_task"] = round(m.get("dynamodb", {}).get("write_units", 0) / size, 2)
        report["dynamodb_read_units_per_task"] = round(m.get("dynamodb", {}).get("read_units", 0) / size, 2)
        report["aws_cost_per_1000_tasks_usd"] = round(float(metered["bill"]["total_usd"]) * 1000 / size, 4)
    return report
