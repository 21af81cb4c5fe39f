"""Cost accounting over the in-memory fakes: the pure cost model, accrual by the scheduling pass
(bounded writes, one ledger record per attempt), the final cost when an attempt ends,
``max_cost_usd`` stopping a job (FAILED, ``CostLimit``, never retried) and a spent monthly cloud
budget keeping a tenant's jobs out of the cloud."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from berth.domain.cost import (
    AttemptUsage,
    CostRates,
    accrual_due,
    attempt_usage,
    by_site,
    cost_limit,
    cost_now,
    month_of,
)
from berth.domain.placement import CloudPlacement, Site
from berth.domain.status import JobStatus
from berth.domain.tenancy import Quota
from berth.domain.workflow import (
    AttemptReport,
    Failure,
    FailureClass,
    HeartbeatRequest,
    ReportEvent,
    classify,
)
from berth.logic.agent import HostCaller
from tests.unit.fakes import FakeUsage
from tests.unit.test_workflow_services import NOW, World, _ref

S = JobStatus
MIN = timedelta(minutes=1)


class CostWorld(World):
    """The workflow world with a usage ledger wired into every service."""

    def __init__(self, hosts: int = 1, cloud: bool = False) -> None:
        super().__init__(hosts=hosts)
        self.usage = FakeUsage()
        self.source = replace(self.source, usage=self.usage, cloud_enabled=cloud)
        self.scheduler = replace(self.scheduler, source=self.source, usage=self.usage)
        self.workflow = replace(self.workflow, usage=self.usage)
        self.agent = replace(self.agent, usage=self.usage)  # the last rank's report completes jobs
        self.jobs.usage_ledger = self.usage  # the ended attempt's record goes with the job's write

    def at(self, when: timedelta, host: str | None = None) -> None:
        """Move the clock to NOW + ``when``, the host heartbeating (its lease stays valid)."""
        self.clock.now = NOW + when
        if host is not None:
            self.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest())


# -- the pure model --------------------------------------------------------------------------------


def test_an_on_prem_attempt_costs_the_internal_rate_per_gpu_hour() -> None:
    w = CostWorld()
    job, _ = w.run_to_running(w.submit(gpus=4))
    assert job.placement is not None and job.placement.hourly_usd == 4.0  # 4 GPUs x 1.0 (the default)
    usage = attempt_usage(job, NOW + 90 * MIN)
    assert usage is not None and usage.site is Site.ONPREM and usage.month == "2026-12"
    assert usage.gpu_hours == 6.0 and usage.cost_usd == 6.0 and not usage.final
    assert cost_now(job, NOW + 90 * MIN) == 6.0


def test_a_cloud_attempt_costs_its_placements_hourly_price() -> None:
    w = CostWorld()
    job, _ = w.run_to_running(w.submit(gpus=1))
    cloud = CloudPlacement(
        region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G", hourly_usd=1.006
    )
    job = job.model_copy(update={"placement": cloud, "site": Site.CLOUD})
    usage = attempt_usage(job, NOW + 60 * MIN)
    assert usage is not None and usage.site is Site.CLOUD and usage.location == "us-east-1"
    assert usage.cost_usd == pytest.approx(1.006)


def test_not_started_costs_nothing_and_months_are_utc() -> None:
    w = CostWorld()
    job = w.submit()
    assert attempt_usage(job, NOW) is None and cost_now(job, NOW) == 0.0
    assert month_of(NOW.replace(day=31, month=12, hour=23)) == "2026-12"


def test_accrual_is_bounded_by_the_step_and_the_interval() -> None:
    w = CostWorld()
    job, _ = w.run_to_running(w.submit(gpus=1))
    rates = CostRates(accrual_step_usd=0.05, accrual_interval_s=120)
    assert accrual_due(job, NOW + 2 * MIN, rates) is None  # 0.033 USD: below the step
    assert accrual_due(job, NOW + 6 * MIN, rates) == pytest.approx(0.1)
    written = job.model_copy(update={"cost_usd": 0.1, "run": job.run.with_attempt(cost_at=NOW + 6 * MIN)})
    assert accrual_due(written, NOW + 7 * MIN, rates) is None  # written a minute ago
    assert accrual_due(written, NOW + 10 * MIN, rates) == pytest.approx(1 / 6)


def test_the_cost_limit_stops_a_margin_before_the_limit() -> None:
    w = CostWorld()
    job, _ = w.run_to_running(w.submit(gpus=2, constraints={"max_cost_usd": 1.0}))
    limit = cost_limit(job, NOW + 20 * MIN, margin_s=60)
    assert limit is not None and limit.spent_usd == pytest.approx(2 / 3)
    assert limit.stop_in_s == pytest.approx(600 - 60)
    assert limit.reason == "cost limit max_cost_usd=1.00 reached (0.67 spent)"
    assert cost_limit(w.run_to_running(w.submit())[0], NOW, 60) is None  # no limit set


def test_cost_limit_is_a_permanent_failure() -> None:
    assert classify(Failure.COST_LIMIT) is FailureClass.PERMANENT


# -- accrual and the final cost through the services -------------------------------------------------


def test_a_pass_writes_the_running_cost_and_its_ledger_record() -> None:
    w = CostWorld()
    job, _ = w.run_to_running(w.submit(gpus=2))
    w.at(30 * MIN, "h0")
    assert w.scheduler.run_pass().costs_accrued == 1
    running = w.job(job.id)
    assert running.cost_usd == pytest.approx(1.0) and running.public()["cost_usd"] == 1.0
    assert running.updated_at == job.updated_at  # an accrual is no state change
    [record] = w.usage.month("vision", "2026-12")
    assert record.cost_usd == pytest.approx(1.0) and not record.final
    w.clock.now = NOW + 30 * MIN + timedelta(seconds=20)
    assert w.scheduler.run_pass().costs_accrued == 0  # within the accrual interval: no write


def test_the_final_cost_is_stored_published_and_recorded_once() -> None:
    w = CostWorld()
    job, host = w.run_to_running(w.submit(gpus=1))
    w.clock.now = NOW + 30 * MIN
    w.scheduler.run_pass()
    w.clock.now = NOW + 60 * MIN
    ref = _ref(w.job(job.id))
    w.agent.report(HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    w.workflow.finalize(job.id, 1)
    w.workflow.finalize(job.id, 1)  # a retried task: nothing more
    done = w.job(job.id)
    assert done.status is S.COMPLETED and done.cost_usd == pytest.approx(1.0)
    last = w.jobs.events(job.id)[-1]
    assert done.notification(last)["cost_usd"] == 1.0
    [record] = w.usage.month("vision", "2026-12")
    assert record.final and record.cost_usd == pytest.approx(1.0)
    assert [s.public() for s in by_site(w.usage.month("vision", "2026-12"))] == [
        {"site": "onprem", "gpu_hours": 1.0, "cost_usd": 1.0}
    ]


def test_a_retried_job_adds_its_attempts_costs() -> None:
    w = CostWorld(hosts=2)
    job, _ = w.run_to_running(w.submit(gpus=1, retry={"max_attempts": 3}))
    w.clock.now = NOW + 30 * MIN
    w.workflow.classify_failure(job.id, 1, "Berth.AgentError", "agent crashed")
    assert w.job(job.id).cost_usd == pytest.approx(0.5)
    w.workflow.requeue(job.id)
    w.clock.now = NOW + 40 * MIN
    for host in ("h0", "h1"):
        w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest())
    job, _ = w.run_to_running(w.job(job.id))
    assert job.attempts == 2 and job.cost_usd == pytest.approx(0.5)
    w.clock.now = NOW + 70 * MIN
    w.workflow.classify_failure(job.id, 2, "Berth.NonZeroExit", "exit 1")
    ended = w.job(job.id)
    assert ended.status is S.FAILED and ended.cost_usd == pytest.approx(1.0)
    assert sorted(r.attempt for r in w.usage.month("vision", "2026-12")) == [1, 2]


# -- max_cost_usd ------------------------------------------------------------------------------------


def test_max_cost_usd_stops_the_job_and_fails_it_for_good() -> None:
    w = CostWorld()
    spec = {"constraints": {"max_cost_usd": 0.5}, "retry": {"max_attempts": 3}}
    job, host = w.run_to_running(w.submit(gpus=1, **spec))
    w.at(20 * MIN, host)
    first = w.scheduler.run_pass()
    assert first.cost_limited == 0 and w.job(job.id).run.attempt.stop is None
    w.at(28 * MIN, host)  # 2 minutes left, the stop takes ~7 s: a pass is asked for in time
    assert w.scheduler.run_pass().cost_limited == 0
    wake = [d for r, d in w.trigger.requests if r == "cost limit"]
    assert wake and 100 <= wake[-1] <= 113
    w.at(30 * MIN - timedelta(seconds=5), host)
    assert w.scheduler.run_pass().cost_limited == 1
    stopped = w.job(job.id)
    assert stopped.run.attempt.stop_failure is Failure.COST_LIMIT
    beat = w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[_ref(stopped)]))
    assert beat["directives"][0]["action"] == "stop"
    assert beat["directives"][0]["reason"].startswith("cost limit max_cost_usd=0.50 reached")
    ref = _ref(stopped)
    w.agent.report(
        HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.CANCELED, message="stopped")
    )
    result = w.workflow.classify_failure(job.id, 1, "Berth.Canceled", "stopped")
    failed = w.job(job.id)
    assert result["action"] == "fail" and failed.status is S.FAILED
    assert failed.reason.startswith(
        "CostLimit (permanent): cost limit max_cost_usd=0.50 reached (0.50 spent)"
    )
    assert failed.cost_usd <= 0.5 and w.held() == []


def test_a_requeued_job_is_placed_against_what_is_left_of_its_max_cost() -> None:
    from berth.logic.snapshot import pending_job

    w = CostWorld()
    job = w.submit(constraints={"max_cost_usd": 2.0})
    assert pending_job(job).max_cost_usd == 2.0
    assert pending_job(job.model_copy(update={"cost_usd": 1.5})).max_cost_usd == pytest.approx(0.5)


# -- the monthly cloud budget --------------------------------------------------------------------------


def _cloud_job(w: CostWorld) -> str:
    job = w.submit(gpus=1, constraints={"placement": "cloud"}, expected_duration_minutes=60)
    w.workflow.await_placement(job.id, f"place-{job.id}")
    return job.id


def test_the_ledger_feeds_the_budget_and_a_spent_budget_blocks_bursting() -> None:
    from berth.domain.cost import AttemptUsage
    from berth.scheduler.core import schedule

    w = CostWorld(hosts=0, cloud=True)
    w.tenants.put_quota("vision", Quota(monthly_cloud_budget_usd=1000.0))
    w.usage.record(
        AttemptUsage("vision", "2026-12", "j-old", 1, Site.CLOUD, "us-east-1", 8, 36_000, 100.0, final=True)
    )
    job_id = _cloud_job(w)
    assert w.source.tenant_state("vision").cloud_spend_month_usd == pytest.approx(1000.0)
    snapshot, fleet, _ = w.source.snapshot()
    decisions = schedule(snapshot, fleet.policy, w.clock().timestamp())
    assert decisions.placements == []
    assert "tenant.monthly_budget_usd" in {str(r) for r in decisions.outcomes[job_id].rules}
    w.scheduler.run_pass()
    waiting = w.job(job_id)
    assert waiting.status is S.QUEUED and "tenant.monthly_budget_usd" in waiting.reason
    # Another tenant's spend or another month's does not count.
    assert w.source.tenant_state("nlp").cloud_spend_month_usd == 0.0


def test_with_budget_left_the_same_job_bursts() -> None:
    w = CostWorld(hosts=0, cloud=True)
    w.tenants.put_quota("vision", Quota(monthly_cloud_budget_usd=1000.0))
    job_id = _cloud_job(w)
    w.scheduler.run_pass()
    placed = w.job(job_id)
    assert placed.status is S.STARTING and isinstance(placed.placement, CloudPlacement)
    assert placed.placement.hourly_usd > 0


def test_the_final_usage_record_is_written_with_the_jobs_own_save() -> None:
    """Issue 18: finalize and classify store the attempt's final record in the job's transaction
    (``JobRepository.save(job, event, usage)``), not with a write of its own before it."""
    w = CostWorld()
    direct: list[bool] = []  # final records written other than by the job's save
    original = w.usage.record
    in_save = [False]

    def record(usage: AttemptUsage) -> bool:
        if not in_save[0]:
            direct.append(usage.final)
        return original(usage)

    w.usage.record = record  # type: ignore[method-assign]
    saved: list[Any] = []
    save = w.jobs.save

    def recording_save(job: Any, event: Any, usage: Any = None, releases: Any = ()) -> None:
        saved.append(usage)
        in_save[0] = True
        try:
            save(job, event, usage, releases)
        finally:
            in_save[0] = False

    w.jobs.save = recording_save  # type: ignore[method-assign]
    job, _ = w.run_to_running(w.submit(gpus=2))
    w.at(30 * MIN)
    w.workflow.finalize(job.id, job.attempts)
    assert True not in direct  # the final record went with the job
    finals = [u for u in saved if u is not None]
    assert len(finals) == 1 and finals[0].final and finals[0].seconds == 1800
    [stored] = [r for r in w.usage.month("vision", "2026-12") if r.job_id == job.id]
    assert stored.final and stored.seconds == 1800
