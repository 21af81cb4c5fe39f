"""Request and response shapes of the HTTP API: each route returns its model, so the answer, the
generated OpenAPI document (docs/openapi.json) and its clients share one definition."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema

from berth.domain.job_spec import JobSpec
from berth.domain.placement import JobPlacement, Site
from berth.domain.status import JobStatus
from berth.domain.storage import BUNDLE_MAX_BYTES

#: A JSON number as the use case computed it: a whole sum stays an int (``0``, not ``0.0``).
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]


class ArrayOut(BaseModel):
    size: int = Field(description="How many tasks")
    counts: dict[str, int] = Field(
        description="Tasks per status (created or not: a task not yet created is QUEUED)"
    )
    created: int = Field(description="How many tasks exist as jobs so far")


class CheckpointOut(BaseModel):
    at: str = Field(
        description="When the job's checkpoint directory was last synced (ISO time; on-prem: the agent's "
        "last upload, cloud: the newest object under the prefix when the attempt ended)"
    )
    size_bytes: int | None = Field(default=None, description="The checkpoint's size then (bytes)")
    attempt: int | None = Field(default=None, description="The attempt that wrote it")


#: A job's spec as it was accepted: the fields it set, without the ones left empty. (A lambda: a
#: serializer's return annotation would replace JobSpec in the document.)
StoredSpec = Annotated[JobSpec, PlainSerializer(lambda spec: spec.model_dump(mode="json", exclude_none=True))]


class _JobFields(BaseModel):
    """What a job and an array answer alike (``Job.public()``, ``JobArray.public()``)."""

    id: str
    tenant: str
    owner: str
    actor: str | None = Field(
        default=None, description="Who submitted it: the role session name (an SSO user) or the IAM user"
    )
    status: JobStatus
    reason: str
    spec: StoredSpec
    created_at: str
    updated_at: str
    site: Site | None = None
    placement: JobPlacement | None = None
    attempts: int
    cost_usd: Number


# A job's place in its team's queue (``berth.logic.queue_view``), after the job's own fields.
QueuePosition = Annotated[
    int | None,
    Field(
        description="A QUEUED job's 1-based place in its team's queue, in the order the last scheduling "
        "pass served the team's jobs (null: not queued, or not ranked yet: submitted since the last pass, "
        "or deeper than the 200 the summary keeps)"
    ),
]
QueueLength = Annotated[int | None, Field(description="The team's queued jobs at that pass")]
EstimatedStart = Annotated[
    str | None,
    Field(
        description="An ESTIMATE (ISO 8601, to the minute) of when the job starts, from the scheduler "
        "core's run-time predictor; null when none can be made (a quota, budget or constraint keeps it "
        "waiting)"
    ),
]
EstimatedStartBasis = Annotated[
    str | None,
    Field(
        description="`onprem`: on-prem GPUs of its model are predicted free then; `burst`: its burst "
        "wait ends then"
    ),
]
QueueAsOf = Annotated[str | None, Field(description="The pass that last changed these fields")]
DefaultsApplied = Annotated[
    list[str],
    Field(
        description="Resource fields the spec left out and Berth filled with its defaults: `resources` "
        "(the whole section: 1 x A100, 4 CPUs, 16 GiB) or `resources.<field>`; only in the answer to "
        "`POST /v1/jobs`"
    ),
]


class JobOut(_JobFields):
    """A job or an array task (`<array id>:<i>`)."""

    started_at: str | None = Field(
        default=None, description="When the current (or last) attempt started running (null before)"
    )
    checkpoint: CheckpointOut | None = Field(
        default=None,
        description="The last synced checkpoint: on-prem attempts report it while they run, cloud attempts "
        "when they end; null before the first",
    )
    queue_position: QueuePosition = None
    queue_length: QueueLength = None
    estimated_start: EstimatedStart = None
    estimated_start_basis: EstimatedStartBasis = None
    queue_as_of: QueueAsOf = None


class ArrayJobOut(_JobFields):
    """A job array: its tasks are jobs `<id>:<i>`; the array itself is never queued."""

    array: ArrayOut
    queue_position: QueuePosition = None
    queue_length: QueueLength = None
    estimated_start: EstimatedStart = None
    estimated_start_basis: EstimatedStartBasis = None
    queue_as_of: QueueAsOf = None


class SubmittedJobOut(JobOut):
    defaults_applied: DefaultsApplied = []


class SubmittedArrayOut(ArrayJobOut):
    defaults_applied: DefaultsApplied = []


#: What ``GET /v1/jobs/{id}`` answers: a job (or array task), or an array.
AnyJobOut = JobOut | ArrayJobOut


class BundleIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    digest: Annotated[str, Field(pattern=r"^[a-f0-9]{64}$", description="SHA-256 of the .tar.gz, hex")]
    size: Annotated[int, Field(ge=1, le=BUNDLE_MAX_BYTES, description="Bytes")]


class UploadOut(BaseModel):
    url: str
    method: str
    headers: dict[str, str]
    expires_in_s: int


class BundleOut(BaseModel):
    digest: str
    present: bool
    upload: UploadOut | None = None


class JobList(BaseModel):
    jobs: list[AnyJobOut]
    next_token: str | None = None


class TeamQueueOut(BaseModel):
    """A team's waiting jobs in the order the scheduler serves them (the head its last pass ranked)."""

    tenant: str
    as_of: str | None = Field(
        description="When the pass that ranked these jobs ran (null: no pass has ranked this queue)"
    )
    waiting: int = Field(description="The team's queued jobs as that pass counted them, however deep")
    jobs: list[JobOut] = Field(
        description="Still queued, by position (a job ranked since started or ended is left out, so "
        "positions may skip); each with `queue_position` and `estimated_start`"
    )


class EventOut(BaseModel):
    at: str
    from_: JobStatus | None = Field(default=None, alias="from")
    to: JobStatus
    reason: str


class EventList(BaseModel):
    events: list[EventOut]


class DocumentOut(BaseModel):
    kind: str = Field(description="`policy` or `offers`")
    version: int = Field(description="1, 2, ...; 0 is the built-in default (nothing stored yet)")
    source: str = Field(description="`stored` or `default`")
    updated_at: str | None = None
    updated_by: str | None = None
    document: Any = Field(description="The scheduling policy, or `{offers: [...]}`")


class ExplainOut(BaseModel):
    job_id: str
    tenant: str
    status: JobStatus
    reason: str
    site: Site | None = None
    placement: JobPlacement | None = None
    outcome: str = Field(
        description="`pending`, `onprem` or `cloud` (what a pass over the store now decides for a "
        "queued job), `placed` (already placed: see placement) or `finished`"
    )
    explanation: dict[str, Any] | None = Field(
        default=None,
        description="The scheduler core's explanation: summary, rule ids in order, every candidate "
        "site with the rule that kept the job off it or its price, fair-share rank",
    )
    policy_version: int | None = Field(
        default=None, exclude_if=lambda v: v is None, description="Absent for a placed or finished job"
    )
    offers_version: int | None = Field(
        default=None, exclude_if=lambda v: v is None, description="Absent for a placed or finished job"
    )


class PlanLimits(BaseModel):
    max_cost_usd: Number | None = Field(default=None, description="The spec's cost cap (a job's total)")
    max_hourly_usd: Number | None = None
    timeout_minutes: int
    monthly_cloud_budget_usd: Number | None = Field(default=None, description="The tenant's (None: none)")
    cloud_budget_left_usd: Number | None = None


class PlanOut(BaseModel):
    tenant: str
    name: str
    resources: dict[str, Any] = Field(description="What one job (an array: each task) asks for")
    tasks: int = Field(description="1, or an array's size (every task is planned alike)")
    outcome: str = Field(description="`onprem`, `cloud` (where a pass now would place it) or `pending`")
    summary: str = Field(description="Where it would run, or why it would wait (one clause per site)")
    hourly_usd: Number | None = Field(
        default=None,
        description="Its price per hour where it would run (on-prem: the internal rate); pending: the "
        "cheapest eligible cloud price, if any",
    )
    limits: PlanLimits
    explanation: dict[str, Any] = Field(
        description="The scheduler core's explanation, as `GET /v1/jobs/{id}/explain` gives it"
    )
    policy_version: int
    offers_version: int
    stored: bool = Field(description="Always false: a dry run stores nothing")


class OutputObject(BaseModel):
    key: str
    path: str = Field(description="The key under the job's prefix, e.g. `outputs/model.pt`")
    size: int
    last_modified: str
    url: str = Field(description="A presigned GET for this one object")


class OutputsOut(BaseModel):
    job_id: str
    location: str = Field(description="`s3://<data bucket>/<tenant>/jobs/<job>/`")
    outputs: str | None = Field(default=None, description="Where `$BERTH_OUTPUT_DIR` is uploaded")
    checkpoints: str | None = Field(default=None, description="Where `$BERTH_CHECKPOINT_DIR` is uploaded")
    objects: list[OutputObject]
    url_expires_in_s: int
    next_token: str | None = None


class CapacityOut(BaseModel):
    as_of: str
    totals: dict[str, int]
    pools: list[dict[str, Any]]
    hosts: list[dict[str, Any]]
    cloud: dict[str, Any]
    policy_version: int


class CircuitOut(BaseModel):
    region: str
    instance_type: str = Field(description="An instance type, or `*` for the region's Batch API")
    state: str = Field(description="`closed`, `half-open` or `open`: this circuit's own")
    effective_state: str = Field(description="What placement sees: the worse of this and the region's `*`")
    recent_failures: int = Field(description="Failures since the last success within the rule's window")
    last_failure_at: str | None
    last_success_at: str | None


class CircuitsOut(BaseModel):
    as_of: str
    enabled: bool = Field(description="Whether the cloud is enabled (no circuits are kept otherwise)")
    rule: dict[str, Any] = Field(description="The stored policy's `circuit` rule")
    circuits: list[CircuitOut]


class CircuitKeyOut(BaseModel):
    region: str
    instance_type: str


class CircuitResetOut(BaseModel):
    reset: list[CircuitKeyOut] = Field(description="The circuits closed")


class AdmissionOut(BaseModel):
    gpu_type: str
    gpus: int


class AdmitOut(BaseModel):
    host_id: str
    admitted: AdmissionOut = Field(description="What the host's registrations may report at most")


class DrainOut(BaseModel):
    host_id: str
    drain_requested: bool


class GpuClearOut(BaseModel):
    host_id: str
    gpu_id: str = Field(description="The GPU's UUID")
    cleared: str = Field(description="The fault that was cleared, in words")
    fault_id: str


class SiteUsageOut(BaseModel):
    site: Site
    gpu_hours: Number
    cost_usd: Number


class UsageOut(BaseModel):
    tenant: str
    month: str = Field(description="YYYY-MM (UTC); attempts count in the month they started")
    sites: list[SiteUsageOut] = Field(description="GPU-hours and cost per site (on-prem, cloud)")
    attempts: int = Field(description="Job attempts recorded in the month (running ones so far)")
    total_gpu_hours: Number
    total_cost_usd: Number
    cloud_cost_usd: Number = Field(description="What the monthly cloud budget counts")
    monthly_budget_usd: Number | None = Field(default=None, description="The tenant's monthly cloud budget")
    budget_left_usd: Number | None = Field(
        default=None, description="Budget not yet spent; at 0 the tenant's jobs no longer burst to the cloud"
    )


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorOut(BaseModel):
    error: ErrorBody


def error_responses(*codes: int) -> dict[int, OpenAPIResponse]:
    text = {
        400: "Malformed request",
        403: "Not allowed (unknown principal, other tenant's resource, not an admin)",
        404: "Not found (including another tenant's job)",
        409: "Conflict (illegal state change, lost race, Idempotency-Key reused with another body)",
        422: "Request does not satisfy the schema",
        415: "Request body is not application/json",
        429: "Quota exceeded, or the tenant's request rate limit (see the Retry-After header)",
    }
    return {c: {"description": text[c], "content": {"application/json": {"model": ErrorOut}}} for c in codes}


class LogEventOut(BaseModel):
    at: str
    message: str
    attempt: int


class LogsOut(BaseModel):
    job_id: str
    attempt: int | None = Field(description="The attempt read (null: the job has not started)")
    attempts: int = Field(description="How many attempts the job has made")
    rank: int = Field(default=0, description="The gang's node read (`?rank=`; 0: the main node)")
    status: JobStatus = Field(description="The job's status now: a follower stops once it is terminal")
    events: list[LogEventOut]
    next_token: str | None = Field(
        description="Continues after the last event (also when it is the end for now: pass it again "
        "to follow); null while the attempt has no log stream yet"
    )
    reason: str | None = Field(
        default=None,
        description="Why the page is empty for now, when that is known: the job has not started, or "
        "its cloud attempt (or that rank's node) waits for AWS Batch to start its container and name "
        "the log stream; with `rank` on an on-prem gang, that the page holds every rank's output",
    )


class GpuSampleOut(BaseModel):
    uuid: str
    utilization_pct: Number
    memory_used_mib: int
    memory_total_mib: int
    job_memory_mib: int


class MetricSampleOut(BaseModel):
    at: str
    attempt: int
    host_id: str
    gpu_util_pct: Number | None = Field(description="Mean over the attempt's GPUs on that host")
    gpu_mem_used_mib: int | None = Field(description="Sum over the attempt's GPUs on that host")
    cpu_pct: Number = Field(description="The job's processes; 100 = one core")
    rss_mib: Number
    processes: int
    gpus: list[GpuSampleOut]


class MetricsSummaryOut(BaseModel):
    samples: int
    gpu_util_avg: Number | None = None
    gpu_util_max: Number | None = None
    gpu_mem_max_mib: int | None = None
    cpu_avg: Number | None = None
    rss_max_mib: Number | None = None


class MetricsOut(BaseModel):
    job_id: str
    attempt: int | None
    attempts: int
    status: JobStatus
    samples: list[MetricSampleOut]
    summary: MetricsSummaryOut
