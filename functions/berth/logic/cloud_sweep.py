"""The scheduler pass's watch over cloud attempts (docs/workflow.md, "The cloud branch").

Each pass looks at every placed cloud attempt through DescribeJobs (100 ids a call, per region):
- a canceled or stopped (preempted, repatriated) attempt's Batch job is terminated;
- an attempt waiting for an instance longer than ``runnable_timeout_s`` is terminated and fails as
  ``Capacity`` (transient, not counted; its region is excluded and the (region, instance type)
  circuit gets a failure);
- a dispatched attempt with no Batch job after ``submit_grace_s`` gets its submit request again (a
  lost message; the submit is idempotent); one whose Batch job Batch no longer knows fails as
  ``CloudApiError`` and is re-placed;
- a Batch outcome whose event was missed (none came within ``event_grace_s`` of its ``stoppedAt``) is
  reconciled as the event would have been (and the log stream Batch named for the attempt is recorded
  on the job if it is not yet); a younger one is left to its event, so the token is answered once;
- an attempt waiting for an instance whose Batch job names why (``CAPACITY:INSUFFICIENT_INSTANCE_
  CAPACITY - ...`` in a RUNNABLE job's ``statusReason``) gets that reason on the job, with an event,
  each time it changes: the wait is visible while it lasts, not only once it timed out;
- a region whose API fails counts a region-wide circuit failure; an attempt not yet running in a
  region whose circuit the core holds open fails as ``CloudApiError`` and is re-placed elsewhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from berth.domain.cloud import (
    REGION_WIDE,
    TERMINATED_BY_BERTH,
    BatchJob,
    CloudError,
)
from berth.domain.errors import Conflict
from berth.domain.job import Job
from berth.domain.placement import CloudPlacement
from berth.domain.status import JobStatus
from berth.domain.workflow import Failure
from berth.logic.cloud_dispatch import CloudDispatchService, cloud_attempt, submit_request

S = JobStatus
#: DescribeJobs takes at most 100 ids.
DESCRIBE_BATCH = 100
#: The most of Batch's reason a waiting job's reason quotes.
WAIT_REASON_CHARS = 200


@dataclass
class SweepReport:
    watched: int = 0
    terminated: int = 0
    capacity_timeouts: int = 0
    resubmitted: int = 0
    lost: int = 0
    reconciled: int = 0
    region_errors: list[str] = field(default_factory=list)
    failed_over: int = 0
    waits_noted: int = 0


@dataclass(frozen=True)
class CloudSweep:
    service: CloudDispatchService

    def run(
        self, jobs: Iterable[Job], now: datetime, region_open: Callable[[str], bool] = lambda _r: False
    ) -> SweepReport:
        report = SweepReport()
        by_region: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            placement = cloud_attempt(job)
            if placement is not None:
                by_region[placement.region].append(job)
        for region, placed in sorted(by_region.items()):
            report.watched += len(placed)
            ids = [j.run.attempt.batch_job_id for j in placed if j.run.attempt.batch_job_id]
            try:
                described = self._describe(region, ids)
            except CloudError:
                report.region_errors.append(region)
                self.service.circuits.record_failure(region, REGION_WIDE, now.timestamp())
                if region_open(region):
                    report.failed_over += self._fail_over(placed, region)
                continue
            for job in placed:
                self._watch(job, described, now, report, region_open(region))
        return report

    def _describe(self, region: str, ids: list[str]) -> dict[str, BatchJob]:
        out: dict[str, BatchJob] = {}
        for i in range(0, len(ids), DESCRIBE_BATCH):
            for bj in self.service.batch.describe(region, ids[i : i + DESCRIBE_BATCH]):
                out[bj.batch_job_id] = bj
        return out

    def _fail_over(self, placed: list[Job], region: str) -> int:
        """Attempts not yet running in a region whose API is down (circuit open) go elsewhere. A
        running one keeps its instance (an API outage does not stop containers); its outcome is
        reconciled once the region answers again."""
        moved = 0
        for job in placed:
            token = job.run.attempt.dispatch_token
            if job.status is S.STARTING and token:
                cause = f"{region}: the region's Batch API is failing (circuit open)"
                moved += int(self.service.tokens.fail(token, Failure.CLOUD_API.error_name, cause))
        return moved

    def _watch(
        self, job: Job, described: dict[str, BatchJob], now: datetime, report: SweepReport, open_: bool
    ) -> None:
        svc = self.service
        placement = job.placement
        assert isinstance(placement, CloudPlacement)
        token = job.run.attempt.dispatch_token
        batch_id = job.run.attempt.batch_job_id
        bj = described.get(batch_id) if batch_id else None
        if job.status is S.CANCELING or job.run.attempt.stop:
            if batch_id is None and token and job.status is S.CANCELING:
                # Canceled before its submit was recorded (its request may be lost): end it.
                if (now - job.updated_at).total_seconds() >= svc.settings.submit_grace_s:
                    try:
                        svc.cancel_unrecorded(job)
                    except CloudError:
                        return
            elif bj is not None and not bj.status.is_terminal:
                why = "canceled" if job.status is S.CANCELING else f"stopped: {job.run.attempt.stop}"
                self._terminate(job, bj.batch_job_id, why, report)
            elif bj is not None and not self._event_due(bj, now):
                report.reconciled += int(svc.reconcile(job, bj) in ("failed", "succeeded"))
            return
        if batch_id is None:
            waited = (now - job.updated_at).total_seconds()
            if token and open_ and job.status is S.STARTING:
                cause = f"{placement.region}: circuit open before the Batch job was submitted"
                report.failed_over += int(svc.tokens.fail(token, Failure.CLOUD_API.error_name, cause))
            elif token and waited >= svc.settings.submit_grace_s:
                svc.submits.send(submit_request(job))
                report.resubmitted += 1
            return
        submitted = job.run.attempt.submitted_at or job.updated_at
        waited = (now - submitted).total_seconds()
        if bj is None:
            if token and waited >= svc.settings.submit_grace_s:
                cause = f"{placement.region}: Batch no longer knows job {batch_id}"
                report.lost += int(svc.tokens.fail(token, Failure.CLOUD_API.error_name, cause))
            return
        if bj.status.is_queued and waited >= svc.settings.runnable_timeout_s:
            cause = (
                f"{placement.region} {placement.instance_type}: no instance after {int(waited)} s "
                f"({bj.status.value}{': ' + bj.status_reason if bj.status_reason else ''})"
            )
            if token and svc.tokens.fail(token, Failure.CAPACITY.error_name, cause):
                svc.circuits.record_failure(placement.region, placement.instance_type, now.timestamp())
                report.capacity_timeouts += 1
            self._terminate(job, bj.batch_job_id, "no capacity", report)
            return
        if bj.status.is_queued and bj.status_reason and job.status is S.STARTING:
            self._note_wait(job, bj, placement, now, report)
            return
        if self._event_due(bj, now):
            return  # its own state-change event answers the token (once)
        if bj.status.is_terminal or (bj.status.value == "RUNNING" and job.status is S.STARTING):
            report.reconciled += int(svc.reconcile(job, bj) in ("failed", "succeeded", "running"))
        elif bj.log_stream and job.run.log_stream_of(job.attempts) is None:
            svc.record_log_stream(job, bj)  # its event was missed: the logs route needs the stream

    def _note_wait(
        self, job: Job, bj: BatchJob, placement: CloudPlacement, now: datetime, report: SweepReport
    ) -> None:
        """Put Batch's reason for the wait on the job (and in its events) when it is new."""
        why = bj.status_reason.strip()[:WAIT_REASON_CHARS]
        where = f"{placement.region} {placement.instance_type}"
        reason = f"waiting for an instance in {where} ({bj.status.value}: {why})"
        if job.reason == reason:
            return
        nxt, event = job.noted(reason, now)
        try:
            self.service.jobs.save(nxt, event)
        except Conflict:
            return  # the job moved meanwhile: the next pass looks again
        report.waits_noted += 1

    def _event_due(self, bj: BatchJob, now: datetime) -> bool:
        """A Batch outcome younger than ``event_grace_s``: its state-change event is on its way."""
        if not bj.status.is_terminal or bj.stopped_at is None:
            return False
        return (now - bj.stopped_at).total_seconds() < self.service.settings.event_grace_s

    def _terminate(self, job: Job, batch_job_id: str, why: str, report: SweepReport) -> None:
        region = job.placement.region if isinstance(job.placement, CloudPlacement) else ""
        try:
            self.service.batch.terminate(region, batch_job_id, TERMINATED_BY_BERTH + why, job.tenant)
        except CloudError:
            return  # the next pass tries again
        report.terminated += 1


__all__ = ["CloudSweep", "SweepReport"]
