"""AWS Batch adapter of ``BatchGateway``, and the SQS submit queue.

Submits act for the job's tenant: the adapter assumes ``BatchSubmitRole`` with the session tag
``berth:tenant=<tenant>``, so its PassRole can only pass that tenant's job role (docs/security.md).
Without a role ARN (a deployment without the Batch stacks, unit tests) it uses its own credentials.
Lookups and terminations need no PassRole and use the function's own role.

Rate: every SubmitJob call of a gateway first takes a token from its ``RateLimiter`` (the submit
function runs at most ``BERTH_BATCH_SUBMIT_CONCURRENCY`` at once, each at its share of
``BERTH_BATCH_SUBMIT_RATE``, under Batch's 50 SubmitJob/s per account). Throttling answers are
retried by botocore's standard retry mode (exponential backoff with jitter); still throttled
afterwards is ``CloudThrottled`` and the request stays on the queue. AWS errors become
``CloudThrottled``, ``CloudUnavailable`` (5xx, unreachable) or ``CloudRejected`` (other 4xx).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, EndpointConnectionError

from berth.dal import aws
from berth.domain.cloud import (
    BatchJob,
    BatchStatus,
    BatchSubmission,
    CloudError,
    CloudOutcomeUnknown,
    CloudRejected,
    CloudThrottled,
    CloudUnavailable,
    SubmitRequest,
)
from berth.domain.errors import StoreUnavailable

_THROTTLING = {
    "ThrottlingException",
    "Throttling",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
}
#: botocore's standard mode: exponential backoff with full jitter, throttling errors included.
RETRY_CONFIG = Config(retries={"mode": "standard", "max_attempts": 6}, connect_timeout=5, read_timeout=20)
#: SubmitJob is not idempotent: the SDK must not send it again after a timeout or a 5xx (the first
#: may have created the job). ``BotoBatchGateway.submit`` retries only what was surely refused.
SUBMIT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=30)
SUBMIT_TRIES = 6
#: After an answer that leaves open whether SubmitJob took effect: wait this long, then look the job
#: up by name (ListJobs) before deciding.
UNKNOWN_OUTCOME_WAIT_S = 3.0
TENANT_TAG = "berth:tenant"
#: The nodes a gang's (multi-node parallel) definition names; SubmitJob's ``numNodes`` sets the real
#: size (Batch allows it above the definition's when the node range is open above, ``0:``).
MIN_GANG_NODES = 2
#: Assumed sessions are renewed this long before they expire.
_RENEW = timedelta(minutes=5)


class RateLimiter:
    """A token bucket: at most ``rate_per_s`` calls a second on average, bursts of ``burst``."""

    def __init__(
        self,
        rate_per_s: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = max(0.001, rate_per_s)
        self.burst = max(1.0, burst if burst is not None else rate_per_s)
        self._tokens = self.burst
        self._clock, self._sleep = clock, sleep
        self._at = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, waiting for it; returns how long it waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= 1
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.rate
        if wait > 0:
            self._sleep(wait)
        return wait


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


@contextmanager
def _translated(what: str, region: str) -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        message = f"{what} in {region}: {code}"
        if code in _THROTTLING or _status(exc) == 429:
            raise CloudThrottled(message, region) from exc
        if _status(exc) >= 500:
            raise CloudUnavailable(message, region) from exc
        raise CloudRejected(f"{message}: {exc.response.get('Error', {}).get('Message', '')}", region) from exc
    except BotoCoreError as exc:
        raise CloudUnavailable(f"{what} in {region}: {exc.__class__.__name__}", region) from exc


def _outcome_unknown(exc: CloudError) -> bool:
    """Whether a failed call may still have taken effect: a timeout or dropped connection after the
    request was sent, or a 5xx. A connection never made, and a 4xx, leave nothing behind."""
    cause = exc.__cause__
    if isinstance(cause, EndpointConnectionError | ConnectTimeoutError):
        return False
    if isinstance(cause, ClientError):
        return _status(cause) >= 500
    return isinstance(cause, BotoCoreError)


def _batch_job(item: dict[str, Any]) -> BatchJob:
    container = dict(item.get("container") or {})
    if "exitCode" not in container and item.get("nodeProperties"):
        # A gang (multi-node parallel job) has no container of its own: its outcome is its main
        # node's, which its last attempt records.
        attempts = item.get("attempts") or [{}]
        last = attempts[-1].get("container") or {}
        container.update({k: last[k] for k in ("exitCode", "reason") if k in last and k not in container})

    def ts(ms: Any) -> datetime | None:
        return None if not ms else datetime.fromtimestamp(int(ms) / 1000, UTC)

    return BatchJob(
        batch_job_id=str(item["jobId"]),
        name=str(item.get("jobName", "")),
        status=BatchStatus(item.get("status", "SUBMITTED")),
        status_reason=str(item.get("statusReason") or ""),
        exit_code=container.get("exitCode"),
        container_reason=str(container.get("reason") or ""),
        created_at=ts(item.get("createdAt")),
        started_at=ts(item.get("startedAt")),
        stopped_at=ts(item.get("stoppedAt")),
        log_stream=str(container["logStreamName"]) if container.get("logStreamName") else None,
    )


def _container_overrides(request: BatchSubmission) -> dict[str, Any]:
    return {
        "command": list(request.command),
        "environment": [{"name": k, "value": v} for k, v in sorted(request.environment.items())],
        "resourceRequirements": [
            *([{"type": "GPU", "value": str(request.gpus)}] if request.gpus else []),
            {"type": "VCPU", "value": str(request.vcpus)},
            {"type": "MEMORY", "value": str(request.memory_mib)},
        ],
    }


def _overrides(request: BatchSubmission) -> dict[str, Any]:
    """SubmitJob's overrides: ``containerOverrides`` for one container; for a gang (a multi-node
    parallel job) ``nodeOverrides`` instead (Batch refuses ``containerOverrides`` there): its number
    of nodes and the same container overrides for every node (``0:``), each on an instance of its own."""
    if request.num_nodes <= 1:
        return {"containerOverrides": _container_overrides(request)}
    return {
        "nodeOverrides": {
            "numNodes": request.num_nodes,
            "nodePropertyOverrides": [
                {"targetNodes": "0:", "containerOverrides": _container_overrides(request)}
            ],
        }
    }


def _definition_kind(request: BatchSubmission, props: dict[str, Any]) -> dict[str, Any]:
    """A definition's type and properties: one container, or a multi-node parallel job whose one node
    range ``0:`` (open above, so SubmitJob's ``numNodes`` may set any size of 2 or more) runs the
    container on every node, node 0 the main node (``AWS_BATCH_JOB_MAIN_NODE_INDEX``)."""
    if request.num_nodes <= 1:
        return {"type": "container", "containerProperties": props}
    return {
        "type": "multinode",
        "nodeProperties": {
            "numNodes": MIN_GANG_NODES,
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": props}],
        },
    }


class BotoBatchGateway:
    def __init__(
        self,
        submit_role_arn: str = "",
        limiter: RateLimiter | None = None,
        log_group_prefix: str = "/berth/jobs/",
        log_region: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.submit_role_arn = submit_role_arn
        self.limiter = limiter or RateLimiter(40.0)
        self._sleep = sleep
        self.log_group_prefix = log_group_prefix
        #: Job output goes to the tenant's log group in the control plane's (home) region, whatever
        #: region the job runs in, next to the on-prem agents' streams (`GET /v1/jobs/{id}/logs`).
        self.log_region = log_region or boto3.session.Session().region_name
        self._sessions: dict[str, tuple[boto3.session.Session, datetime]] = {}
        #: Clients are built once (building one costs ~0.2 s) and shared (they are thread-safe).
        self._clients: dict[tuple[str, ...], Any] = {}
        self._definitions: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    # -- clients -------------------------------------------------------------------------------
    def _own(self, region: str) -> Any:
        key = ("", region)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = aws.client("batch", region_name=region, config=RETRY_CONFIG)
        return client

    def _for_tenant(self, region: str, tenant: str, submitting: bool = False) -> Any:
        """A Batch client acting in a session tagged with the tenant (PassRole of its role only);
        ``submitting``: one that never resends a request (``SUBMIT_CONFIG``)."""
        config = SUBMIT_CONFIG if submitting else RETRY_CONFIG
        if not self.submit_role_arn:
            if not submitting:
                return self._own(region)
            client = self._clients.get(("", region, "submit"))
            if client is None:
                client = self._clients[("", region, "submit")] = aws.client(
                    "batch", region_name=region, config=config
                )
            return client
        with self._lock:
            cached = self._sessions.get(tenant)
            if cached is None or cached[1] - _RENEW <= datetime.now(UTC):
                with _translated("assume the submit role", region):
                    creds = aws.client("sts").assume_role(
                        RoleArn=self.submit_role_arn,
                        RoleSessionName=f"berth-submit-{tenant}"[:64],
                        Tags=[{"Key": TENANT_TAG, "Value": tenant}],
                        DurationSeconds=900,
                    )["Credentials"]
                session = boto3.session.Session(
                    aws_access_key_id=creds["AccessKeyId"],
                    aws_secret_access_key=creds["SecretAccessKey"],
                    aws_session_token=creds["SessionToken"],
                )
                cached = self._sessions[tenant] = (session, creds["Expiration"])
                for stale in [k for k in self._clients if k[0] == tenant]:
                    del self._clients[stale]
            key: tuple[str, ...] = (tenant, region, "submit") if submitting else (tenant, region)
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = cached[0].client("batch", region_name=region, config=config)
        return client

    # -- BatchGateway --------------------------------------------------------------------------
    def submit(self, request: BatchSubmission) -> str:
        """SubmitJob, sent again only when surely refused (throttled, or the connection never made);
        after an answer that leaves the outcome open, the job is looked up by name: found, its id;
        not found, ``CloudOutcomeUnknown`` (the caller's request is redelivered later and looks
        again). A job of this name is never submitted twice by one call."""
        definition = self._definition(self._for_tenant(request.region, request.tenant), request)
        client = self._for_tenant(request.region, request.tenant, submitting=True)
        for attempt in range(SUBMIT_TRIES):
            try:
                return self._submit_once(client, definition, request)
            except CloudThrottled:
                if attempt == SUBMIT_TRIES - 1:
                    raise
            except CloudError as exc:
                if not _outcome_unknown(exc):
                    raise
                self._sleep(UNKNOWN_OUTCOME_WAIT_S)
                found = self.find(request.region, request.queue, request.name)
                if found:
                    return found[0].batch_job_id
                raise CloudOutcomeUnknown(
                    f"SubmitJob {request.name} in {request.region}: no answer ({exc.message}) and no job "
                    "of that name yet",
                    request.region,
                ) from exc
            self._sleep(min(20.0, 0.5 * 2**attempt) * random.random())  # full jitter, as botocore's
        raise AssertionError("unreachable")

    def _submit_once(self, client: Any, definition: str, request: BatchSubmission) -> str:
        self.limiter.acquire()
        with _translated("SubmitJob", request.region):
            resp = client.submit_job(
                jobName=request.name,
                jobQueue=request.queue,
                jobDefinition=definition,
                **_overrides(request),
                # Berth retries (re-placing elsewhere); Batch must not run an attempt twice.
                retryStrategy={"attempts": 1},
                **({"arrayProperties": {"size": request.array_size}} if request.array_size else {}),
                timeout={"attemptDurationSeconds": request.timeout_s},
                tags=request.tags,
                propagateTags=True,
            )
        return str(resp["jobId"])

    def _definition(self, client: Any, request: BatchSubmission) -> str:
        """The image's job definition for this tenant: the ACTIVE one if registered, else register it."""
        key = (request.region, request.definition)
        known = self._definitions.get(key)
        if known:
            return known
        with _translated("DescribeJobDefinitions", request.region):
            found = client.describe_job_definitions(jobDefinitionName=request.definition, status="ACTIVE")
        active = sorted(found.get("jobDefinitions", []), key=lambda d: int(d.get("revision", 0)))
        if active:
            arn = str(active[-1]["jobDefinitionArn"])
        else:
            props: dict[str, Any] = {
                "image": request.image,
                "resourceRequirements": [
                    {"type": "VCPU", "value": "1"},
                    {"type": "MEMORY", "value": "2048"},
                ],
                "logConfiguration": {
                    "logDriver": "awslogs",
                    "options": {
                        "awslogs-group": self.log_group_prefix + request.tenant,
                        "awslogs-stream-prefix": "batch",
                        **({"awslogs-region": self.log_region} if self.log_region else {}),
                    },
                },
            }
            if request.job_role:
                props["jobRoleArn"] = request.job_role
            if request.secrets:
                # Resolved by ECS with the tenant's execution role when the container starts: only names
                # (ARNs) here, never values; SubmitJob cannot override them.
                props["secrets"] = [{"name": n, "valueFrom": arn} for n, arn in request.secrets]
                props["executionRoleArn"] = request.execution_role
            with _translated("RegisterJobDefinition", request.region):
                arn = str(
                    client.register_job_definition(
                        jobDefinitionName=request.definition,
                        platformCapabilities=["EC2"],
                        **_definition_kind(request, props),
                        propagateTags=True,
                        tags={TENANT_TAG: request.tenant},
                    )["jobDefinitionArn"]
                )
        self._definitions[key] = arn
        return arn

    def find(self, region: str, queue: str, name: str) -> list[BatchJob]:
        with _translated("ListJobs", region):
            resp = self._own(region).list_jobs(
                jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [name]}]
            )
        # An array job's children (``:<index>``) and a gang's nodes (``#<index>``) share its name: the
        # job asked for is the one without either.
        out = [
            i
            for i in resp.get("jobSummaryList", [])
            if i.get("jobName") == name and not {":", "#"} & set(str(i.get("jobId", "")))
        ]
        return [_batch_job(i) for i in out]

    def describe(self, region: str, batch_job_ids: list[str]) -> list[BatchJob]:
        if not batch_job_ids:
            return []
        with _translated("DescribeJobs", region):
            resp = self._own(region).describe_jobs(jobs=batch_job_ids[:100])
        return [_batch_job(i) for i in resp.get("jobs", [])]

    def terminate(self, region: str, batch_job_id: str, reason: str, tenant: str) -> None:
        client = self._for_tenant(region, tenant)
        with _translated("TerminateJob", region):
            client.terminate_job(jobId=batch_job_id, reason=reason[:256])


#: The message attribute that marks the dispatch's own send of an attempt's submit request.
FIRST_ATTRIBUTE = "berth-first"
FIRST_VALUE = {"DataType": "String", "StringValue": "1"}


class SqsSubmitQueue:
    """The FIFO submit queue: one message group per job, or per Batch array group (its requests in
    order, never two at once), deduplicated by ``<action>-<job>-a<attempt>`` for SQS's five minutes."""

    def __init__(self, queue_url: str) -> None:
        self.queue_url = queue_url

    @cached_property
    def _sqs(self) -> Any:
        return aws.client("sqs")

    def send(self, request: SubmitRequest, first: bool = False) -> None:
        # ``first`` travels as a message attribute, outside the body: a consumer that does not know
        # it reads the request as before (and looks the Batch job up by name).
        extra: dict[str, Any] = {"MessageAttributes": {FIRST_ATTRIBUTE: FIRST_VALUE}} if first else {}
        try:
            self._sqs.send_message(
                QueueUrl=self.queue_url,
                MessageBody=request.model_dump_json(),
                MessageGroupId=request.message_group,
                MessageDeduplicationId=request.dedup_id,
                **extra,
            )
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"could not queue the Batch submit of {request.job_id}: {exc}") from exc
