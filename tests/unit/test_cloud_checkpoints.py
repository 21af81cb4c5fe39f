"""A cloud attempt's last checkpoint, read from its prefix when its Batch job ends
(``logic/cloud_checkpoints.py`` through ``CloudDispatchService.on_event``): recorded on the job (the
public ``checkpoint``) on SUCCEEDED and FAILED, never over a newer one, never read while the attempt
runs or when it never started, and a read that fails costs the event nothing but the checkpoint."""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

import pytest

from berth.domain.cloud import BatchStatus
from berth.domain.errors import StoreUnavailable
from berth.domain.job import Job, iso
from berth.domain.storage import job_checkpoint_prefix, job_output_prefix
from berth.domain.workflow import Failure
from tests.unit.fakes import FakeCheckpointStore
from tests.unit.test_cloud_dispatch import CloudWorld

RUNNING = BatchStatus.RUNNING


def _world() -> tuple[CloudWorld, FakeCheckpointStore]:
    w = CloudWorld()
    store = FakeCheckpointStore()
    w.cloud = dataclasses.replace(w.cloud, checkpoints=store)
    return w, store


def _running(w: CloudWorld) -> tuple[Job, str, str]:
    """A cloud job (3 attempts) whose Batch job started a minute ago (the clock's now)."""
    job = w.place(retry={"max_attempts": 3})
    token = w.dispatch(job)
    w.deliver()
    bid = w.batch_id(job.id)
    started = w.clock() - timedelta(minutes=1)
    w.batch.set(bid, RUNNING, started_at=started)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "running"
    return w.job(job.id), token, bid


def _end(w: CloudWorld, bid: str, status: BatchStatus) -> None:
    if status is BatchStatus.FAILED:
        # a spot interruption: retried, and the retry resumes from the checkpoint
        w.batch.set(bid, status, reason="Host EC2 (instance i-0abc) terminated.")
    else:
        w.batch.set(bid, status, exit_code=0)


@pytest.mark.parametrize("status", [BatchStatus.SUCCEEDED, BatchStatus.FAILED])
def test_the_end_of_an_attempt_records_its_last_checkpoint(status: BatchStatus) -> None:
    w, store = _world()
    job, token, bid = _running(w)
    prefix = job_checkpoint_prefix(job.tenant, job.id)
    now = w.clock()
    store.put(prefix + "step-1.pt", 100, now - timedelta(seconds=40))
    store.put(prefix + "step-2.pt", 200, now - timedelta(seconds=10))
    store.put(job_output_prefix(job.tenant, job.id) + "outputs/model.pt", 5000, now)
    assert store.reads == []  # nothing is read while the attempt runs
    _end(w, bid, status)
    outcome = w.cloud.on_event(bid, f"{job.id}-a1")
    assert outcome == ("succeeded" if status is BatchStatus.SUCCEEDED else "failed")
    assert store.reads == [prefix]
    ckpt = w.job(job.id).checkpoint()
    assert ckpt == {"at": iso(now - timedelta(seconds=10)), "size_bytes": 300, "attempt": 1}
    if status is BatchStatus.FAILED:
        # the retry's status shows what it resumes from
        assert w.classify(job, token)["action"] == "retry"
        assert w.job(job.id).checkpoint() == ckpt


def test_a_checkpoint_dated_ahead_is_clamped_to_the_control_planes_clock() -> None:
    w, store = _world()
    job, _, bid = _running(w)
    store.put(job_checkpoint_prefix(job.tenant, job.id) + "step.pt", 1, w.clock() + timedelta(hours=1))
    _end(w, bid, BatchStatus.SUCCEEDED)
    w.cloud.on_event(bid, f"{job.id}-a1")
    assert w.job(job.id).run.checkpoint_at == w.clock()


def test_a_newer_stored_checkpoint_is_kept_an_older_one_replaced() -> None:
    w, store = _world()
    job, _, bid = _running(w)
    prefix = job_checkpoint_prefix(job.tenant, job.id)
    now = w.clock()
    store.put(prefix + "step.pt", 10, now - timedelta(seconds=30))
    # a later one is stored already (an earlier report of a later sync): the listing does not replace it
    newer = job.run.model_copy(
        update={"checkpoint_at": now - timedelta(seconds=5), "checkpoint_bytes": 99, "checkpoint_attempt": 1}
    )
    w.jobs.update(job.updated(job.updated_at, run=newer))
    version = w.job(job.id).version
    _end(w, bid, BatchStatus.SUCCEEDED)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "succeeded"
    kept = w.job(job.id)
    assert (kept.run.checkpoint_bytes, kept.version) == (99, version)  # nothing written

    w2, store2 = _world()
    job2, _, bid2 = _running(w2)
    prefix2 = job_checkpoint_prefix(job2.tenant, job2.id)
    store2.put(prefix2 + "step.pt", 10, now - timedelta(seconds=30))
    older = job2.run.model_copy(
        update={"checkpoint_at": now - timedelta(hours=1), "checkpoint_bytes": 99, "checkpoint_attempt": 1}
    )
    w2.jobs.update(job2.updated(job2.updated_at, run=older))
    _end(w2, bid2, BatchStatus.SUCCEEDED)
    w2.cloud.on_event(bid2, f"{job2.id}-a1")
    assert w2.job(job2.id).checkpoint() == {
        "at": iso(now - timedelta(seconds=30)),
        "size_bytes": 10,
        "attempt": 1,
    }


def test_an_empty_prefix_records_nothing() -> None:
    w, store = _world()
    job, _, bid = _running(w)
    _end(w, bid, BatchStatus.SUCCEEDED)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "succeeded"
    assert store.reads == [job_checkpoint_prefix(job.tenant, job.id)]
    assert w.job(job.id).checkpoint() is None


def test_an_attempt_that_never_started_is_not_read() -> None:
    w, store = _world()
    job = w.place()
    token = w.dispatch(job)
    w.deliver()
    bid = w.batch_id(job.id)
    # an earlier attempt's checkpoint is there, but this one never ran (no startedAt)
    store.put(job_checkpoint_prefix(job.tenant, job.id) + "step.pt", 10, w.clock())
    w.batch.set(bid, BatchStatus.FAILED, reason="CAPACITY_UNAVAILABLE: no p4d")
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "failed"
    assert w.failures_of(token) == [Failure.CAPACITY.error_name]
    assert store.reads == [] and w.job(job.id).checkpoint() is None


@pytest.mark.parametrize("status", [BatchStatus.SUCCEEDED, BatchStatus.FAILED])
def test_a_read_that_fails_never_fails_the_event(
    status: BatchStatus, caplog: pytest.LogCaptureFixture
) -> None:
    w, store = _world()
    job, token, bid = _running(w)
    store.put(job_checkpoint_prefix(job.tenant, job.id) + "step.pt", 10, w.clock())
    store.fail = True
    _end(w, bid, status)
    with caplog.at_level(logging.WARNING, logger="berth.logic.cloud_checkpoints"):
        outcome = w.cloud.on_event(bid, f"{job.id}-a1")
    assert outcome == ("succeeded" if status is BatchStatus.SUCCEEDED else "failed")
    assert [c[0] for c in w.tokens.calls if c[1] == token] == [
        "succeed" if status is BatchStatus.SUCCEEDED else "fail"
    ]
    assert w.job(job.id).checkpoint() is None
    assert any(r.message == "checkpoint not read" for r in caplog.records)


def test_a_write_that_fails_never_fails_the_event(monkeypatch: pytest.MonkeyPatch) -> None:
    w, store = _world()
    job, token, bid = _running(w)
    store.put(job_checkpoint_prefix(job.tenant, job.id) + "step.pt", 10, w.clock())
    real_update = w.jobs.update
    calls = []

    def failing_update(j: Job) -> None:
        calls.append(j)
        if len(calls) == 1:  # the checkpoint's write, the first after the event
            raise StoreUnavailable("jobs table unavailable")
        real_update(j)

    monkeypatch.setattr(w.jobs, "update", failing_update)
    _end(w, bid, BatchStatus.SUCCEEDED)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "succeeded"
    assert calls and calls[0].run.checkpoint_bytes == 10
    assert w.job(job.id).checkpoint() is None
    assert [c[0] for c in w.tokens.calls if c[1] == token] == ["succeed"]
