"""The local cloud's pool of Lambda sandboxes (`lambda_workers.SandboxPool`), with stand-in workers."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from berth_tools.localcloud.lambda_workers import SandboxGone, SandboxPool


class FakeWorker:
    def __init__(self) -> None:
        self.running = True

    def alive(self) -> bool:
        return self.running

    def stop(self) -> None:
        self.running = False

    def join(self) -> None:
        pass

    def kill(self) -> str:
        self.running = False
        return ""


def _pool(limit: int) -> tuple[SandboxPool, list[FakeWorker]]:
    started: list[FakeWorker] = []

    def spawn() -> Any:
        started.append(FakeWorker())
        return started[-1]

    return SandboxPool(limit, spawn), started


def _wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 10
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert condition()


def test_warm_sandboxes_are_reused_and_the_limit_holds() -> None:
    pool, started = _pool(2)
    a, cold_a = pool.acquire()
    b, cold_b = pool.acquire()
    assert cold_a and cold_b and len(started) == 2
    pool.release(a)
    again, cold = pool.acquire()
    assert again is a and not cold and len(started) == 2
    pool.release(again)
    pool.release(b)


def test_waiting_invocations_are_served_in_arrival_order() -> None:
    pool, _ = _pool(1)
    held, _ = pool.acquire()
    order: list[int] = []

    def wait(i: int) -> None:
        worker, _ = pool.acquire()
        order.append(i)
        pool.release(worker)

    threads = []
    for i in range(5):
        thread = threading.Thread(target=wait, args=(i,))
        thread.start()
        threads.append(thread)
        _wait_for(lambda i=i: pool._next_ticket == i + 2)  # this one is queued before the next starts
    pool.release(held)
    for thread in threads:
        thread.join()
    assert order == [0, 1, 2, 3, 4]


def test_a_discarded_sandbox_frees_its_place_for_a_fresh_one() -> None:
    pool, started = _pool(1)
    worker, _ = pool.acquire()
    pool.discard(worker)
    fresh, cold = pool.acquire()
    assert cold and fresh is not worker and len(started) == 2


def test_a_failed_start_frees_its_place() -> None:
    calls = {"n": 0}

    def spawn() -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("init failed")
        return FakeWorker()

    pool = SandboxPool(1, spawn)
    with pytest.raises(RuntimeError):
        pool.acquire()
    worker, cold = pool.acquire()
    assert cold and worker.alive()


def test_closing_wakes_the_waiters_and_stops_the_sandboxes() -> None:
    pool, _started = _pool(1)
    worker, _ = pool.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.acquire()
        except SandboxGone as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_for(lambda: pool._next_ticket == 2)
    stopped = pool.close()
    thread.join()
    assert errors and stopped == [worker] and not worker.alive()
    with pytest.raises(SandboxGone):
        pool.acquire()


def test_retired_sandboxes_are_not_kept_warm() -> None:
    pool, _started = _pool(1)
    worker, _ = pool.acquire()
    pool.release(worker, retire=True)
    assert not worker.alive()
    fresh, cold = pool.acquire()
    assert cold and fresh is not worker
