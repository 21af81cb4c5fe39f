"""Logs and metrics use cases over fakes: the tenant check, attempts, fencing of samples, summaries."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from berth.domain.errors import InvalidRequest, NotFound, ValidationFailed
from berth.domain.observability import (
    GpuSample,
    MetricSample,
    MetricsBatch,
    StoredSample,
    parse_since,
    summarize,
)
from berth.domain.tenancy import Caller, Role
from berth.logic.agent import Fenced, HostCaller
from berth.logic.jobs import JobService
from berth.logic.observability import ObservabilityService
from tests.unit.fakes import FakeLogReader, FakeMetrics
from tests.unit.test_workflow_services import World, _ref

ALICE = Caller("arn:aws:iam::1:user/alice", "vision", Role.MEMBER)
BOB = Caller("arn:aws:iam::1:user/bob", "nlp", Role.MEMBER)
OPS = Caller("arn:aws:iam::1:user/ops", "platform", Role.ADMIN)


def _sample(at: datetime, util: float | None = 50.0, cpu: float = 100.0, rss: float = 100.0) -> MetricSample:
    gpus = (
        []
        if util is None
        else [GpuSample(uuid="GPU-0", utilization_pct=util, memory_used_mib=int(util) * 10)]
    )
    return MetricSample(at=at, cpu_pct=cpu, rss_mib=rss, processes=1, gpus=gpus)


class Setup:
    def __init__(self) -> None:
        self.w = World()
        self.metrics = FakeMetrics()
        self.logs = FakeLogReader()
        self.w.agent = dataclasses.replace(self.w.agent, metric_store=self.metrics)
        jobs = JobService(self.w.jobs, self.w.tenants, clock=self.w.clock)
        self.svc = ObservabilityService(jobs, self.logs, self.metrics)


@pytest.fixture
def s() -> Setup:
    return Setup()


def test_samples_are_fenced_like_reports(s: Setup) -> None:
    job, host = s.w.run_to_running(s.w.submit())
    ref = _ref(job)
    now = s.w.clock()
    answer = s.w.agent.metrics(HostCaller(host, ""), MetricsBatch(**ref.model_dump(), samples=[_sample(now)]))
    assert answer == {"stored": 1, "directive": None, "status": "RUNNING"}
    other = "h1" if host == "h0" else "h0"
    with pytest.raises(NotFound):  # another host's attempt looks missing
        s.w.agent.metrics(HostCaller(other, ""), MetricsBatch(**ref.model_dump(), samples=[_sample(now)]))
    forged = ref.model_copy(update={"fencing_token": "guess"})
    with pytest.raises(Fenced):
        s.w.agent.metrics(HostCaller(host, ""), MetricsBatch(**forged.model_dump(), samples=[_sample(now)]))
    assert len(s.metrics.items) == 1


def test_samples_outside_the_jobs_lifetime_refuse_the_whole_batch(s: Setup) -> None:
    job, host = s.w.run_to_running(s.w.submit())
    now = s.w.clock()
    for bad in (now + timedelta(minutes=10), job.created_at - timedelta(hours=1)):
        with pytest.raises(ValidationFailed):
            s.w.agent.metrics(
                HostCaller(host, ""),
                MetricsBatch(**_ref(job).model_dump(), samples=[_sample(now), _sample(bad)]),
            )
    assert s.metrics.items == {}


def test_no_metrics_store_is_a_clear_404(s: Setup) -> None:
    job, host = s.w.run_to_running(s.w.submit())
    agent = dataclasses.replace(s.w.agent, metric_store=None)
    with pytest.raises(NotFound):
        agent.metrics(
            HostCaller(host, ""), MetricsBatch(**_ref(job).model_dump(), samples=[_sample(s.w.clock())])
        )


def test_metrics_read_passes_the_tenant_check_and_summarises(s: Setup) -> None:
    job, host = s.w.run_to_running(s.w.submit())
    t = s.w.clock()
    samples = [
        _sample(t, 20.0, cpu=50.0, rss=100.0),
        _sample(t + timedelta(seconds=10), 60.0, cpu=150.0, rss=300.0),
    ]
    s.w.agent.metrics(HostCaller(host, ""), MetricsBatch(**_ref(job).model_dump(), samples=samples))
    out = s.svc.metrics(ALICE, job.id)
    assert out["attempt"] == 1 and out["status"] == "RUNNING"
    assert [x["gpu_util_pct"] for x in out["samples"]] == [20.0, 60.0]
    assert out["summary"] == {
        "samples": 2,
        "gpu_util_avg": 40.0,
        "gpu_util_max": 60.0,
        "gpu_mem_max_mib": 600,
        "cpu_avg": 100.0,
        "rss_max_mib": 300.0,
    }
    assert len(s.svc.metrics(ALICE, job.id, limit=1)["samples"]) == 1
    assert s.svc.metrics(ALICE, job.id, limit=1)["summary"]["samples"] == 2  # over all of them
    assert s.svc.metrics(OPS, job.id)["samples"]  # operators reach any job
    with pytest.raises(NotFound):
        s.svc.metrics(BOB, job.id)
    with pytest.raises(NotFound):
        s.svc.logs(BOB, job.id)
    with pytest.raises(ValidationFailed):
        s.svc.metrics(ALICE, job.id, attempt=2)


def test_a_queued_job_has_no_logs_or_samples_yet(s: Setup) -> None:
    job = s.w.submit()
    assert s.svc.logs(ALICE, job.id) == {
        "job_id": job.id,
        "attempt": None,
        "attempts": 0,
        "rank": 0,
        "status": "QUEUED",
        "events": [],
        "next_token": None,
        "reason": "the job has not started",
    }
    out = s.svc.metrics(ALICE, job.id)
    assert out["samples"] == [] and out["summary"]["samples"] == 0 and out["summary"]["gpu_util_avg"] is None


def test_logs_read_the_tenants_group_and_the_attempts_stream(s: Setup) -> None:
    job, _ = s.w.run_to_running(s.w.submit())
    base = int(datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp() * 1000)
    for i in range(3):
        s.logs.write("/berth/jobs/vision", f"{job.id}/1", base + i, f"line {i}")
    s.logs.write("/berth/jobs/nlp", f"{job.id}/1", base, "not vision's")
    page = s.svc.logs(ALICE, job.id, limit=2)
    assert [e["message"] for e in page["events"]] == ["line 0", "line 1"]
    assert page["events"][0] == {"at": "2026-12-01T12:00:00.000Z", "message": "line 0", "attempt": 1}
    rest = s.svc.logs(ALICE, job.id, attempt=1, next_token=page["next_token"])
    assert [e["message"] for e in rest["events"]] == ["line 2"]
    assert [e["message"] for e in s.svc.logs(ALICE, job.id, since_ms=base + 2)["events"]] == ["line 2"]


def test_summary_without_gpus_and_since_parsing() -> None:
    t = datetime(2026, 12, 1, tzinfo=UTC)
    summary = summarize([StoredSample(attempt=1, host_id="h", sample=_sample(t, None, cpu=30.0))])
    assert (
        summary["gpu_util_avg"] is None and summary["gpu_mem_max_mib"] is None and summary["cpu_avg"] == 30.0
    )
    ms = int(t.timestamp() * 1000)
    assert parse_since(str(ms)) == ms
    assert parse_since("2026-12-01T00:00:00Z") == ms == parse_since("2026-12-01T01:00:00+01:00")
    for bad in ("yesterday", "2026-12-01T00:00:00", "-5", ""):
        with pytest.raises(InvalidRequest):
            parse_since(bad)


def test_batch_bounds_are_part_of_the_schema() -> None:
    t = datetime(2026, 12, 1, tzinfo=UTC)
    ref = {"job_id": "j-1", "attempt": 1, "fencing_token": "f"}
    with pytest.raises(ValueError):
        MetricsBatch(**ref, samples=[])
    with pytest.raises(ValueError):
        MetricsBatch(**ref, samples=[_sample(t)] * 121)
    with pytest.raises(ValueError):
        MetricSample.model_validate({"at": "2026-12-01T00:00:00", "cpu_pct": 1, "rss_mib": 1})  # naive
    with pytest.raises(ValueError):
        GpuSample(uuid="g", utilization_pct=101, memory_used_mib=1)
