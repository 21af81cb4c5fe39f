"""The workflow's services over the in-memory fakes (which pass the same contract suites as the
DynamoDB repositories): scheduling passes racing or crashing half-way, the failure taxonomy and
retry decisions, and the agent service's fencing."""

from __future__ import annotations

import dataclasses
import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from berth.domain.errors import NotFound, StoreUnavailable
from berth.domain.fleet import HostInventory, InventoryRefused
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import OnPremPlacement
from berth.domain.status import JobStatus
from berth.domain.workflow import (
    AGENT_FAILURES,
    FREE_CLOUD_API_FAILURES,
    Action,
    AttemptRef,
    AttemptReport,
    Backoff,
    Failure,
    FailureClass,
    HeartbeatRequest,
    ReportEvent,
    agent_failure,
    classify,
    failure_from_error,
    retry_decision,
)
from berth.logic.agent import AgentService, AlreadyClaimed, Fenced, HostCaller
from berth.logic.scheduler_service import SchedulerService
from berth.logic.snapshot import SnapshotSource
from berth.logic.workflow import WorkflowService, WorkflowSettings, placement_output
from tests.unit.fakes import FakeDocuments, FakeHosts, FakePlacements, fake_store

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class Tokens:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.causes: dict[str, str] = {}  # token -> the cause its failure was sent with
        self.ended: set[str] = set()

    def succeed(self, token: str, output: dict[str, Any]) -> bool:
        self.calls.append(("succeed", token, output))
        return self._end(token)

    def fail(self, token: str, error: str, cause: str) -> bool:
        self.calls.append(("fail", token, error))
        self.causes[token] = cause
        return self._end(token)

    def heartbeat(self, token: str) -> bool:
        self.calls.append(("heartbeat", token, None))
        return token not in self.ended

    def _end(self, token: str) -> bool:
        if token in self.ended:
            return False
        self.ended.add(token)
        return True

    def of(self, kind: str) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] == kind]


class Queues:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def ensure(self, host_id: str) -> str:
        return f"https://sqs/berth-host-{host_id}"

    def send(self, host_id: str, body: str) -> None:
        self.sent.append((host_id, body))


class Trigger:
    def __init__(self) -> None:
        self.requests: list[tuple[str, int]] = []

    def request(self, reason: str, delay_s: int = 0) -> None:
        self.requests.append((reason, delay_s))


class World:
    def __init__(self, hosts: int = 2, gpus: int = 8) -> None:
        self.jobs, self.tenants = fake_store()
        self.hosts = FakeHosts()
        self.jobs.hosts = self.hosts  # an ended attempt's GPUs go back in the job's write
        self.clock = Clock()
        self.tokens = Tokens()
        self.queues = Queues()
        self.trigger = Trigger()
        self.settings = WorkflowSettings(
            heartbeat_s=6, lease_s=6, outage_tolerance_s=4, fence_margin_s=2, orphan_grace_s=10
        )
        self.source = SnapshotSource(
            self.jobs, self.tenants, self.hosts, FakeDocuments(), self.clock, cloud_enabled=False
        )
        counter = iter(range(10**6))
        self.scheduler = SchedulerService(
            self.source,
            self.jobs,
            self.hosts,
            self.tokens,
            self.trigger,
            self.clock,
            new_token=lambda: f"fence-{next(counter)}",
            settings=self.settings,
            placements=FakePlacements(self.jobs, self.hosts),
            apply_workers=1,  # one placement after the other: a crash lands at a known point
        )
        self.workflow = WorkflowService(
            self.jobs,
            self.hosts,
            self.tokens,
            self.queues,
            self.clock,
            self.settings,
            rng=random.Random(7),
        )
        self.agent = AgentService(
            self.jobs, self.hosts, self.tokens, self.queues, self.trigger, self.clock, self.settings
        )
        for i in range(hosts):
            self.register(f"h{i}", gpus)

    def register(self, host_id: str, gpus: int) -> None:
        self.agent.register(
            HostCaller(host_id, f"arn:host/{host_id}"),
            HostInventory(
                host_id=host_id,
                pool="default",
                gpu_type="A100",
                gpu_ids=tuple(f"GPU-{host_id}-{i}" for i in range(gpus)),
                cpu=64,
                memory_gib=512,
            ),
        )

    def submit(self, gpus: int = 1, **spec: Any) -> Job:
        body = {
            "name": "t",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "A100", "gpus": gpus},
        }
        body.update(spec)
        job, event = new_job(
            new_job_id(self.clock()), "vision", "alice", JobSpec.model_validate(body), self.clock()
        )
        self.jobs.create(job, event, max_active=1000)
        return job

    def job(self, job_id: str) -> Job:
        found = self.jobs.get(job_id)
        assert found is not None
        return found

    def held(self) -> list[str]:
        return [g for h in self.hosts.list_hosts() for hold in h.holds.values() for g in hold.gpu_ids]

    def run_to_running(self, job: Job) -> tuple[Job, str]:
        """Park a placement token, run a pass, dispatch, claim and start: the job is RUNNING."""
        self.workflow.await_placement(job.id, f"place-{job.id}")
        self.scheduler.run_pass()
        placed = self.job(job.id)
        assert placed.status is JobStatus.STARTING
        self.workflow.dispatch_onprem(job.id, placed.attempts, f"dispatch-{job.id}-{placed.attempts}")
        host = _host(placed)
        ref = _ref(self.job(job.id))
        self.agent.claim(HostCaller(host, ""), ref)
        self.agent.report(HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.STARTED))
        return self.job(job.id), host


def _host(job: Job) -> str:
    assert isinstance(job.placement, OnPremPlacement)
    return job.placement.hosts[0].host_id


def _ref(job: Job) -> AttemptRef:
    assert job.run.attempt.fencing_token is not None
    return AttemptRef(job_id=job.id, attempt=job.attempts, fencing_token=job.run.attempt.fencing_token)


# -- the taxonomy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "ran", "expected"),
    [
        ("Berth.HostLost", None, Failure.HOST_LOST),
        ("Berth.NonZeroExit", 5.0, Failure.NONZERO_EXIT),
        ("States.Timeout", 30.0, Failure.HEARTBEAT_TIMEOUT),
        ("States.HeartbeatTimeout", 30.0, Failure.HEARTBEAT_TIMEOUT),
        ("States.Timeout", 4000.0, Failure.TIMEOUT),
        ("States.TaskFailed", None, Failure.AGENT_ERROR),
        ("Berth.Nonsense", None, Failure.AGENT_ERROR),
    ],
)
def test_errors_name_one_failure(error: str, ran: float | None, expected: Failure) -> None:
    assert failure_from_error(error, ran, timeout_s=3600) is expected


def test_every_failure_has_a_class() -> None:
    assert classify(Failure.HOST_LOST) is FailureClass.TRANSIENT
    assert classify(Failure.BAD_IMAGE) is FailureClass.PERMANENT
    assert classify(Failure.NONZERO_EXIT) is FailureClass.PERMANENT
    assert classify(Failure.CANCELED) is FailureClass.CANCELED
    for failure in Failure:
        assert classify(failure) in FailureClass


def test_retry_decisions_bound_attempts_and_back_off() -> None:
    rng = random.Random(1)
    backoff = Backoff(base_s=2, cap_s=30)
    first = retry_decision(Failure.HOST_LOST, "x", 0, 3, False, backoff, rng)
    assert first.action is Action.RETRY and 1 <= first.backoff_s <= 2
    third = retry_decision(Failure.HOST_LOST, "x", 2, 3, False, backoff, rng)
    assert third.action is Action.FAIL and "exhausted" in third.reason
    assert retry_decision(Failure.NONZERO_EXIT, "exit 3", 0, 3, False, backoff, rng).action is Action.FAIL
    assert retry_decision(Failure.HOST_LOST, "x", 0, 3, True, backoff, rng).action is Action.CANCEL
    # Preemption is not the job's fault: it never uses up an attempt.
    preempted = retry_decision(Failure.PREEMPTED, "x", 2, 3, False, backoff, rng)
    assert preempted.action is Action.RETRY and not preempted.counted
    delays = [backoff.delay(n, random.Random(n)) for n in range(1, 12)]
    assert max(delays) <= 30


def test_an_invalid_bundle_report_fails_the_job_for_good() -> None:
    assert agent_failure("invalid_bundle") is Failure.INVALID_BUNDLE
    assert Failure.INVALID_BUNDLE in AGENT_FAILURES
    decision = retry_decision(Failure.INVALID_BUNDLE, "h0: broken", 0, 3, False, Backoff(), random.Random(1))
    assert decision.action is Action.FAIL and decision.reason.startswith("InvalidBundle (permanent)")


def test_the_reason_names_the_real_attempt_after_uncounted_failures() -> None:
    """Four spot interruptions: the next attempt is attempt 5, whatever the counted failures are."""
    rng = random.Random(3)
    fifth = retry_decision(Failure.SPOT_INTERRUPTION, "x", 0, 3, False, Backoff(), rng, attempt=4)
    assert "as attempt 5 (0 of 3 attempts failed, this one not counted)" in fifth.reason
    assert "attempt 1 of 3" not in fifth.reason
    counted = retry_decision(Failure.HOST_LOST, "x", 1, 3, False, Backoff(), rng, attempt=6)
    assert "as attempt 7 (2 of 3 attempts failed)" in counted.reason
    last = retry_decision(Failure.HOST_LOST, "x", 2, 3, False, Backoff(), rng, attempt=7)
    assert "retries exhausted (3 of 3 attempts failed) after attempt 7" in last.reason


def test_cloud_api_errors_back_off_before_they_use_attempts() -> None:
    """A region outage: the first API failures use no attempt and each waits longer than the last."""
    backoff = Backoff(base_s=2, cap_s=300)
    attempts = range(1, FREE_CLOUD_API_FAILURES + 2)
    decisions = [
        retry_decision(
            Failure.CLOUD_API,
            "down",
            0,
            3,
            False,
            backoff,
            random.Random(0),
            attempt=n,
            free_api_failures=n - 1,
        )
        for n in attempts
    ]
    assert [d.counted for d in decisions] == [False] * FREE_CLOUD_API_FAILURES + [True]
    assert all(d.action is Action.RETRY for d in decisions)
    ceilings = [min(300, 2 * 2 ** (n - 1)) for n in attempts]
    assert all(d.backoff_s <= c for d, c in zip(decisions, ceilings, strict=True))
    assert decisions[3].backoff_s > decisions[0].backoff_s  # uniform(2, 16) with this seed, not 2


def test_classify_failure_keeps_the_free_api_failures_on_the_job() -> None:
    w = World()
    job = w.submit()
    free = FREE_CLOUD_API_FAILURES
    for n in range(1, free + 3):
        job, _host = w.run_to_running(job)
        assert job.attempts == n
        w.workflow.classify_failure(job.id, n, Failure.CLOUD_API.error_name, "us-east-1: down")
        after = w.job(job.id)
        assert after.status is JobStatus.RETRYING and f"as attempt {n + 1}" in (after.reason or "")
        assert (after.run.counted_failures, after.run.free_api_failures) == (max(0, n - free), min(n, free))
        w.workflow.requeue(job.id)
        job = w.job(job.id)


def test_a_host_claiming_512_gpus_is_refused_and_changes_nothing() -> None:
    """Finding 8c: an inventory is bounded: at most MAX_HOST_GPUS, and what the host first registered."""
    w = World(hosts=1)
    with pytest.raises(InventoryRefused):
        w.register("h9", 512)
    with pytest.raises(InventoryRefused):
        w.register("h0", 9)  # registered with 8
    assert [(h.host_id, h.gpus) for h in w.hosts.list_hosts()] == [("h0", 8)]


# -- the scheduler service ---------------------------------------------------------------------


def test_a_pass_places_answers_the_token_and_holds_the_gpus() -> None:
    w = World()
    job = w.submit(gpus=2)
    w.workflow.await_placement(job.id, "tok")
    report = w.scheduler.run_pass()
    placed = w.job(job.id)
    assert report.placed == 1 and placed.status is JobStatus.STARTING and placed.attempts == 1
    assert (
        "succeed",
        "tok",
        {"outcome": "placed", "site": "onprem", "attempt": 1, "timeout_s": 86520},
    ) in w.tokens.calls
    assert isinstance(placed.placement, OnPremPlacement) and len(placed.placement.hosts[0].gpu_ids) == 2
    assert sorted(w.held()) == sorted(placed.placement.hosts[0].gpu_ids)


def test_a_placement_token_parked_after_the_pass_is_answered_at_once() -> None:
    w = World()
    job = w.submit()
    w.scheduler.run_pass()  # places before the execution parked its token
    w.workflow.await_placement(job.id, "late")
    assert w.tokens.of("succeed")[-1][1] == "late"


class Executions:
    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, job_id: str, payload: dict[str, Any]) -> None:
        self.started.append(job_id)


# -- the pass the job-events stream asks for may come before WaitForPlacement (issue 18) ----------------
def test_a_pass_that_places_the_job_before_its_token_is_parked_loses_nothing() -> None:
    """The submit's event row asks for a pass (logic/pass_triggers.py), which may place the job
    before its execution's WaitForPlacement parks a token: there is none to answer, the wait answers
    itself at once from the placed job, and the job runs and completes."""
    w = World()
    job = w.submit(gpus=2)
    assert w.scheduler.run_pass().placed == 1
    placed = w.job(job.id)
    assert placed.status is JobStatus.STARTING and placed.run.placement_token is None
    assert w.tokens.of("succeed") == []  # no token to answer yet
    w.workflow.await_placement(job.id, "late")
    assert w.tokens.of("succeed") == [
        ("succeed", "late", {"outcome": "placed", "site": "onprem", "attempt": 1, "timeout_s": 86520})
    ]
    assert w.job(job.id).run.placement_token is None  # answered, not parked
    w.workflow.dispatch_onprem(job.id, 1, "dispatch")
    host = _host(placed)
    ref = _ref(w.job(job.id))
    w.agent.claim(HostCaller(host, ""), ref)
    w.agent.report(HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.STARTED))
    assert w.job(job.id).status is JobStatus.RUNNING
    assert w.workflow.finalize(job.id, 1) == {"status": "COMPLETED"}
    assert w.held() == []


def test_a_token_parked_between_the_pass_read_and_its_write_costs_one_more_pass_soon() -> None:
    """The other order: the pass read the job QUEUED without a token, the wait parks one (a new
    version), the placement's write loses its race and the pass asks for another one a second later,
    which places the job and answers the parked token."""
    w = World()
    job = w.submit()
    w.jobs.before_save = lambda placed: w.workflow.await_placement(job.id, "tok")
    w.trigger.requests.clear()
    assert w.scheduler.run_pass().placed == 0
    assert w.job(job.id).status is JobStatus.QUEUED and w.job(job.id).run.placement_token == "tok"
    assert ("placements lost a race", 1) in w.trigger.requests
    assert w.scheduler.run_pass().placed == 1
    assert [c[1] for c in w.tokens.of("succeed")] == ["tok"]
    assert w.job(job.id).status is JobStatus.STARTING


def test_a_job_placed_before_its_lost_execution_started_gets_one_after_the_grace() -> None:
    """A submit whose StartExecution was lost: the stream's pass places the job before the repair of
    queued jobs (30 s) would have started it. A STARTING job with no token parked and no dispatch,
    unchanged for the orphan grace, gets its execution started; that execution's wait answers itself."""
    w = World()
    executions = Executions()
    w.scheduler = dataclasses.replace(w.scheduler, executions=executions)
    job = w.submit()
    w.scheduler.run_pass()
    assert w.job(job.id).status is JobStatus.STARTING and executions.started == []
    w.clock.now += timedelta(seconds=w.settings.orphan_grace_s - 1)
    w.scheduler.run_pass()
    assert executions.started == []
    w.clock.now += timedelta(seconds=1)
    assert w.scheduler.run_pass().executions_restarted == 1
    assert executions.started == [job.id]
    w.workflow.await_placement(job.id, "restarted")
    assert w.tokens.of("succeed")[-1][1:] == ("restarted", placement_output(w.job(job.id)))
    # once dispatched (or with a token parked), never again
    w.workflow.dispatch_onprem(job.id, 1, "dispatch")
    w.clock.now += timedelta(seconds=w.settings.orphan_grace_s)
    assert w.scheduler.run_pass().executions_restarted == 0


def test_the_workflows_tasks_ask_for_no_pass() -> None:
    """Issue 18: a job's moves to QUEUED and out of a state holding capacity ask for a pass through
    the job-events stream's consumer (logic/pass_triggers.py), once per batch; WaitForPlacement,
    ClassifyFailure and Finalize no longer do (about two SendMessage calls per job)."""
    assert "trigger" not in {f.name for f in dataclasses.fields(WorkflowService)}
    w = World()
    job = w.submit()
    w.run_to_running(job)
    w.trigger.requests.clear()
    assert w.workflow.classify_failure(job.id, 1, "Berth.HostLost", "lease expired")["action"] == "retry"
    assert w.workflow.requeue(job.id) == {"outcome": "queued"}
    w.workflow.await_placement(job.id, "again")
    assert w.trigger.requests == []
    w.scheduler.run_pass()
    w.trigger.requests.clear()
    assert w.workflow.finalize(job.id, 2) == {"status": "COMPLETED"}
    assert w.trigger.requests == []


def test_two_racing_passes_never_give_a_gpu_twice() -> None:
    w = World(hosts=2, gpus=4)
    jobs = [w.submit(gpus=g) for g in (3, 2, 2, 1, 4, 1)]
    for j in jobs:
        w.workflow.await_placement(j.id, f"t-{j.id}")
    barrier = threading.Barrier(2)
    original = w.source.pass_inputs

    def synchronized() -> Any:
        inputs = original()
        barrier.wait(timeout=5)  # both passes decide from the same snapshot
        return inputs

    w.source = w.scheduler.source  # same object
    object.__setattr__(w.scheduler.source, "pass_inputs", synchronized)
    reports: list[Any] = []
    threads = [threading.Thread(target=lambda: reports.append(w.scheduler.run_pass())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = w.held()
    assert len(held) == len(set(held)) <= 8
    placed = [w.job(j.id) for j in jobs if w.job(j.id).status is JobStatus.STARTING]
    assert all(p.attempts == 1 for p in placed)
    assert sum(r.placed for r in reports) == len(placed)
    assert sum(r.skipped for r in reports) >= 1  # the loser of each race skipped, and decides again next pass
    for p in placed:
        assert isinstance(p.placement, OnPremPlacement)
        for h in p.placement.hosts:
            record = w.hosts.get(h.host_id)
            assert record is not None and record.holds[f"{p.id}#1"].gpu_ids == h.gpu_ids


def test_a_pass_crashing_half_way_leaves_the_store_consistent() -> None:
    w = World(hosts=1, gpus=8)
    a, b = w.submit(gpus=4), w.submit(gpus=4)
    for j in (a, b):
        w.workflow.await_placement(j.id, f"t-{j.id}")

    def crash(job: Job) -> None:
        raise RuntimeError("the pass died here")

    object.__setattr__(w.scheduler, "after_apply", crash)
    # One transaction per placement (both share the host: grouped, they would be one write; the kill
    # test of tests/unit/test_parallel_pass.py covers groups)
    object.__setattr__(w.scheduler, "max_group", 1)
    with pytest.raises(RuntimeError):
        w.scheduler.run_pass()
    statuses = sorted(str(w.job(j.id).status) for j in (a, b))
    assert statuses == ["QUEUED", "STARTING"]  # one applied, one not
    assert len(w.held()) == 4  # exactly the applied job's hold
    object.__setattr__(w.scheduler, "after_apply", None)
    w.scheduler.run_pass()  # the next pass redoes what was not applied
    assert {w.job(j.id).status for j in (a, b)} == {JobStatus.STARTING}
    held = w.held()
    assert len(held) == len(set(held)) == 8


def test_a_hold_without_its_job_write_is_released_after_the_grace_period() -> None:
    w = World(hosts=1, gpus=8)
    job = w.submit(gpus=8)
    w.workflow.await_placement(job.id, "t")

    def lose_the_race(_: Job) -> None:  # another writer moves the job just before the placement
        w.jobs.jobs[job.id] = w.job(job.id).updated(NOW)

    w.jobs.before_save = lose_the_race
    report = w.scheduler.run_pass()
    assert report.skipped == 1 and w.held() == []  # the lost transaction held nothing
    # A hold nobody names (left by an older writer) is released after the grace period.
    w.hosts.hold("h0", "j-ghost#1", ("GPU-h0-0",), 1, 1, at=NOW)
    assert w.scheduler.run_pass().orphans_released == 0
    w.clock.now = NOW + timedelta(seconds=11)
    w.hosts.heartbeat("h0", w.clock.now + timedelta(seconds=6))
    w.scheduler.run_pass()
    assert "GPU-h0-0" not in [
        g for h in w.hosts.list_hosts() for x in h.holds.values() for g in x.gpu_ids if x
    ]


def test_lost_hosts_fail_their_attempts_as_host_lost() -> None:
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit())
    w.clock.now = NOW + timedelta(seconds=11)  # past the 6 s lease, inside the 4 + 2 s after it
    assert w.scheduler.run_pass().lost_hosts == []
    assert not any(c[0] == "fail" for c in w.tokens.calls)
    w.clock.now = NOW + timedelta(seconds=13)  # silent past lease + tolerance + margin
    report = w.scheduler.run_pass()
    assert report.lost_hosts == [host]
    assert ("fail", f"dispatch-{job.id}-1", "Berth.HostLost") in w.tokens.calls
    result = w.workflow.classify_failure(job.id, 1, "Berth.HostLost", "lease expired")
    after = w.job(job.id)
    assert result["action"] == "retry" and after.status is JobStatus.RETRYING
    assert after.run.excluded_hosts == (host,) and w.held() == []


# -- the agent service -------------------------------------------------------------------------


def test_a_second_claim_of_the_same_attempt_loses() -> None:
    w = World(hosts=1)
    job = w.submit()
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    w.workflow.dispatch_onprem(job.id, 1, "d")
    assert len(w.queues.sent) == 1
    ref = _ref(w.job(job.id))
    w.agent.claim(HostCaller("h0", ""), ref)
    with pytest.raises(AlreadyClaimed):
        w.agent.claim(HostCaller("h0", ""), ref)


def test_a_host_cannot_read_or_report_on_another_hosts_attempt() -> None:
    w = World(hosts=2)
    job, host = w.run_to_running(w.submit())
    other = "h1" if host == "h0" else "h0"
    ref = _ref(job)
    with pytest.raises(NotFound):
        w.agent.claim(HostCaller(other, ""), ref)
    with pytest.raises(NotFound):
        w.agent.report(HostCaller(other, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    beat = w.agent.heartbeat(HostCaller(other, ""), HeartbeatRequest(attempts=[ref]))
    assert beat["directives"][0]["action"] == "stop"


def test_a_stale_host_is_fenced_after_its_attempt_was_replaced() -> None:
    w = World(hosts=2)
    job, host = w.run_to_running(w.submit())
    stale = _ref(job)
    w.workflow.classify_failure(job.id, 1, "Berth.HostLost", "lease expired")
    w.workflow.requeue(job.id)
    w.workflow.await_placement(job.id, "again")
    w.scheduler.run_pass()
    moved = w.job(job.id)
    assert moved.attempts == 2 and _host(moved) != host  # the failed host is avoided
    with pytest.raises((Fenced, NotFound)):
        w.agent.report(HostCaller(host, ""), AttemptReport(**stale.model_dump(), event=ReportEvent.SUCCEEDED))
    assert w.job(job.id).status is JobStatus.STARTING


def test_a_wrong_fencing_token_is_refused() -> None:
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit())
    forged = AttemptRef(job_id=job.id, attempt=job.attempts, fencing_token="guess")
    with pytest.raises(Fenced):
        w.agent.report(
            HostCaller(host, ""), AttemptReport(**forged.model_dump(), event=ReportEvent.SUCCEEDED)
        )


def test_cancel_directive_reaches_the_running_host() -> None:
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit())
    nxt, event = job.transition(JobStatus.CANCELING, "cancel requested", NOW)
    w.jobs.save(nxt, event)
    beat = w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[_ref(nxt)]))
    assert beat["directives"] == [
        {"job_id": job.id, "attempt": 1, "action": "cancel", "reason": "cancel requested"}
    ]
    w.agent.report(HostCaller(host, ""), AttemptReport(**_ref(nxt).model_dump(), event=ReportEvent.CANCELED))
    assert ("fail", f"dispatch-{job.id}-1", "Berth.Canceled") in w.tokens.calls
    assert w.workflow.classify_failure(job.id, 1, "Berth.Canceled", "stopped")["action"] == "cancel"
    assert w.job(job.id).status is JobStatus.CANCELED and w.held() == []


def test_every_rank_must_succeed() -> None:
    w = World(hosts=2, gpus=8)
    job = w.submit(gpus=16, resources={"gpu_type": "A100", "gpus": 16, "nodes": 2})
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    placed = w.job(job.id)
    assert isinstance(placed.placement, OnPremPlacement) and len(placed.placement.hosts) == 2
    w.workflow.dispatch_onprem(job.id, 1, "d")
    ref = _ref(placed)
    for h in ("h0", "h1"):
        w.agent.claim(HostCaller(h, ""), ref)
    w.agent.report(HostCaller("h0", ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    assert not w.tokens.of("succeed")[1:]  # one rank is not the attempt
    w.agent.report(HostCaller("h1", ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    assert w.tokens.of("succeed")[-1][1] == "d"


def test_a_preempted_attempt_is_stopped_and_requeued_without_using_an_attempt() -> None:
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit(retry={"max_attempts": 1}))
    assert w.scheduler.stop_attempt(job, "preempted for job j-other (priority)")
    beat = w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[_ref(w.job(job.id))]))
    assert beat["directives"][0]["action"] == "stop" and "preempted" in beat["directives"][0]["reason"]
    ref = _ref(w.job(job.id))
    w.agent.report(
        HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.FAILED, failure="preempted")
    )
    result = w.workflow.classify_failure(job.id, 1, "Berth.Preempted", "stopped")
    after = w.job(job.id)
    # max_attempts is 1, yet a preemption is not the job's failure: it goes back to the queue.
    assert result["action"] == "retry" and after.status is JobStatus.RETRYING
    assert after.run.counted_failures == 0 and "Preempted (transient)" in after.reason
    assert w.workflow.requeue(job.id) == {"outcome": "queued"} and w.held() == []


# -- the attempt's credentials ---------------------------------------------------------------------


class RecordingVendor:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, str]] = []

    def assume(self, session_name: str, policy_json: str, seconds: int, source_identity: str) -> Any:
        from berth.domain.ports import JobCredentials

        self.calls.append((session_name, policy_json, seconds, source_identity))
        return JobCredentials("AKIA", "secret", "token", datetime(2030, 1, 1, tzinfo=UTC))


def _with_vendor(w: World) -> RecordingVendor:
    from dataclasses import replace

    from berth.domain.job_access import AccountScope
    from berth.domain.storage import StorageLayout
    from berth.logic.credentials import CredentialService

    vendor = RecordingVendor()
    service = CredentialService(
        StorageLayout("artifacts", "data"), AccountScope("aws", "us-east-1", "1" * 12), w.tenants, vendor
    )
    w.agent = replace(w.agent, vendor=service)
    return vendor


def test_the_claiming_host_gets_its_attempts_scoped_credentials() -> None:
    import json

    w = World(hosts=1)
    vendor = _with_vendor(w)
    job, host = w.run_to_running(w.submit(timeout_minutes=20))
    vendor.calls.clear()  # the claim's own (test_a_claim_answers_with_the_attempts_credentials)
    w.clock.now += timedelta(minutes=2)
    creds = w.agent.credentials(HostCaller(host, ""), _ref(job))
    assert creds == {
        "AccessKeyId": "AKIA",
        "SecretAccessKey": "secret",
        "SessionToken": "token",
        "Expiration": "2030-01-01T00:00:00.000Z",
    }
    ((_, policy, seconds, source),) = vendor.calls
    assert source == job.id
    assert seconds == 18 * 60  # what is left of the attempt's 20 minutes
    assert "arn:aws:s3:::data/vision/" in policy and json.loads(policy)["Statement"]


def test_credentials_are_fenced_like_claims_and_reports() -> None:
    w = World(hosts=2)
    vendor = _with_vendor(w)
    job, host = w.run_to_running(w.submit())
    vendor.calls.clear()
    other = "h1" if host == "h0" else "h0"
    ref = _ref(job)
    with pytest.raises(NotFound):  # another host's attempt reads as missing
        w.agent.credentials(HostCaller(other, ""), ref)
    forged = AttemptRef(job_id=job.id, attempt=job.attempts, fencing_token="guess")
    with pytest.raises(Fenced):
        w.agent.credentials(HostCaller(host, ""), forged)
    stale = AttemptRef(job_id=job.id, attempt=job.attempts - 1 or 99, fencing_token=ref.fencing_token)
    with pytest.raises(Fenced):
        w.agent.credentials(HostCaller(host, ""), stale)
    assert vendor.calls == []


def test_credentials_need_the_claim_first() -> None:
    w = World(hosts=1)
    vendor = _with_vendor(w)
    job = w.submit()
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    w.workflow.dispatch_onprem(job.id, 1, "d")
    with pytest.raises(Fenced):
        w.agent.credentials(HostCaller("h0", ""), _ref(w.job(job.id)))
    assert vendor.calls == []


def _dispatched(w: World) -> tuple[Job, str]:
    job = w.submit(timeout_minutes=20)
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    placed = w.job(job.id)
    w.workflow.dispatch_onprem(job.id, placed.attempts, "d")
    return w.job(job.id), _host(placed)


def test_a_claim_answers_with_the_attempts_credentials() -> None:
    """The agent starting an attempt needs no credentials request of its own: the claim vends them
    (for the attempt's time limit, SourceIdentity the job), and the answer parses as the wire model."""
    from berth.domain.agent_wire import ClaimAnswer

    w = World(hosts=1)
    vendor = _with_vendor(w)
    job, host = _dispatched(w)
    answer = w.agent.claim(HostCaller(host, ""), _ref(job))
    assert answer["credentials"] == {
        "AccessKeyId": "AKIA",
        "SecretAccessKey": "secret",
        "SessionToken": "token",
        "Expiration": "2030-01-01T00:00:00.000Z",
    }
    ((_, _policy, seconds, source),) = vendor.calls
    assert source == job.id and seconds == 20 * 60
    parsed = ClaimAnswer.model_validate(answer)
    assert parsed.credentials is not None and parsed.credentials.wire() == answer["credentials"]
    assert "'secret'" not in repr(parsed) and "'token'" not in repr(parsed) and "AKIA" not in repr(parsed)


def test_a_claim_whose_vending_fails_is_still_answered_without_credentials() -> None:
    """The claim is written before the credentials are vended: STS down must not lose the answer
    (the agent would take the claim for failed, and its retry would find it already claimed)."""
    from berth.domain.errors import StoreUnavailable

    w = World(hosts=1)
    vendor = _with_vendor(w)

    def down(*_a: Any, **_k: Any) -> Any:
        raise StoreUnavailable("sts: throttled")

    vendor.assume = down  # type: ignore[method-assign]
    job, host = _dispatched(w)
    answer = w.agent.claim(HostCaller(host, ""), _ref(job))
    assert "credentials" not in answer and answer["job_id"] == job.id
    assert host in w.job(job.id).run.attempt.claimed


def test_no_job_role_no_credentials() -> None:
    w = World(hosts=1)
    job, host = _dispatched(w)
    assert "credentials" not in w.agent.claim(HostCaller(host, ""), _ref(job))
    job, host = w.run_to_running(w.submit())
    with pytest.raises(NotFound):
        w.agent.credentials(HostCaller(host, ""), _ref(job))


# -- drain ---------------------------------------------------------------------------------------


def test_a_host_whose_agent_drains_gets_no_new_work() -> None:
    w = World(hosts=2)
    w.agent.heartbeat(HostCaller("h0", ""), HeartbeatRequest(draining=True))
    assert w.hosts.hosts["h0"].draining
    for _ in range(3):
        job = w.submit()
        w.workflow.await_placement(job.id, f"t-{job.id}")
        w.scheduler.run_pass()
        assert _host(w.job(job.id)) == "h1"
    w.register("h0", 8)  # the agent restarted: a new agent is not draining
    assert not w.hosts.hosts["h0"].draining


def test_an_operators_drain_is_a_directive_until_lifted() -> None:
    w = World(hosts=2)
    job, host = w.run_to_running(w.submit())
    other = "h1" if host == "h0" else "h0"
    w.agent.request_drain(host)
    beat = w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[_ref(job)]))
    # its running attempt goes on (no stop); the host is told to drain, in every answer
    assert beat["directives"] == [
        {"job_id": None, "attempt": None, "action": "drain", "reason": "an operator asked this host to drain"}
    ]
    w.register(host, 8)  # an agent restart does not end an operator's drain
    again = w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[_ref(job)]))
    assert [d["action"] for d in again["directives"]] == ["drain"]
    nxt = w.submit()
    w.workflow.await_placement(nxt.id, "t-next")
    w.scheduler.run_pass()
    assert _host(w.job(nxt.id)) == other
    assert w.job(job.id).status is JobStatus.RUNNING
    w.agent.request_drain(host, drain=False)
    assert ("host " + host + " undrained", 0) in w.trigger.requests
    assert w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest())["directives"] == []
    with pytest.raises(NotFound):
        w.agent.request_drain("nope")


def test_canceling_a_running_cloud_job_asks_for_a_pass_at_once() -> None:
    from berth.domain.placement import CloudPlacement
    from berth.logic.workflow import WorkflowHooks

    w = World()
    job = w.submit()
    cloud = CloudPlacement(region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G")
    running, _ = job.transition(JobStatus.STARTING, "placed", NOW, placement=cloud)
    running, _ = running.transition(JobStatus.RUNNING, "running", NOW)
    canceling, _ = running.transition(JobStatus.CANCELING, "canceled by alice", NOW)
    hooks = WorkflowHooks(w.tokens, None, trigger=w.trigger)
    w.trigger.requests.clear()
    hooks.canceled(running, canceling)
    assert w.trigger.requests == [(f"job {job.id} canceling", 0)]
    # an on-prem job's agent hears it at its next heartbeat: no pass needed
    onprem, _ = job.transition(JobStatus.STARTING, "placed", NOW)
    onprem, _ = onprem.transition(JobStatus.RUNNING, "running", NOW)
    hooks.canceled(onprem, onprem.transition(JobStatus.CANCELING, "canceled", NOW)[0])
    assert len(w.trigger.requests) == 1


# -- releasing an ended attempt's GPUs (issue 18) -------------------------------------------------------
def test_an_ended_attempt_releases_the_gpus_its_placement_names_and_a_stale_one_reads() -> None:
    """Finalize and classify release each host's hold with the GPUs the attempt's placement names (the
    store then needs no read of the host); a classify of an attempt that is not the job's current one
    passes none (its placement is another attempt's)."""
    w = World()
    released: list[tuple[str, str, Any]] = []
    original = w.hosts.release

    def recording(host_id: str, attempt: str, gpu_ids: Any = None) -> bool:
        released.append((host_id, attempt, gpu_ids))
        return original(host_id, attempt, gpu_ids)

    w.hosts.release = recording  # type: ignore[method-assign]
    job, host = w.run_to_running(w.submit(gpus=2))
    placement = job.placement
    assert isinstance(placement, OnPremPlacement)
    w.workflow.finalize(job.id, job.attempts)
    assert released == [(host, f"{job.id}#{job.attempts}", placement.hosts[0].gpu_ids)]
    assert w.job(job.id).status is JobStatus.COMPLETED and w.held() == []

    released.clear()
    other, _ = w.run_to_running(w.submit(gpus=1))
    w.workflow.classify_failure(other.id, other.attempts + 1, "Berth.NonZeroExit", "exit 1")
    assert [gpu_ids for _, _, gpu_ids in released] == [None]


def test_a_started_report_sends_no_token_heartbeat_the_agents_heartbeats_do() -> None:
    """The start is written (RUNNING) without a SendTaskHeartbeat of its own: the agent heartbeats
    the attempt from its claim on, and each of its heartbeats keeps the dispatch token alive (one per
    beat: the state's HeartbeatSeconds then counts from the agent's last beat, the invariant its own
    outage tolerance and the lease reaper are sized against)."""
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit())
    assert job.status is JobStatus.RUNNING
    assert w.tokens.of("heartbeat") == []
    for _ in range(3):
        w.agent.heartbeat(HostCaller(host, ""), HeartbeatRequest(attempts=[_ref(job)]))
        w.clock.now += timedelta(seconds=2)
    assert [c[1] for c in w.tokens.of("heartbeat")] == [f"dispatch-{job.id}-{job.attempts}"] * 3


def test_a_teams_grants_are_read_once_per_sandbox_for_the_cache_time_and_each_time_without() -> None:
    """Vending credentials reads the team's grants (a GetItem of its record); a sandbox keeps them for
    ``grants_cache_s``, so a claim does not read them again per attempt. 0 reads them every time."""
    from berth.domain.job_access import AccountScope
    from berth.domain.storage import StorageLayout
    from berth.logic.credentials import CredentialService

    w = World(hosts=1)
    job = w.submit()
    reads: list[str] = []

    class CountingTenants:
        def __getattr__(self, name: str) -> Any:
            return getattr(w.tenants, name)

        def grants(self, tenant: str) -> Any:
            reads.append(tenant)
            return w.tenants.grants(tenant)

    for cache_s, expected in ((30.0, 1), (0.0, 3)):
        reads.clear()
        service = CredentialService(
            StorageLayout("artifacts", "data"),
            AccountScope("aws", "us-east-1", "1" * 12),
            CountingTenants(),  # type: ignore[arg-type]
            RecordingVendor(),
            grants_cache_s=cache_s,
        )
        for attempt in (1, 2, 3):
            service.for_attempt(job, attempt, 600)
        assert reads == [job.tenant] * expected


def test_the_last_ranks_success_report_completes_the_job_and_finalize_has_nothing_left() -> None:
    """The report's own write is the COMPLETED transition (cost and event with it), the GPUs are
    released, and the token says ``completed`` so the execution skips Finalize; a Finalize run
    anyway (an older state machine, a redelivered task) changes nothing."""
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit(gpus=2))
    w.clock.now += timedelta(minutes=3)
    w.agent.report(HostCaller(host, ""), AttemptReport(**_ref(job).model_dump(), event=ReportEvent.SUCCEEDED))
    done = w.job(job.id)
    assert done.status is JobStatus.COMPLETED and done.reason == "completed (attempt 1)"
    assert done.cost_usd > 0 and done.run.attempt.dispatch_token is None
    assert w.held() == []
    (_, token, output), *_ = [c for c in w.tokens.of("succeed") if c[1].startswith("dispatch-")]
    assert token == f"dispatch-{job.id}-1" and output["completed"] is True
    events = [e.to for e in w.jobs.events(job.id)]
    assert w.workflow.finalize(job.id, 1) == {"status": "COMPLETED"}
    assert [e.to for e in w.jobs.events(job.id)] == events and events[-1] is JobStatus.COMPLETED
    assert w.job(job.id).version == done.version


def test_a_success_before_any_start_report_is_left_to_finalize() -> None:
    """A job still STARTING when its success comes (its start report lost) needs its RUNNING event
    first: the report only notes the rank and the token says not completed; Finalize does both."""
    w = World(hosts=1)
    job = w.submit()
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    w.workflow.dispatch_onprem(job.id, 1, "d")
    ref = _ref(w.job(job.id))
    host = _host(w.job(job.id))
    w.agent.claim(HostCaller(host, ""), ref)
    w.agent.report(HostCaller(host, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    assert w.job(job.id).status is JobStatus.STARTING
    assert w.tokens.of("succeed")[-1][1:] == (
        "d",
        {"result": "succeeded", "exit_code": 0, "completed": False},
    )
    w.workflow.finalize(job.id, 1)
    assert [e.to for e in w.jobs.events(job.id)][-2:] == [JobStatus.RUNNING, JobStatus.COMPLETED]
    assert w.held() == []


def test_a_gang_completes_with_its_last_ranks_report_only() -> None:
    w = World(hosts=2, gpus=8)
    job = w.submit(gpus=16, resources={"gpu_type": "A100", "gpus": 16, "nodes": 2})
    w.workflow.await_placement(job.id, "t")
    w.scheduler.run_pass()
    w.workflow.dispatch_onprem(job.id, 1, "d")
    ref = _ref(w.job(job.id))
    for h in ("h0", "h1"):
        w.agent.claim(HostCaller(h, ""), ref)
        w.agent.report(HostCaller(h, ""), AttemptReport(**ref.model_dump(), event=ReportEvent.STARTED))
    w.agent.report(HostCaller("h0", ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    assert w.job(job.id).status is JobStatus.RUNNING and len(w.held()) == 16  # both hosts, 8 GPUs each
    w.agent.report(HostCaller("h1", ""), AttemptReport(**ref.model_dump(), event=ReportEvent.SUCCEEDED))
    assert w.job(job.id).status is JobStatus.COMPLETED and w.held() == []
    assert w.tokens.of("succeed")[-1][2]["completed"] is True


def test_the_completion_gives_the_gpus_back_in_its_own_write_and_a_hold_gone_is_left() -> None:
    """The last rank's report completes the job and frees its GPUs in one write (no release after
    it); a hold the reaper already released is left as it is, and the job completes all the same."""
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit())
    separate: list[str] = []
    original = w.hosts.release

    def recording(host_id: str, attempt: str, gpu_ids: Any = None) -> bool:
        separate.append(attempt)
        return original(host_id, attempt, gpu_ids)

    # the job repository's own handle on the hosts (its transaction); the services' handle records
    w.jobs.hosts = type("Tx", (), {"lock": w.hosts.lock, "release": staticmethod(original)})()
    w.hosts.release = recording  # type: ignore[method-assign]
    w.agent.report(HostCaller(host, ""), AttemptReport(**_ref(job).model_dump(), event=ReportEvent.SUCCEEDED))
    assert w.job(job.id).status is JobStatus.COMPLETED and w.held() == [] and separate == []

    other, host = w.run_to_running(w.submit())
    original(host, f"{other.id}#1")  # the reaper was first
    w.agent.report(
        HostCaller(host, ""), AttemptReport(**_ref(other).model_dump(), event=ReportEvent.SUCCEEDED)
    )
    assert w.job(other.id).status is JobStatus.COMPLETED and w.held() == []
    assert w.tokens.of("succeed")[-1][2]["completed"] is True


def test_a_dispatch_that_timed_out_after_the_report_completed_the_job_ends_done() -> None:
    """The report completed the job but its token answer was lost: the dispatch's heartbeat times out
    and ClassifyFailure finds the job COMPLETED: ``done``, nothing retried, nothing released twice."""
    w = World(hosts=1)
    job, host = w.run_to_running(w.submit())

    def down(*_a: Any, **_k: Any) -> bool:
        raise StoreUnavailable("sfn down")

    w.tokens.succeed = down  # type: ignore[method-assign]
    success = AttemptReport(**_ref(job).model_dump(), event=ReportEvent.SUCCEEDED)
    with pytest.raises(StoreUnavailable):
        w.agent.report(HostCaller(host, ""), success)
    assert w.job(job.id).status is JobStatus.COMPLETED and w.held() == []
    with pytest.raises(Fenced):  # the agent's retry: the attempt has ended
        w.agent.report(HostCaller(host, ""), success)
    decision = w.workflow.classify_failure(job.id, 1, "States.HeartbeatTimeout", "no heartbeat")
    assert decision == {"action": "done", "backoff_s": 0}
    assert w.job(job.id).status is JobStatus.COMPLETED
