"""``BerthStack``: the walking skeleton of the control plane (state tables, API, API Lambda)."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from berth_infra.api import (
    AGENT_ROUTES,
    API_STAGE_NAME,
    DEFAULT_API_RESERVED_CONCURRENCY,
    DEFAULT_MEMBER_TAG,
    DEFAULT_TENANT_REQUESTS_PER_SECOND,
    ApiFunction,
    BerthApi,
    base_environment,
)
from berth_infra.cloud_config import cloud_regions, tenants
from berth_infra.cloud_dispatch import DEFAULT_RUNNABLE_TIMEOUT_S, DEFAULT_SUBMIT_RATE, CloudDispatchConfig
from berth_infra.cloud_roles import CloudRoles
from berth_infra.dashboard import OperationsDashboard, Watched
from berth_infra.data import DataTables
from berth_infra.monitoring import Alarms, Monitored, dead_letter_queues
from berth_infra.nag import acknowledge_findings
from berth_infra.storage import Storage
from berth_infra.workflow import DEFAULT_TIMINGS, JobWorkflow

#: Context keys of the workflow's timings (seconds) -> the environment variable they set.
TIMING_CONTEXT: dict[str, tuple[str, int]] = {
    key: (name, DEFAULT_TIMINGS[key])
    for key, name in (
        ("BERTH_HEARTBEAT_S", "heartbeatSeconds"),
        ("BERTH_LEASE_S", "leaseSeconds"),
        ("BERTH_OUTAGE_TOLERANCE_S", "outageToleranceSeconds"),
        ("BERTH_FENCE_MARGIN_S", "fenceMarginSeconds"),
        ("BERTH_CLAIM_S", "claimSeconds"),
        ("BERTH_BACKOFF_BASE_S", "backoffBaseSeconds"),
        ("BERTH_BACKOFF_CAP_S", "backoffCapSeconds"),
        ("BERTH_ORPHAN_GRACE_S", "orphanGraceSeconds"),
    )
}

STACK_NAME = "Berth"


def context_flag(scope: Construct, key: str, default: bool = False) -> bool:
    """A boolean context value; `-c key=true` arrives as the string "true"."""
    value = scope.node.try_get_context(key)
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class BerthStack(Stack):
    """All of Berth's control plane in one stack. Environment-agnostic unless the app pins one."""

    def __init__(self, scope: Construct, construct_id: str = STACK_NAME, **kwargs: Any) -> None:
        kwargs.setdefault("description", "Berth: hybrid-cloud GPU allocation service (control plane)")
        super().__init__(scope, construct_id, **kwargs)

        self.tables = DataTables(self, "Data")
        self.storage = Storage(self, "Storage")
        context = self.node.try_get_context
        bundle = context_flag(self, "berth:bundle")
        self.workflow = JobWorkflow(
            self,
            "Workflow",
            tables=self.tables,
            base_environment=base_environment(self.tables, self.storage),
            bundle=bundle,
            # -c berth:heartbeatSeconds=N (and leaseSeconds, outageToleranceSeconds, fenceMarginSeconds,
            # claimSeconds, backoffBaseSeconds, backoffCapSeconds, orphanGraceSeconds) override the
            # workflow's timings.
            timings={
                key: int(context(f"berth:{name}") or default)
                for key, (name, default) in TIMING_CONTEXT.items()
            },
            cloud_enabled=context_flag(self, "berth:cloudEnabled"),
            job_role=self.storage.job_role,
            # The cloud dispatcher: -c berth:batchSubmitRoleArn (BatchSubmitRole), berth:batchSubmitRate,
            # berth:runnableTimeoutSeconds.
            cloud=CloudDispatchConfig(
                submit_role_arn=str(context("berth:batchSubmitRoleArn") or ""),
                submit_rate=int(context("berth:batchSubmitRate") or DEFAULT_SUBMIT_RATE),
                runnable_timeout_s=int(context("berth:runnableTimeoutSeconds") or DEFAULT_RUNNABLE_TIMEOUT_S),
            ),
        )
        workflow_env = {
            k: v
            for k, v in self.workflow.environment.items()
            if k.startswith(
                (
                    "BERTH_HEARTBEAT",
                    "BERTH_LEASE",
                    "BERTH_OUTAGE",
                    "BERTH_FENCE",
                    "BERTH_CLAIM",
                    "BERTH_BACKOFF",
                    "BERTH_ORPHAN",
                )
            )
            or k in ("BERTH_SCHEDULER_QUEUE_URL", "BERTH_CLOUD_ENABLED")
        }
        workflow_env["BERTH_STATE_MACHINE_ARN"] = self.workflow.state_machine_arn
        self.api_function = ApiFunction(
            self,
            "ApiFunction",
            tables=self.tables,
            storage=self.storage,
            bundle=bundle,
            workflow_environment=workflow_env,
            reserved_concurrency=int(
                context("berth:apiReservedConcurrency") or DEFAULT_API_RESERVED_CONCURRENCY
            ),
            tenant_requests_per_second=int(
                context("berth:tenantRequestsPerSecond") or DEFAULT_TENANT_REQUESTS_PER_SECOND
            ),
        )
        self.api = BerthApi(
            self,
            "Api",
            handler=self.api_function.function,
            member_tag=str(context("berth:memberTag") or DEFAULT_MEMBER_TAG),
            agent_handler=self.workflow.agent_fn.function,
        )
        # An on-prem host's identity calls the agent API's routes (SigV4): HostPolicy names exactly them.
        self.workflow.host_policy.add_statements(
            iam.PolicyStatement(
                sid="AgentApi",
                actions=["execute-api:Invoke"],
                resources=[
                    self.api.rest_api.arn_for_execute_api(method=verb, path=path, stage=API_STAGE_NAME)
                    for path, verbs in AGENT_ROUTES.items()
                    for verb in verbs
                ],
            )
        )
        # The API starts each job's execution and answers the placement wait of a job canceled while
        # queued.
        self.api_function.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="Workflow",
                actions=["states:StartExecution", "states:SendTaskSuccess"],
                resources=[self.workflow.state_machine_arn],
            )
        )
        # ... and asks for a pass when a running cloud job is canceled (its Batch job is terminated now).
        self.api_function.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="Trigger", actions=["sqs:SendMessage"], resources=[self.workflow.trigger_queue.queue_arn]
            )
        )

        # The Batch events function lists a cloud attempt's checkpoint prefix once when it ends
        # (berth.logic.cloud_checkpoints): only checkpoint prefixes, never an object's content.
        self.workflow.batch_events_fn.allow(
            "CheckpointsList",
            ["s3:ListBucket"],
            [self.storage.data.bucket_arn],
            {"StringLike": {"s3:prefix": ["*/jobs/*/checkpoints/"]}},
        )

        # The cloud path's roles (Batch job role per tenant, the dispatcher's submit role), the tenants'
        # job log groups and the bus rule for forwarded Batch events (docs/cloud.md).
        self.cloud = CloudRoles(
            self,
            "Cloud",
            storage=self.storage,
            bus=self.workflow.bus,
            regions=cloud_regions(self),
            tenants=tenants(self),
        )
        # EventBridge applies one bus-policy change at a time.
        self.cloud.bus_policy.add_resource_dependency(self.workflow.node.find_child("BusPolicy"))  # type: ignore[arg-type]
        # The functions that call Batch act through BatchSubmitRole, tagged with the job's tenant
        # (unless -c berth:batchSubmitRoleArn names another role, granted in the workflow construct).
        if not self.workflow.cloud.config.submit_role_arn:
            wf = self.workflow
            for fn in (wf.batch_submit_fn, wf.batch_events_fn, wf.scheduler_fn):
                fn.function.add_environment("BERTH_BATCH_SUBMIT_ROLE_ARN", self.cloud.submit_role.role_arn)
                self.cloud.grant_assume(fn.role)
        # The functions that read cloud offers offer only what a deployed compute environment holds.
        for function in (self.api_function.function, self.workflow.scheduler_fn.function):
            function.add_environment("BERTH_CLOUD_CAPACITY", self.cloud.capacity_json)

        # Operations: alarms on one encrypted topic, and the dashboard (docs/operations.md).
        wf = self.workflow
        monitored = Monitored(
            scheduler=wf.scheduler_fn.function,
            scheduler_timeout_s=int(wf.scheduler_fn.function.timeout.to_seconds()),  # type: ignore[union-attr]
            dead_letter_queues=dead_letter_queues(self),
            regions=[r.region for r in cloud_regions(self)],
            tenants=tenants(self),
        )
        self.alarms = Alarms(self, "Alarms", watched=monitored)
        functions = {
            "Api": self.api_function.function,
            "AgentApi": wf.agent_fn.function,
            "Workflow": wf.workflow_fn.function,
            "Scheduler": wf.scheduler_fn.function,
            "Notifier": wf.notifier_fn.function,
            "BatchSubmit": wf.batch_submit_fn.function,
            "BatchEvents": wf.batch_events_fn.function,
        }
        tables = {t.node.id.removesuffix("Table"): t for t in self.tables.all_tables}
        self.dashboard = OperationsDashboard(
            self,
            "Operations",
            monitored=monitored,
            watched=Watched(functions=functions, tables=tables, state_machine=wf.state_machine),
            alarms=list(self.alarms.alarms.values()),
        )

        outputs = {
            "ApiUrl": (self.api.url, "Base URL of the API stage; routes start with /v1"),
            "ApiId": (self.api.rest_api.rest_api_id, "REST API id"),
            "JobsTableName": (self.tables.jobs.table_name, "Jobs table"),
            "JobEventsTableName": (self.tables.job_events.table_name, "Job events (state history) table"),
            "TenantsTableName": (self.tables.tenants.table_name, "Tenants and quotas table"),
            "IdempotencyTableName": (self.tables.idempotency.table_name, "Powertools idempotency table"),
            "HostsTableName": (self.tables.hosts.table_name, "On-prem hosts and their GPUs table"),
            "JobMetricsTableName": (self.tables.job_metrics.table_name, "Attempts' usage samples table"),
            "UsageTableName": (self.tables.usage.table_name, "Usage ledger (GPU-hours and cost per attempt)"),
            "ApiFunctionName": (self.api_function.function.function_name, "API Lambda function name"),
            "ArtifactsBucketName": (
                self.storage.artifacts.bucket_name,
                "Code bundles (bundles/<tenant>/sha256/)",
            ),
            "DataBucketName": (self.storage.data.bucket_name, "Tenant data (<tenant>/) and job outputs"),
            "StateMachineArn": (self.workflow.state_machine_arn, "The job workflow (one execution per job)"),
            "SchedulerQueueUrl": (self.workflow.trigger_queue.queue_url, "Scheduling pass requests"),
            "EventBusName": (self.workflow.bus.event_bus_name, "Berth Job State Change events"),
            "JobEventsQueueUrl": (
                self.workflow.job_events_queue.queue_url,
                "Example rule target: every Berth Job State Change",
            ),
            "HostPolicyArn": (
                self.workflow.host_policy.managed_policy_arn,
                "Attach to each on-prem host's role (tag berth:host=<host id>)",
            ),
            "JobRoleArn": (
                self.storage.job_role.role_arn,
                "Role per-attempt job credentials are vended from",
            ),
            "BatchSubmitRoleArn": (
                self.cloud.submit_role.role_arn,
                "The cloud dispatcher assumes it with session tag berth:tenant=<job's tenant>",
            ),
            "CloudRegions": (self.cloud.regions_json, "Batch regions, instance types and queue names (JSON)"),
            "BatchSubmitQueueUrl": (
                self.workflow.cloud.submit_queue.queue_url,
                "Batch submit requests (FIFO; the cloud dispatcher's input)",
            ),
            "BatchEventsQueueUrl": (
                self.workflow.cloud.events_queue.queue_url,
                "Batch Job State Change events from the home bus",
            ),
            "AlarmTopicArn": (self.alarms.topic.topic_arn, "Every alarm notifies this SNS topic"),
            "DashboardName": (self.dashboard.dashboard_name, "The CloudWatch operations dashboard"),
        }
        for output_id, (value, description) in outputs.items():
            CfnOutput(self, output_id, value=value, description=description)

        self.nag_acknowledgments = acknowledge_findings(self)
