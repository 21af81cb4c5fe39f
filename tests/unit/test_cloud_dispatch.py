"""The cloud branch over the in-memory fakes: dispatch and idempotent submit (duplicate deliveries, a
crash between SubmitJob and the job write, throttling), Batch outcomes mapped into the taxonomy,
stale events, the sweep (capacity waits, cancel, lost submits, missed events), circuits and failover."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from berth.domain.cloud import (
    BatchJob,
    BatchStatus,
    CloudSettings,
    CloudThrottled,
    SubmitRequest,
    batch_job_name,
    failed_outcome,
    job_definition_name,
    parse_batch_job_name,
    record_circuit_event,
)
from berth.domain.job import Job
from berth.domain.placement import CloudPlacement
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller, Role
from berth.domain.workflow import Failure
from berth.logic.cloud_dispatch import CloudDispatchService
from berth.logic.cloud_sweep import CloudSweep
from berth.logic.fleet import FleetService
from berth.logic.snapshot import SnapshotSource
from berth.scheduler.circuit import CircuitBoard, CircuitState
from berth.scheduler.policy import CircuitRule
from tests.unit.fakes import FakeBatch, FakeCircuits, FakeDocuments, FakeSubmitQueue
from tests.unit.test_workflow_services import World

S = JobStatus


class CloudWorld(World):
    """The workflow world with no on-prem hosts, cloud offers on, and the cloud branch wired."""

    def __init__(self, runnable_timeout_s: int = 600) -> None:
        super().__init__(hosts=0)
        self.batch = FakeBatch()
        self.circuits = FakeCircuits()
        self.submits = FakeSubmitQueue()
        self.source = SnapshotSource(
            self.jobs,
            self.tenants,
            self.hosts,
            FakeDocuments(),
            self.clock,
            cloud_enabled=True,
            circuits=self.circuits,
        )
        self.cloud = CloudDispatchService(
            self.jobs,
            self.tokens,
            self.batch,
            self.submits,
            self.circuits,
            self.clock,
            CloudSettings(
                artifacts_bucket="art",
                data_bucket="data",
                account="123456789012",
                runnable_timeout_s=runnable_timeout_s,
            ),
        )
        self.scheduler = dataclasses.replace(self.scheduler, source=self.source, cloud=CloudSweep(self.cloud))

    def place(self, **spec: Any) -> Job:
        job = self.submit(constraints={"placement": "cloud", **spec.pop("constraints", {})}, **spec)
        self.workflow.await_placement(job.id, f"place-{job.id}")
        self.scheduler.run_pass()
        placed = self.job(job.id)
        assert placed.status is S.STARTING and isinstance(placed.placement, CloudPlacement)
        return placed

    def dispatch(self, job: Job) -> str:
        token = f"dispatch-{job.id}-{job.attempts}"
        self.cloud.dispatch(job.id, job.attempts, token)
        return token

    def deliver(self) -> list[str]:
        """Each queued request delivered once, ``first`` as the handler would pass it on a first
        delivery (``batch_submit.first_delivery``)."""
        out = []
        for r in self.submits.take():
            first = r.dedup_id in self.submits.firsts
            self.submits.firsts.discard(r.dedup_id)
            out.append(self.cloud.submit(r, first=first))
        return out

    def fail_next_job_write(self, error: Exception) -> None:
        """The next write of a job raises ``error`` (the Lambda dying after SubmitJob, a lost race);
        the writes after it go through."""
        original = self.jobs.update
        failed: list[str] = []

        def once(j: Job) -> None:
            if not failed:
                failed.append(j.id)
                raise error
            original(j)

        self.jobs.update = once  # type: ignore[method-assign]

    def batch_id(self, job_id: str) -> str:
        found = self.job(job_id).run.attempt.batch_job_id
        assert found is not None
        return found

    def failures_of(self, token: str) -> list[str]:
        return [c[2] for c in self.tokens.calls if c[0] == "fail" and c[1] == token]

    def classify(self, job: Job, token: str) -> dict[str, Any]:
        (error,) = self.failures_of(token)
        return self.workflow.classify_failure(job.id, job.attempts, error, "")


def _placement(job: Job) -> CloudPlacement:
    assert isinstance(job.placement, CloudPlacement)
    return job.placement


# -- names and the submission ------------------------------------------------------------------------


def test_names_round_trip_and_definitions_are_per_image_and_tenant() -> None:
    assert batch_job_name("j-0abc", 3) == "j-0abc-a3"
    assert parse_batch_job_name("j-0abc-a3") == ("j-0abc", 3)
    assert parse_batch_job_name("someone-elses-job") is None
    a = job_definition_name("busybox", "vision")
    assert a == job_definition_name("busybox", "vision") and a.startswith("berth-img-")
    assert a != job_definition_name("busybox:2", "vision") and a != job_definition_name("busybox", "nlp")


def test_dispatch_parks_the_token_and_the_submit_carries_the_attempt() -> None:
    w = CloudWorld()
    job = w.place(env={"LR": "0.1"}, timeout_minutes=30)
    token = w.dispatch(job)
    assert w.job(job.id).run.attempt.dispatch_token == token
    assert w.deliver() == ["submitted"]
    (sub,) = w.batch.submitted
    p = _placement(job)
    assert (sub.region, sub.queue, sub.name) == (p.region, p.queue, f"{job.id}-a1")
    assert sub.image == "busybox" and sub.command == ("true",)
    assert sub.environment["LR"] == "0.1" and sub.environment["BERTH_JOB_ID"] == job.id
    assert sub.environment["BERTH_ATTEMPT"] == "1" and sub.environment["BERTH_TENANT"] == "vision"
    assert "BERTH_LAUNCH" in sub.environment
    assert sub.timeout_s == 1800 and sub.gpus == 1
    assert sub.job_role == "arn:aws:iam::123456789012:role/Berth-job-vision"
    assert sub.tags["BERTH_TENANT"] == "vision"
    stored = w.job(job.id)
    assert stored.run.attempt.batch_job_id == "batch-1" and stored.run.attempt.submitted_at == w.clock()


def test_a_code_bundle_runs_the_launcher_in_the_base_image() -> None:
    w = CloudWorld()
    digest = "a" * 64
    job = w.submit(
        image=None,
        code=f"sha256:{digest}",
        command=["python", "train.py"],
        constraints={"placement": "cloud"},
    )
    w.workflow.await_placement(job.id, "p")
    w.scheduler.run_pass()
    w.dispatch(w.job(job.id))
    w.deliver()
    (sub,) = w.batch.submitted
    assert sub.command == ("python", "-m", "berth_agent.launch")
    assert sub.image == CloudSettings().base_image
    import json

    launch = json.loads(sub.environment["BERTH_LAUNCH"])
    assert launch["code"] == {
        "uri": f"s3://art/bundles/vision/sha256/{digest}.tar.gz",
        "digest": f"sha256:{digest}",
    }
    # the launcher in the container accepts what the dispatcher wrote (it once got a bare hex digest)
    from berth_agent.launch import LaunchSpec

    assert LaunchSpec.parse(sub.environment["BERTH_LAUNCH"]).code_digest == digest
    assert launch["command"] == ["python", "train.py"]
    assert launch["outputs"] == {"bucket": "data", "prefix": f"vision/jobs/{job.id}/"}


def test_a_duplicate_delivery_never_submits_twice() -> None:
    w = CloudWorld()
    job = w.place()
    w.dispatch(job)
    request = SubmitRequest(job_id=job.id, attempt=1)
    assert [w.cloud.submit(request), w.cloud.submit(request)] == ["submitted", "exists"]
    assert len(w.batch.submitted) == 1


def test_a_crash_between_submit_and_the_job_write_is_found_by_name() -> None:
    w = CloudWorld()
    job = w.place()
    w.dispatch(job)
    w.fail_next_job_write(RuntimeError("the Lambda died after SubmitJob"))
    with pytest.raises(RuntimeError):
        w.cloud.submit(SubmitRequest(job_id=job.id, attempt=1))
    assert w.job(job.id).run.attempt.batch_job_id is None and len(w.batch.submitted) == 1
    # SQS delivers the message again: the Batch job is found by name and adopted.
    assert w.cloud.submit(SubmitRequest(job_id=job.id, attempt=1)) == "submitted"
    assert len(w.batch.submitted) == 1 and w.batch_id(job.id) == "batch-1"


def test_throttling_keeps_the_request_and_nothing_changes() -> None:
    w = CloudWorld()
    job = w.place()
    token = w.dispatch(job)
    request = SubmitRequest(job_id=job.id, attempt=1)
    w.batch.throttle_next = 1
    with pytest.raises(CloudThrottled):
        w.cloud.submit(request)
    assert w.job(job.id).run.attempt.batch_job_id is None and not w.failures_of(token)
    # Throttled beyond the backoff is part of the region's signal (one failure, not an open circuit).
    assert [(e.region, e.instance_type, len(e.failures)) for e in w.circuits.list()] == [
        (_placement(job).region, "*", 1)
    ]
    assert w.cloud.submit(request) == "submitted"


def test_the_submit_handler_returns_throttled_messages_to_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    from berth.handlers import batch_submit

    w = CloudWorld()
    first, second = w.place(), w.place()
    w.dispatch(first)
    w.dispatch(second)
    monkeypatch.setattr(batch_submit, "cloud_dispatch_service", lambda: w.cloud)
    w.batch.throttle_next = 1

    def record(i: int, job: Job) -> dict[str, Any]:
        body = SubmitRequest(job_id=job.id, attempt=1).model_dump_json()
        return {
            "messageId": f"m{i}",
            "receiptHandle": "r",
            "body": body,
            "attributes": {"MessageGroupId": job.id, "MessageDeduplicationId": f"d{i}"},
            "messageAttributes": {},
            "md5OfBody": "",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q.fifo",
            "awsRegion": "us-east-1",
        }

    class Ctx:
        function_name, memory_limit_in_mb, aws_request_id = "f", 128, "req"
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:f"

    out = batch_submit.lambda_handler({"Records": [record(1, first), record(2, second)]}, Ctx())  # type: ignore[arg-type]
    assert out["batchItemFailures"] == [{"itemIdentifier": "m1"}]
    assert (
        w.job(first.id).run.attempt.batch_job_id is None
        and w.job(second.id).run.attempt.batch_job_id is not None
    )
    # Redelivered later: submitted once.
    out = batch_submit.lambda_handler({"Records": [record(1, first)]}, Ctx())  # type: ignore[arg-type]
    assert out["batchItemFailures"] == [] and len(w.batch.submitted) == 2


def test_a_canceled_attempt_is_never_submitted() -> None:
    w = CloudWorld()
    job = w.place()
    token = w.dispatch(job)
    fresh = w.job(job.id)
    w.jobs.save(*fresh.transition(S.CANCELING, "canceling", w.clock()))
    assert w.deliver() == ["canceled"]
    assert w.batch.submitted == [] and w.failures_of(token) == [Failure.CANCELED.error_name]
    assert w.classify(job, token)["action"] == "cancel"


# -- outages and circuits --------------------------------------------------------------------------


def test_a_region_outage_fails_over_elsewhere_and_opens_the_circuit() -> None:
    w = CloudWorld()
    job = w.place()
    region = _placement(job).region
    w.batch.down.add(region)
    token = w.dispatch(job)
    assert w.deliver() == ["failed"]
    assert w.failures_of(token) == [Failure.CLOUD_API.error_name]
    assert w.classify(job, token)["action"] == "retry"
    assert w.job(job.id).run.excluded_regions == (region,)
    w.workflow.requeue(job.id)
    w.workflow.await_placement(job.id, "again")
    w.scheduler.run_pass()
    again = w.job(job.id)
    assert again.status is S.STARTING and _placement(again).region != region
    assert again.run.attempt.batch_job_id is None and again.attempts == 2
    # Two more failed submits there (other jobs): the region's circuit opens; capacity shows it.
    for _ in range(2):
        other = w.place(constraints={"regions": [region]})
        w.dispatch(other)
        w.deliver()
    now = w.clock().timestamp()
    board = CircuitBoard(w.source.fleet().circuits, now, CircuitRule())
    assert board.state(region, "p4d.24xlarge") is CircuitState.OPEN
    admin = Caller(principal="arn:aws:iam::1:user/admin", tenant="platform", role=Role.ADMIN)
    rows = {r["region"]: r for r in FleetService(w.source).capacity(admin)["cloud"]["regions"]}
    assert rows[region]["circuit"] == "open"
    assert {r["circuit"] for name, r in rows.items() if name != region} == {"closed"}
    # Half-open after open_s; a success closes it.
    w.clock.now += timedelta(seconds=CircuitRule().open_s + 1)
    board = CircuitBoard(w.source.fleet().circuits, w.clock().timestamp(), CircuitRule())
    assert board.state(region, "*") is CircuitState.HALF_OPEN
    w.batch.down.clear()
    w.circuits.record_success(region, "*", w.clock().timestamp())
    board = CircuitBoard(w.source.fleet().circuits, w.clock().timestamp(), CircuitRule())
    assert board.state(region, "*") is CircuitState.CLOSED


def test_both_regions_down_opens_their_circuits_before_the_job_uses_an_attempt() -> None:
    """Finding 9: both regions a job may use have their Batch API down. Its failed submits back off
    (longer each time) and use none of its attempts; once both circuits are open it waits, queued."""
    w = CloudWorld()
    regions = ["us-east-1", "us-west-2"]
    w.batch.down.update(regions)
    job = w.place(constraints={"regions": regions})
    backoffs = []
    for _ in range(12):
        token = w.dispatch(job)
        assert w.deliver() == ["failed"]
        out = w.classify(job, token)
        assert out["action"] == "retry"
        backoffs.append(out["backoff_s"])
        w.workflow.requeue(job.id)
        w.workflow.await_placement(job.id, f"again-{len(backoffs)}")
        w.scheduler.run_pass()
        job = w.job(job.id)
        if job.status is not S.STARTING:
            break
    assert job.status is S.QUEUED and job.run.counted_failures == 0, job.reason
    board = CircuitBoard(w.source.fleet().circuits, w.clock().timestamp(), CircuitRule())
    assert {board.state(r, "*") for r in regions} == {CircuitState.OPEN}
    assert max(backoffs) > backoffs[0]  # backed off, not every 2 s


def test_circuit_records_prune_and_successes_without_failures_cost_no_write() -> None:
    assert record_circuit_event({}, "us-east-1", "*", 100.0, failed=False) is None
    c = record_circuit_event({}, "us-east-1", "*", 100.0, failed=True)
    assert c is not None
    c = record_circuit_event(c, "us-east-1", "*", 5000.0, failed=True)
    assert c is not None and c["us-east-1|*"]["failures"] == [5000.0]  # the old one pruned
    c = record_circuit_event(c, "us-east-1", "*", 5001.0, failed=False)
    assert c is not None and c["us-east-1|*"]["last_success_at"] == 5001.0
    assert record_circuit_event(c, "us-east-1", "*", 5002.0, failed=False) is None


def test_an_open_region_fails_over_attempts_not_yet_running() -> None:
    w = CloudWorld()
    job = w.place()
    region = _placement(job).region
    token = w.dispatch(job)
    w.deliver()  # submitted; still RUNNABLE when the region's API goes down
    w.batch.down.add(region)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.region_errors == [region]
    assert report.cloud.failed_over == 0  # one failed lookup does not open the circuit
    now = w.clock().timestamp()
    for i in range(2):
        w.circuits.record_failure(region, "*", now - i - 1)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.failed_over == 1
    assert w.failures_of(token) == [Failure.CLOUD_API.error_name]


# -- Batch outcomes ---------------------------------------------------------------------------------


def _submitted(w: CloudWorld, **spec: Any) -> tuple[Job, str, str]:
    job = w.place(**spec)
    token = w.dispatch(job)
    w.deliver()
    return w.job(job.id), token, w.batch_id(job.id)


def test_running_then_succeeded_completes_the_job() -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.RUNNING)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "running"
    running = w.job(job.id)
    assert running.status is S.RUNNING and running.run.attempt.started_at == w.clock()
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "running"  # a duplicate event changes nothing
    w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "succeeded"
    assert ("succeed", token, {"result": "succeeded", "exit_code": 0}) in w.tokens.calls
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "answered"
    assert w.workflow.finalize(job.id, 1) == {"status": "COMPLETED"}


def test_the_event_is_never_trusted_describe_decides() -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w)
    # An event claiming success while Batch says RUNNABLE answers nothing.
    w.batch.set(bid, BatchStatus.RUNNABLE)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "waiting"
    assert not [c for c in w.tokens.calls if c[1] == token]


@pytest.mark.parametrize(
    ("reason", "exit_code", "failure", "counted", "circuit"),
    [
        ("Host EC2 (instance i-0abc) terminated.", None, Failure.SPOT_INTERRUPTION, False, "p4d.24xlarge"),
        ("CAPACITY_UNAVAILABLE: no p4d", None, Failure.CAPACITY, False, "p4d.24xlarge"),
        ("Essential container in task exited", 3, Failure.NONZERO_EXIT, True, None),
        ("Essential container in task exited", 124, Failure.TIMEOUT, True, None),
        # the cloud's fault with no reason: the (region, instance type) circuit, and the job's first
        # API failures use up none of its attempts
        ("", None, Failure.CLOUD_API, False, "p4d.24xlarge"),
    ],
)
def test_failed_batch_jobs_map_into_the_taxonomy(
    reason: str, exit_code: int | None, failure: Failure, counted: bool, circuit: str | None
) -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.FAILED, reason=reason, exit_code=exit_code)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "failed"
    assert w.failures_of(token) == [failure.error_name]
    region = _placement(job).region
    recorded = {(e.region, e.instance_type) for e in w.circuits.list() if e.failures}
    assert recorded == (set() if circuit is None else {(region, circuit)})
    w.workflow.classify_failure(job.id, 1, failure.error_name, reason)
    after = w.job(job.id)
    assert after.run.counted_failures == (1 if counted else 0)
    permanent = failure in (Failure.NONZERO_EXIT, Failure.TIMEOUT)
    assert after.status is (S.FAILED if permanent else S.RETRYING)


@pytest.mark.parametrize(
    ("reason", "failure", "circuit"),
    [
        (
            "CannotStartContainerError: Error response from daemon: failed to create shim task: OCI runtime "
            'create failed: runc create failed: unable to start container process: exec: "trian.py": '
            "executable file not found in $PATH: unknown",
            Failure.BAD_IMAGE,
            None,
        ),
        ("CannotPullContainerError: pull access denied for nosuch/image", Failure.BAD_IMAGE, None),
        (
            "CannotStartContainerError: OCI runtime create failed: nvidia-container-cli: initialization "
            "error: driver error: failed to process request",
            Failure.CLOUD_API,
            "p4d.24xlarge",
        ),
        (
            "CannotInspectContainerError: Could not transition to inspecting",
            Failure.CLOUD_API,
            "p4d.24xlarge",
        ),
    ],
)
def test_a_container_that_cannot_start_is_the_jobs_fault_only_when_the_job_caused_it(
    reason: str, failure: Failure, circuit: str | None
) -> None:
    """A missing executable or image is the job's mistake: permanent, and no circuit of any region
    hears of it (the same error on-prem is permanent too). The instance's own trouble counts against
    its (region, instance type) circuit only, never the whole region's."""
    w = CloudWorld()
    job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.FAILED, reason=reason)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "failed"
    assert w.failures_of(token) == [failure.error_name]
    recorded = {(e.region, e.instance_type) for e in w.circuits.list() if e.failures}
    assert recorded == (set() if circuit is None else {(_placement(job).region, circuit)})
    w.classify(job, token)
    after = w.job(job.id)
    assert after.status is (S.FAILED if failure is Failure.BAD_IMAGE else S.RETRYING)
    if failure is Failure.BAD_IMAGE:
        assert after.reason is not None and after.reason.startswith("BadImage (permanent)")


def test_the_launchers_broken_bundle_exit_is_invalid_bundle_only_for_code_jobs() -> None:
    p = CloudPlacement(region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G")
    exited = BatchJob(
        "b", "j-a1", BatchStatus.FAILED, status_reason="Essential container in task exited", exit_code=66
    )
    bundle = failed_outcome(exited, p, launcher=True)
    assert bundle.failure is Failure.INVALID_BUNDLE and bundle.circuit is None
    assert failed_outcome(exited, p, launcher=False).failure is Failure.NONZERO_EXIT  # an image's own 66


def test_one_teams_missing_executable_leaves_every_region_open() -> None:
    """Finding 9: three jobs whose command does not exist fail; no circuit opens anywhere."""
    w = CloudWorld()
    missing = 'CannotStartContainerError: exec: "nope": executable file not found in $PATH'
    for _ in range(3):
        job, token, bid = _submitted(w)
        w.batch.set(bid, BatchStatus.FAILED, reason=missing)
        w.cloud.on_event(bid, f"{job.id}-a1")
        w.classify(job, token)
        assert w.job(job.id).status is S.FAILED
    board = CircuitBoard(w.source.fleet().circuits, w.clock().timestamp(), CircuitRule())
    assert board.state(_placement(job).region, _placement(job).instance_type) is CircuitState.CLOSED
    assert not [e for e in w.circuits.list() if e.failures]


def test_a_spot_interruption_retries_without_using_an_attempt() -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w, constraints={"spot": "allowed"})
    w.batch.set(bid, BatchStatus.FAILED, reason="Host EC2 (instance i-1) terminated.")
    w.cloud.on_event(bid, f"{job.id}-a1")
    assert w.classify(job, token)["action"] == "retry"
    after = w.job(job.id)
    assert after.status is S.RETRYING and after.run.counted_failures == 0


def test_stale_events_are_ignored_and_their_batch_job_stopped() -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w)
    # Attempt 1 fails (capacity), the job is re-placed as attempt 2.
    w.batch.set(bid, BatchStatus.FAILED, reason="CAPACITY_UNAVAILABLE")
    w.cloud.on_event(bid, f"{job.id}-a1")
    w.classify(job, token)
    w.workflow.requeue(job.id)
    w.workflow.await_placement(job.id, "p2")
    w.scheduler.run_pass()
    second = w.job(job.id)
    token2 = w.dispatch(second)
    w.deliver()
    bid2 = w.batch_id(job.id)
    assert bid2 != bid
    # A late event of attempt 1 (even a "success") changes nothing of attempt 2.
    w.batch.set(bid, BatchStatus.SUCCEEDED)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "stale"
    assert not [c for c in w.tokens.calls if c[1] == token2]
    # A Batch job of an old attempt still alive is terminated.
    w.batch.set(bid, BatchStatus.RUNNING)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "stale"
    assert w.batch.terminated[-1][0] == bid
    # Someone else's Batch job is none of Berth's business.
    assert w.cloud.on_event("x", "not-berths") == "foreign"


def test_an_event_that_beats_the_submit_write_adopts_the_batch_job() -> None:
    w = CloudWorld()
    job = w.place()
    w.dispatch(job)
    p = _placement(job)
    from berth.domain.cloud import submission

    bid = w.batch.submit(submission(w.job(job.id), p, w.cloud.settings))
    w.batch.set(bid, BatchStatus.RUNNING)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "running"
    assert w.batch_id(job.id) == bid
    assert w.deliver() == ["exists"] and len(w.batch.submitted) == 1


# -- the sweep ------------------------------------------------------------------------------------


def test_an_attempt_waiting_for_capacity_too_long_is_stopped_and_re_placed() -> None:
    w = CloudWorld(runnable_timeout_s=600)
    job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.RUNNABLE)
    w.clock.now += timedelta(seconds=599)
    w.scheduler.run_pass()
    assert not w.failures_of(token)
    w.clock.now += timedelta(seconds=2)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.capacity_timeouts == 1
    assert w.failures_of(token) == [Failure.CAPACITY.error_name]
    assert w.batch.terminated == [(bid, "Berth: no capacity")]
    p = _placement(job)
    assert [(e.region, e.instance_type) for e in w.circuits.list()] == [(p.region, p.instance_type)]
    assert w.classify(job, token)["action"] == "retry"
    assert w.job(job.id).run.excluded_regions == (p.region,)
    # Its FAILED event (terminated by Berth) arrives later: stale, nothing recorded twice.
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "stale"
    assert len(w.circuits.list()[0].failures) == 1


def test_batchs_capacity_reason_shows_on_the_job_and_in_its_events_while_it_waits() -> None:
    """Finding 9: a RUNNABLE job's ``statusReason`` (no capacity) is the job's reason, with an event,
    while it waits; once per reason, not once per pass."""
    w = CloudWorld(runnable_timeout_s=600)
    job, token, bid = _submitted(w)
    why = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Service cannot fulfill the capacity requested"
    w.batch.set(bid, BatchStatus.RUNNABLE, reason=why)
    w.clock.now += timedelta(seconds=60)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.waits_noted == 1
    waiting = w.job(job.id)
    p = _placement(job)
    assert waiting.status is S.STARTING and why in waiting.reason
    assert waiting.reason.startswith(f"waiting for an instance in {p.region} {p.instance_type} (RUNNABLE")
    events = w.jobs.events(job.id)
    assert events[-1].reason == waiting.reason and events[-1].to is S.STARTING
    w.clock.now += timedelta(seconds=60)
    assert w.scheduler.run_pass().cloud.waits_noted == 0  # type: ignore[union-attr]
    assert len(w.jobs.events(job.id)) == len(events)
    assert not w.failures_of(token)  # still waiting: nothing failed


def test_cancel_terminates_the_batch_job_and_ends_canceled() -> None:
    w = CloudWorld()
    job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.RUNNING)
    w.cloud.on_event(bid, f"{job.id}-a1")
    running = w.job(job.id)
    w.jobs.save(*running.transition(S.CANCELING, "canceling", w.clock()))
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.terminated == 1
    assert w.batch.terminated == [(bid, "Berth: canceled")]
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "failed"
    assert w.failures_of(token) == [Failure.CANCELED.error_name]
    assert w.circuits.list() == []  # a cancel is not the cloud's fault
    assert w.classify(job, token)["action"] == "cancel"
    assert w.job(job.id).status is S.CANCELED


def test_a_cancel_racing_a_submit_terminates_what_was_submitted() -> None:
    w = CloudWorld()
    job = w.place()
    token = w.dispatch(job)
    original = w.jobs.update

    def cancel_meanwhile(j: Job) -> None:
        # SubmitJob went through; the job was canceled before the Batch job id was written.
        w.jobs.update = original  # type: ignore[method-assign]
        fresh = w.job(job.id)
        w.jobs.save(*fresh.transition(S.CANCELING, "canceling", w.clock()))
        original(j)

    w.jobs.update = cancel_meanwhile  # type: ignore[method-assign]
    assert w.deliver() == ["canceled"]
    (bid,) = w.batch.jobs
    assert w.batch.terminated == [(bid, "Berth: canceled")]
    assert w.failures_of(token) == [Failure.CANCELED.error_name]


def test_a_cancel_whose_submit_request_was_lost_still_ends() -> None:
    w = CloudWorld()
    job = w.place()
    token = w.dispatch(job)
    w.submits.take()  # lost
    fresh = w.job(job.id)
    w.jobs.save(*fresh.transition(S.CANCELING, "canceling", w.clock()))
    w.scheduler.run_pass()
    assert not w.failures_of(token)
    w.clock.now += timedelta(seconds=w.cloud.settings.submit_grace_s + 1)
    w.scheduler.run_pass()
    assert w.failures_of(token) == [Failure.CANCELED.error_name] and w.batch.submitted == []


def test_a_missed_event_is_reconciled_by_the_sweep() -> None:
    w = CloudWorld()
    _job, token, bid = _submitted(w)
    w.batch.set(bid, BatchStatus.SUCCEEDED, exit_code=0)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.reconciled == 1
    assert ("succeed", token, {"result": "succeeded", "exit_code": 0}) in w.tokens.calls


def test_a_lost_submit_request_is_sent_again_and_a_lost_batch_job_re_placed() -> None:
    w = CloudWorld()
    job = w.place()
    token = w.dispatch(job)
    w.submits.take()  # the message is lost
    w.submits.seen.clear()  # past SQS's deduplication window
    w.submits.firsts.clear()
    w.clock.now += timedelta(seconds=w.cloud.settings.submit_grace_s + 1)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.resubmitted == 1
    assert not w.submits.firsts  # a resend is never a first send: its delivery looks the job up
    assert w.deliver() == ["submitted"] and w.batch.lookups == 1
    bid = w.batch_id(job.id)
    del w.batch.jobs[bid]  # Batch forgot it
    w.clock.now += timedelta(seconds=w.cloud.settings.submit_grace_s + 1)
    report = w.scheduler.run_pass()
    assert report.cloud is not None and report.cloud.lost == 1
    assert w.failures_of(token) == [Failure.CLOUD_API.error_name]


def test_failed_outcome_reads_the_reason_not_the_event() -> None:
    p = CloudPlacement(region="us-east-1", queue="q", instance_type="g5.xlarge", gpu_type="A10G")
    job = BatchJob("b", "j-a1", BatchStatus.FAILED, status_reason="Berth: canceled")
    assert failed_outcome(job, p).failure is Failure.CANCELED and failed_outcome(job, p).circuit is None
    pull = BatchJob("b", "j-a1", BatchStatus.FAILED, status_reason="CannotPullContainerError: no such image")
    assert failed_outcome(pull, p).failure is Failure.BAD_IMAGE


# -- the first delivery of the dispatch's request submits without ListJobs (issue 18) ------------------


def test_the_dispatchs_first_delivery_submits_without_looking_the_job_up() -> None:
    """One ListJobs less per job: the dispatch's own request, delivered for the first time, cannot
    find a Batch job of its attempt (nothing else submits it before it), so it submits at once."""
    w = CloudWorld()
    job = w.place()
    w.dispatch(job)
    assert [r.dedup_id for r in w.submits.messages] == list(w.submits.firsts)
    assert w.deliver() == ["submitted"]
    assert w.batch.lookups == 0 and len(w.batch.submitted) == 1


def test_a_redelivery_still_looks_first() -> None:
    """A crash between SubmitJob and the job's write: the redelivery (not first) finds the job by name
    (the sweep's resend, never sent first: ``test_a_lost_submit_request_is_sent_again...``)."""
    w = CloudWorld()
    job = w.place()
    w.dispatch(job)
    w.fail_next_job_write(RuntimeError("the Lambda died after SubmitJob"))
    request = SubmitRequest(job_id=job.id, attempt=1)
    with pytest.raises(RuntimeError):
        w.cloud.submit(request, first=True)
    assert w.cloud.submit(request) == "submitted"
    assert len(w.batch.submitted) == 1 and w.batch.lookups == 1 and w.batch_id(job.id) == "batch-1"


def test_a_first_try_that_loses_its_race_looks_before_submitting_again() -> None:
    """The job moved between the read and the write (a lost race): the next try of the same delivery
    finds the Batch job the first try submitted, never submits a second."""
    w = CloudWorld()
    job = w.place()
    w.dispatch(job)
    from berth.domain.errors import Conflict

    w.fail_next_job_write(Conflict("another writer moved the job"))
    assert w.cloud.submit(SubmitRequest(job_id=job.id, attempt=1), first=True) == "submitted"
    assert len(w.batch.submitted) == 1 and w.batch.lookups == 1 and w.batch_id(job.id) == "batch-1"


@pytest.mark.parametrize(
    ("attributes", "receives", "first"),
    [
        ({"berth-first": {"stringValue": "1", "dataType": "String"}}, "1", True),
        ({"berth-first": {"stringValue": "1", "dataType": "String"}}, "2", False),
        ({}, "1", False),
    ],
)
def test_only_a_marked_request_received_once_is_a_first_delivery(
    attributes: dict[str, Any], receives: str, first: bool
) -> None:
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

    from berth.handlers.batch_submit import first_delivery

    record = SQSRecord(
        {
            "messageId": "m",
            "body": "{}",
            "attributes": {"ApproximateReceiveCount": receives},
            "messageAttributes": attributes,
        }
    )
    assert first_delivery(record) is first
