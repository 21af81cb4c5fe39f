"""A job's logs and metrics for its owner (``GET /v1/jobs/{id}/logs`` and ``/metrics``).

Both pass the very tenant check of ``GET /v1/jobs/{id}`` (``JobService.get``): another tenant's job
answers 404 like a missing one, and only then is its tenant's log group or its samples read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from berth.domain.errors import ValidationFailed
from berth.domain.job import Job
from berth.domain.observability import LOG_GROUP_PREFIX, attempt_log_source, iso_ms, log_group, summarize
from berth.domain.ports import LogReader, MetricsRepository
from berth.domain.tenancy import Caller
from berth.logic.jobs import JobService

MAX_LOG_LIMIT = 1000
DEFAULT_LOG_LIMIT = 200
MAX_METRICS_LIMIT = 1000
#: Most samples the summary is computed over (an attempt sampled every 10 s for 27 hours).
MAX_SUMMARY_SAMPLES = 10_000


@dataclass(frozen=True)
class ObservabilityService:
    jobs: JobService
    log_reader: LogReader
    #: None where the deployment keeps no samples (then every attempt has none).
    metric_store: MetricsRepository | None
    log_group_prefix: str = LOG_GROUP_PREFIX

    def logs(
        self,
        caller: Caller,
        job_id: str,
        attempt: int | None = None,
        since_ms: int | None = None,
        limit: int = DEFAULT_LOG_LIMIT,
        next_token: str | None = None,
        rank: int | None = None,
    ) -> dict[str, Any]:
        """A page of an attempt's output (default: the latest attempt), oldest first. ``next_token``
        continues a page of the same attempt; ``status`` tells a follower when the job has ended.
        A cloud attempt whose stream AWS Batch has not named yet gives an empty page and ``reason``.
        ``rank``: a gang's node (default: the main node, rank 0); one outside the job's ``nodes`` is
        refused (``ValidationFailed``)."""
        job = self.jobs.get(caller, job_id)
        n = _attempt(job, attempt)
        _check_rank(job, rank)
        out: dict[str, Any] = {
            "job_id": job.id,
            "attempt": n,
            "rank": rank if rank is not None else 0,
            "attempts": job.attempts,
            "status": str(job.status),
            "events": [],
            "next_token": None,
            "reason": None,
        }
        if n is None:  # never started: nothing printed yet
            out["reason"] = "the job has not started"
            return out
        source = attempt_log_source(job, n, rank)
        out["reason"] = source.reason
        if source.stream is None:
            return out
        page = self.log_reader.read(
            log_group(job.tenant, self.log_group_prefix),
            source.stream,
            since_ms,
            next_token,
            max(1, min(limit, MAX_LOG_LIMIT)),
        )
        out["events"] = [{"at": iso_ms(e.at), "message": e.message, "attempt": n} for e in page.events]
        out["next_token"] = page.next_token
        return out

    def metrics(
        self, caller: Caller, job_id: str, attempt: int | None = None, limit: int = MAX_METRICS_LIMIT
    ) -> dict[str, Any]:
        """An attempt's latest ``limit`` samples (default: the latest attempt) and a summary over
        all of them (at most ``MAX_SUMMARY_SAMPLES``, the latest)."""
        job = self.jobs.get(caller, job_id)
        n = _attempt(job, attempt)
        stored = (
            []
            if n is None or self.metric_store is None
            else self.metric_store.samples(job.id, n, MAX_SUMMARY_SAMPLES)
        )
        shown = stored[-max(1, min(limit, MAX_METRICS_LIMIT)) :]
        return {
            "job_id": job.id,
            "attempt": n,
            "attempts": job.attempts,
            "status": str(job.status),
            "samples": [s.public() for s in shown],
            "summary": summarize(stored),
        }


def _check_rank(job: Job, rank: int | None) -> None:
    nodes = job.spec.resources.nodes
    if rank is not None and not 0 <= rank < nodes:
        raise ValidationFailed(
            f"job {job.id} runs on {nodes} node(s), ranks 0 to {nodes - 1}; rank {rank} does not exist",
            details={"nodes": nodes},
        )


def _attempt(job: Job, attempt: int | None) -> int | None:
    if attempt is None:
        return job.attempts or None
    if attempt > job.attempts:
        raise ValidationFailed(
            f"job {job.id} has made {job.attempts} attempt(s); attempt {attempt} does not exist",
            details={"attempts": job.attempts},
        )
    return attempt
