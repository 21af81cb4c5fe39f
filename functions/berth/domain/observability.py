"""Job logs and metrics: where an attempt's output lives, what a usage sample is, and the summary the
API shows. Pure (docs/observability.md).

Logs: the agent ships an on-prem attempt's stdout and stderr to CloudWatch Logs, group
``/berth/jobs/<tenant>``, stream ``<job_id>/<attempt>``: the same names the attempt's scoped credentials
allow (``berth.domain.job_access``), so a tenant's output can only land under its own prefix. A cloud
attempt's output goes to the same group (its Batch job definition's ``awslogs-group``), in the stream
AWS Batch names itself (``<awslogs-stream-prefix>/default/<ECS task id>``); the control plane learns
that name from DescribeJobs once the container starts and keeps it on the job (``attempt_log_source``).

Metrics: the agent samples each running attempt (GPU utilisation and memory through NVML, the job's
process group's CPU and resident memory from ``/proc``) and sends bounded batches of samples to the
agent API with the attempt's fencing token; the control plane stores them per (job, attempt, time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from berth.domain.errors import InvalidRequest
from berth.domain.job import Job
from berth.domain.placement import CloudPlacement
from berth.domain.status import JobStatus
from berth.domain.workflow import AttemptRef

LOG_GROUP_PREFIX = "/berth/jobs"
#: Most samples one ``POST /v1/agent/metrics`` may carry (an agent sends every few seconds).
MAX_SAMPLES_PER_BATCH = 120
#: Most GPUs one sample may describe (one host's GPUs given to the attempt).
MAX_GPUS_PER_SAMPLE = 16
#: How far ahead of the control plane's clock a sample's time may be (host clock skew).
MAX_CLOCK_SKEW_S = 300
#: How long stored samples are kept (the table's TTL).
METRICS_RETENTION_DAYS = 30


def log_group(tenant: str, prefix: str = LOG_GROUP_PREFIX) -> str:
    return f"{prefix}/{tenant}"


def log_stream(job_id: str, attempt: int) -> str:
    """``<job id>/<attempt>``; an array task's ``:`` becomes ``_`` (CloudWatch refuses ``:``)."""
    return f"{job_id.replace(':', '_')}/{attempt}"


#: What CloudWatch Logs accepts as a stream name: 1 to 512 characters, no ``:`` or ``*``.
_MAX_STREAM_NAME = 512


def is_log_stream_name(name: str | None) -> bool:
    return bool(name) and len(name or "") <= _MAX_STREAM_NAME and not set(name or "") & {":", "*"}


#: Why a cloud attempt's page is empty while its stream is not known.
STREAM_PENDING_REASON = (
    "attempt {attempt} waits for its Batch job to start: AWS Batch names the log stream when the "
    "container starts"
)
STREAM_NEVER_REASON = (
    "attempt {attempt} was placed in the cloud but AWS Batch reported no log stream for it (its "
    "container did not start)"
)
#: Why a cloud gang's node ``rank`` has no page (``?rank=N``), and the note on an on-prem gang's page.
RANK_PENDING_REASON = (
    "rank {rank} of attempt {attempt} has no log stream yet: AWS Batch names each node's stream when "
    "that node's container starts"
)
RANK_NEVER_REASON = "AWS Batch reported no log stream for rank {rank} of attempt {attempt}"
ONPREM_RANKS_REASON = (
    "attempt {attempt} ran on-prem, where every rank of the gang writes the attempt's one stream: "
    "this is all ranks' output"
)
#: The statuses in which the current attempt may still start.
_MAY_START = (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELING)


@dataclass(frozen=True, slots=True)
class LogSource:
    """Where to read an attempt's output: ``stream`` in the tenant's group, or nothing yet (``stream``
    None) and ``reason`` why."""

    stream: str | None
    reason: str | None = None


def attempt_log_source(job: Job, attempt: int, rank: int | None = None) -> LogSource:
    """The stream of ``attempt`` of ``job``: the one AWS Batch named (recorded on the job) for a cloud
    attempt, ``<job_id>/<attempt>`` (written by the agent) otherwise. The current attempt in the cloud
    has no stream until its container starts: then none, with the reason.

    ``rank`` (a gang's node, already checked to be one of the job's ``nodes``): in the cloud each node
    of the multi-node parallel job has a stream of its own (recorded from its own events); on-prem the
    ranks' agents all write the attempt's one stream, which is served with a reason saying so. None
    (and 0) is the main node's, the gang's default."""
    if rank:
        return _rank_log_source(job, attempt, rank)
    recorded = job.run.log_stream_of(attempt)
    if recorded is not None:
        return LogSource(recorded)
    if attempt == job.attempts and isinstance(job.placement, CloudPlacement):
        template = STREAM_PENDING_REASON if job.status in _MAY_START else STREAM_NEVER_REASON
        return LogSource(None, template.format(attempt=attempt))
    # An on-prem attempt (or an earlier cloud attempt that never started: an empty page either way).
    return LogSource(log_stream(job.id, attempt))


def _rank_log_source(job: Job, attempt: int, rank: int) -> LogSource:
    recorded = job.run.log_stream_of(attempt, rank)
    if recorded is not None:
        return LogSource(recorded)
    in_cloud = job.run.log_stream_of(attempt) is not None or (
        attempt == job.attempts and isinstance(job.placement, CloudPlacement)
    )
    if in_cloud:
        template = RANK_PENDING_REASON if job.status in _MAY_START else RANK_NEVER_REASON
        return LogSource(None, template.format(attempt=attempt, rank=rank))
    return LogSource(log_stream(job.id, attempt), ONPREM_RANKS_REASON.format(attempt=attempt))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSample(_Model):
    uuid: Annotated[str, Field(min_length=1, max_length=96)]
    utilization_pct: Annotated[float, Field(ge=0, le=100)]
    memory_used_mib: Annotated[int, Field(ge=0, le=16 * 1024 * 1024)]
    memory_total_mib: Annotated[int, Field(ge=0, le=16 * 1024 * 1024)] = 0
    #: Memory the job's own processes hold on the GPU (NVML's running processes).
    job_memory_mib: Annotated[int, Field(ge=0, le=16 * 1024 * 1024)] = 0


class MetricSample(_Model):
    at: AwareDatetime
    #: CPU of the job's process group since the previous sample (100 = one core).
    cpu_pct: Annotated[float, Field(ge=0, le=100_000)]
    rss_mib: Annotated[float, Field(ge=0, le=1024 * 1024 * 1024)]
    processes: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    gpus: Annotated[list[GpuSample], Field(max_length=MAX_GPUS_PER_SAMPLE)] = Field(default_factory=list)

    @property
    def gpu_util_pct(self) -> float | None:
        """The mean utilisation over the attempt's GPUs on this host (None without NVML)."""
        if not self.gpus:
            return None
        return sum(g.utilization_pct for g in self.gpus) / len(self.gpus)

    @property
    def gpu_mem_used_mib(self) -> int | None:
        if not self.gpus:
            return None
        return sum(g.memory_used_mib for g in self.gpus)


class MetricsBatch(AttemptRef):
    """``POST /v1/agent/metrics``: samples of one attempt on the calling host, oldest first."""

    samples: Annotated[list[MetricSample], Field(min_length=1, max_length=MAX_SAMPLES_PER_BATCH)]


class StoredSample(_Model):
    """A sample as stored and served: which host (rank) of which attempt took it."""

    attempt: int
    host_id: str
    sample: MetricSample

    def public(self) -> dict[str, object]:
        s = self.sample
        return {
            "at": iso_ms(s.at),
            "attempt": self.attempt,
            "host_id": self.host_id,
            "gpu_util_pct": None if s.gpu_util_pct is None else round(s.gpu_util_pct, 1),
            "gpu_mem_used_mib": s.gpu_mem_used_mib,
            "cpu_pct": round(s.cpu_pct, 1),
            "rss_mib": round(s.rss_mib, 1),
            "processes": s.processes,
            "gpus": [g.model_dump(mode="json") for g in s.gpus],
        }


def summarize(samples: list[StoredSample]) -> dict[str, float | int | None]:
    """Averages and peaks over ``samples``; GPU figures are None when no sample had a GPU reading."""
    gpu_utils = [u for s in samples if (u := s.sample.gpu_util_pct) is not None]
    gpu_mems = [m for s in samples if (m := s.sample.gpu_mem_used_mib) is not None]
    cpus = [s.sample.cpu_pct for s in samples]
    rss = [s.sample.rss_mib for s in samples]
    return {
        "samples": len(samples),
        "gpu_util_avg": round(sum(gpu_utils) / len(gpu_utils), 1) if gpu_utils else None,
        "gpu_util_max": round(max(gpu_utils), 1) if gpu_utils else None,
        "gpu_mem_max_mib": max(gpu_mems) if gpu_mems else None,
        "cpu_avg": round(sum(cpus) / len(cpus), 1) if cpus else None,
        "rss_max_mib": round(max(rss), 1) if rss else None,
    }


def iso_ms(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LogEvent(_Model):
    at: datetime
    message: str


class LogPage(_Model):
    events: list[LogEvent]
    #: Continues after the last event (None: nothing to continue from, e.g. no stream yet).
    next_token: str | None


def parse_since(text: str) -> int:
    """``since`` as the API takes it: epoch milliseconds, or an ISO 8601 time with a zone (``Z`` or
    an offset); epoch ms. InvalidRequest for anything else."""
    raw = text.strip()
    if raw.isdigit():
        return int(raw)
    try:
        at = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError as exc:
        raise InvalidRequest(
            f"since must be epoch milliseconds or an ISO 8601 time with a zone, not {text[:40]!r}"
        ) from exc
    if at.tzinfo is None:
        raise InvalidRequest("since needs a time zone (e.g. 2026-12-01T10:00:00Z)")
    return int(at.timestamp() * 1000)
