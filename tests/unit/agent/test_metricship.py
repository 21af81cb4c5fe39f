"""The metrics shipper: bounded per attempt, drops the oldest, sends in order, never blocks ``add``."""

from __future__ import annotations

import threading
from typing import Any

from berth_agent.client import AgentApiError, Fenced, Unreachable
from berth_agent.metricship import MetricsShipper, sample_body
from berth_agent.usage import GpuUsage, JobUsage

KEY = ("j-1", 1)


def usage(i: int) -> JobUsage:
    return JobUsage(
        at=1_796_000_000.0 + i,
        processes=1,
        cpu_pct=12.34,
        rss_bytes=3 * 1024 * 1024,
        gpus=(GpuUsage("GPU-0", 50.0, 1000, 80000, 900),),
    )


class Api:
    def __init__(self) -> None:
        self.batches: list[tuple[str, int, str, list[dict[str, Any]]]] = []
        self.fail_with: Exception | None = None

    def metrics(self, job_id: str, attempt: int, token: str, samples: list[dict[str, Any]]) -> Any:
        if self.fail_with is not None:
            raise self.fail_with
        self.batches.append((job_id, attempt, token, list(samples)))
        return {"stored": len(samples)}


def never(_event: threading.Event, _s: float) -> bool:
    return True  # the background sender stops at once: tests drive sends themselves


def test_sample_body_matches_the_api_schema() -> None:
    body = sample_body(usage(0))
    assert body == {
        "at": "2026-11-30T00:53:20.000+00:00",
        "cpu_pct": 12.3,
        "rss_mib": 3.0,
        "processes": 1,
        "gpus": [
            {
                "uuid": "GPU-0",
                "utilization_pct": 50.0,
                "memory_used_mib": 1000,
                "memory_total_mib": 80000,
                "job_memory_mib": 900,
            }
        ],
    }


def test_batches_go_in_order_with_the_token_and_leave_the_queue() -> None:
    api = Api()
    ship = MetricsShipper(api, batch_max_samples=2, wait=never)
    for i in range(5):
        ship.add(KEY, "tok", usage(i))
    ship.flush(KEY)
    assert [len(b[3]) for b in api.batches] == [2, 2, 1]
    assert [s["at"] for b in api.batches for s in b[3]] == [sample_body(usage(i))["at"] for i in range(5)]
    assert {b[2] for b in api.batches} == {"tok"} and ship.pending(KEY) == 0


def test_unreachable_keeps_samples_bounded_dropping_the_oldest() -> None:
    api = Api()
    api.fail_with = Unreachable(0, "Unreachable", "down")
    ship = MetricsShipper(api, buffer_max_samples=3, wait=never)
    for i in range(5):
        ship.add(KEY, "tok", usage(i))
        ship.flush(KEY)
    assert ship.pending(KEY) == 3 and ship.dropped[KEY] == 2
    api.fail_with = None
    ship.send_all()
    assert [s["at"] for s in api.batches[0][3]] == [sample_body(usage(i))["at"] for i in (2, 3, 4)]


def test_refusals_drop_the_attempts_samples() -> None:
    for error in (Fenced(409, "Fenced", "gone"), AgentApiError(422, "ValidationError", "clock")):
        api = Api()
        api.fail_with = error
        ship = MetricsShipper(api, wait=never)
        ship.add(KEY, "tok", usage(0))
        ship.flush(KEY)
        assert ship.pending(KEY) == 0 and ship.dropped[KEY] == 1


def test_the_sender_thread_sends_on_its_interval() -> None:
    api = Api()
    sent = threading.Event()
    ship = MetricsShipper(api, send_interval_s=0.01)
    original = api.metrics

    def spy(*args: Any) -> Any:
        answer = original(*args)
        sent.set()
        return answer

    api.metrics = spy  # type: ignore[method-assign]
    ship.add(KEY, "tok", usage(0))
    assert sent.wait(5)
    ship.close()
    assert api.batches and ship.pending(KEY) == 0


def test_forget_drops_the_queue() -> None:
    ship = MetricsShipper(Api(), wait=never)
    ship.add(KEY, "tok", usage(0))
    ship.forget(KEY)
    assert ship.pending(KEY) == 0
