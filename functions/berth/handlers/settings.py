"""Runtime configuration of the control-plane Lambdas, read from the environment once."""

from __future__ import annotations

from functools import cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BERTH_", extra="ignore")

    jobs_table: str
    job_events_table: str
    tenants_table: str
    idempotency_table: str
    #: The on-prem fleet: hosts, their GPUs and the GPUs each running attempt holds.
    hosts_table: str
    #: Code bundles (bundles/<tenant>/sha256/<digest>.tar.gz) and tenant data (<tenant>/...).
    artifacts_bucket: str
    data_bucket: str
    #: Largest accepted request body; a job spec is small, anything bigger is refused before parsing.
    max_body_bytes: int = 64 * 1024
    idempotency_ttl_s: int = 24 * 3600
    #: Per-tenant request rate limit: at most this many requests per window, over all instances.
    rate_limit_requests: int = 50
    rate_limit_window_s: int = 1
    #: How long a pagination token stays valid.
    page_token_ttl_s: int = 3600
    #: How long the submit-time feasibility check reuses the fleet, policy and offers it read (static
    #: facts; explain and capacity always read afresh).
    feasibility_cache_s: float = 5.0
    #: How long a sandbox reuses a caller's identity it verified (a member's tenant and role in the API,
    #: a host's id in the agent API; ``logic/kept_answers.py``): a removal or a change of role takes
    #: effect within it. Refusals are never kept. 0 reads the caller's registration on every request.
    identity_cache_s: float = 30.0
    #: How long a sandbox vending attempts' credentials reuses a team's data grants and a dataset's
    #: record (``CredentialService.grants_cache_s``); 0 reads them for every credential.
    credential_grants_cache_s: float = 30.0

    # -- the workflow (docs/workflow.md); empty names leave that part unwired (tests of the API alone)
    #: The job state machine; the API starts one execution per job, named after it.
    state_machine_arn: str = ""
    #: The scheduler's trigger queue (submits, finishes and capacity changes ask for a pass here).
    scheduler_queue_url: str = ""
    #: Per-host work queues are ``<prefix><host_id>``.
    host_queue_prefix: str = "berth-host-"
    #: The Berth EventBridge bus (``Berth Job State Change`` events).
    event_bus_name: str = ""
    #: Timings (seconds); a deployment may shorten them (the stack's function environment).
    heartbeat_s: int = 60
    lease_s: int = 90
    outage_tolerance_s: int = 300
    fence_margin_s: int = 60
    claim_s: int = 300
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 300.0
    orphan_grace_s: int = 120
    #: A queued job without a placement wait this long after submit gets its execution (re)started.
    execution_repair_s: int = 30
    #: Seconds of each scheduler invocation given to the array expander before the pass.
    array_budget_s: float = 15.0
    #: The queue index a pass reads (``berth.logic.snapshot.QueueLimits``; docs/scheduling.md): entries
    #: per pass, the least read of each tenant, and how long reading may take before the pass goes on
    #: with what it read (the rest is read round-robin by the next passes).
    queue_read_budget: int = 20_000
    queue_min_head: int = 40
    queue_read_deadline_s: float = 10.0
    #: Whether cloud offers are part of the fleet. The stack sets it false (``-c berth:cloudEnabled``)
    #: until it deploys a cloud dispatcher (AWS Batch): then nothing is placed in, or accepted for, the
    #: cloud, and feasibility, explain and capacity say so.
    cloud_enabled: bool = True
    #: The usage ledger (one item per job attempt: GPU-hours and cost per tenant, site and month);
    #: empty: no usage is recorded and ``GET /v1/tenants/{tenant}/usage`` answers 404.
    usage_table: str = ""
    #: The role attempts' scoped credentials are vended from (the agent API's ``/credentials``);
    #: empty: no credentials are vended.
    job_role_arn: str = ""
    #: Attempts' usage samples (``POST /v1/agent/metrics``, ``GET /v1/jobs/{id}/metrics``); empty:
    #: none are kept (the agent API answers 404 to metrics, the API an empty list).
    job_metrics_table: str = ""
    #: Where agents ship job output: group ``<prefix>/<tenant>``, stream ``<job_id>/<attempt>``.
    job_log_group_prefix: str = "/berth/jobs"

    # -- the cloud branch (AWS Batch; docs/workflow.md "The cloud branch") ---------------------------
    #: The FIFO queue of Batch submit requests (empty: no cloud dispatcher in this deployment).
    batch_submit_queue_url: str = ""
    #: Assumed (with session tag berth:tenant) to submit; empty: the function's own credentials.
    batch_submit_role_arn: str = ""
    #: SubmitJob calls per second over all submit function instances (Batch allows 50 per account).
    batch_submit_rate: float = 40.0
    #: The submit function's reserved concurrency: each instance keeps to rate / concurrency.
    batch_submit_concurrency: int = 2
    #: The image code-bundle jobs run in, with ``python -m berth_agent.launch``.
    batch_base_image: str = "public.ecr.aws/docker/library/python:3.11-slim"
    #: A cloud attempt waiting for an instance longer than this fails as ``Capacity``.
    runnable_timeout_s: int = 600
    #: A dispatched cloud attempt still without a Batch job after this long is submitted again.
    batch_submit_grace_s: int = 120
    #: The sweep answers a Batch outcome this long after it (the state-change event answers first).
    batch_event_grace_s: int = 60
    #: The account whose per-tenant job roles (``Berth-job-<tenant>``) Batch jobs run as.
    account_id: str = ""
    partition: str = "aws"
    #: A custom AWS endpoint for the launchers inside Batch jobs (empty: AWS's own endpoints).
    batch_endpoint_url: str = ""
    #: The instance types the deployed Batch compute environments hold, JSON ``{"<region>": ["<type>",
    #: ...]}`` (the stack sets it from the same cloud config as the Batch stacks); offers of anything else
    #: are never made. Empty: no restriction (deployments and tests without Batch stacks).
    cloud_capacity: str = ""


@cache
def settings() -> Settings:
    """The configuration, read from the environment once per process (one Lambda sandbox)."""
    return Settings()
