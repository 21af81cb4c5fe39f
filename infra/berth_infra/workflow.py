"""The job workflow: the state machine, its task Lambda, the scheduler service, the agent API's
Lambda, the notifier and the Berth event bus (docs/workflow.md has the diagram)."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from berth_infra.bundling import LAMBDA_ARCHITECTURE, LAMBDA_RUNTIME, function_code
from berth_infra.cloud_dispatch import SUBMIT_TIMEOUT_S, CloudDispatch, CloudDispatchConfig
from berth_infra.data import DataTables

LOG_RETENTION = logs.RetentionDays.ONE_MONTH
HOST_QUEUE_PREFIX = "berth-host-"
#: The one pass at a time: the scheduler's reserved concurrency.
SCHEDULER_CONCURRENCY = 1
#: How often the timer asks for a pass (a safety net; submits, finishes and capacity changes ask too).
TIMER_MINUTES = 1

#: Timings every control-plane function reads (seconds); ``-c berth:heartbeatSeconds=N`` etc.
DEFAULT_TIMINGS: dict[str, int] = {
    "BERTH_HEARTBEAT_S": 60,
    "BERTH_LEASE_S": 90,
    "BERTH_OUTAGE_TOLERANCE_S": 300,
    "BERTH_FENCE_MARGIN_S": 60,
    "BERTH_CLAIM_S": 300,
    "BERTH_BACKOFF_BASE_S": 2,
    "BERTH_BACKOFF_CAP_S": 300,
    "BERTH_ORPHAN_GRACE_S": 120,
}


def _table_arns(tables: DataTables) -> dict[str, str]:
    return {
        "jobs": tables.jobs.table_arn,
        "job_events": tables.job_events.table_arn,
        "tenants": tables.tenants.table_arn,
        "hosts": tables.hosts.table_arn,
        "usage": tables.usage.table_arn,
    }


class ControlFunction(Construct):
    """A control-plane Lambda with its own log group and a role that holds only what it is given."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: str,
        description: str,
        environment: dict[str, str],
        bundle: bool,
        timeout_s: int = 30,
        memory_mb: int = 512,
        reserved_concurrency: int = 20,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self, "LogGroup", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY
        )
        self.role = iam.Role(
            self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            handler=handler,
            code=function_code(bundle),
            memory_size=memory_mb,
            timeout=Duration.seconds(timeout_s),
            role=self.role,
            log_group=self.log_group,
            reserved_concurrent_executions=reserved_concurrency,
            description=description,
            environment=environment,
        )
        self.log_group.grant_write(self.role)

    def allow(self, sid: str, actions: list[str], resources: list[str], conditions: Any = None) -> None:
        self.role.add_to_principal_policy(
            iam.PolicyStatement(sid=sid, actions=actions, resources=resources, conditions=conditions)
        )


def _tenant_counter_writes() -> dict[str, Any]:
    """Terminal transitions decrement the tenant's active-job counter (TENANT# items only)."""
    return {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANT#*"]}}


class JobWorkflow(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        tables: DataTables,
        base_environment: dict[str, str],
        bundle: bool,
        timings: dict[str, int] | None = None,
        cloud_enabled: bool = False,
        job_role: iam.IRole | None = None,
        cloud: CloudDispatchConfig | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        arns = _table_arns(tables)
        host_queues = f"arn:{stack.partition}:sqs:{stack.region}:{stack.account}:{HOST_QUEUE_PREFIX}*"

        # -- the scheduler's trigger queue, and the timer that fills it -----------------------------
        self.trigger_dlq = sqs.Queue(
            self,
            "SchedulerTriggerDlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.trigger_queue = sqs.Queue(
            self,
            "SchedulerTriggerQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=Duration.seconds(6 * 60),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.trigger_dlq, max_receive_count=5),
        )
        self.timer = events.Rule(
            self,
            "SchedulerTimer",
            description="A scheduling pass at least every minute (safety net)",
            schedule=events.Schedule.rate(Duration.minutes(TIMER_MINUTES)),
            targets=[
                targets.SqsQueue(
                    self.trigger_queue, message=events.RuleTargetInput.from_object({"reason": "timer"})
                )
            ],
        )

        # -- the bus and the example rule ------------------------------------------------------------
        self.bus = events.EventBus(self, "Bus", event_bus_name=f"berth-{stack.stack_name}")
        self.job_events_queue = sqs.Queue(
            self,
            "JobEventsQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(4),
        )
        self.example_rule = events.Rule(
            self,
            "JobEventsToQueue",
            description="Example: every Berth Job State Change into an SQS queue (JobEventsQueueUrl)",
            event_bus=self.bus,
            event_pattern=events.EventPattern(source=["berth"], detail_type=["Berth Job State Change"]),
            targets=[targets.SqsQueue(self.job_events_queue)],
        )

        # Named, so the functions' policies and environment can name its ARN without a reference
        # cycle (the state machine refers to the workflow function, whose role must not refer back).
        self.state_machine_name = f"berth-jobs-{stack.stack_name}"
        sm_arn = self.state_machine_arn = (
            f"arn:{stack.partition}:states:{stack.region}:{stack.account}:stateMachine:{self.state_machine_name}"
        )

        # -- the cloud branch's queues and the home bus's Batch events rule (cloud_dispatch.py) -------
        self.cloud = CloudDispatch(self, "CloudDispatch", bus=self.bus, config=cloud or CloudDispatchConfig())

        env = {
            **base_environment,
            **self.cloud.environment(),
            **{k: str(v) for k, v in (timings or DEFAULT_TIMINGS).items()},
            "BERTH_SCHEDULER_QUEUE_URL": self.trigger_queue.queue_url,
            "BERTH_HOST_QUEUE_PREFIX": HOST_QUEUE_PREFIX,
            "BERTH_EVENT_BUS_NAME": self.bus.event_bus_name,
            # Off by default (-c berth:cloudEnabled=true): then cloud offers stay out of the fleet.
            "BERTH_CLOUD_ENABLED": "true" if cloud_enabled else "false",
        }
        self.environment = env

        # -- functions -----------------------------------------------------------------------------
        self.workflow_fn = ControlFunction(
            self,
            "WorkflowFunction",
            handler="berth.handlers.workflow.lambda_handler",
            description="Berth job workflow tasks (placement wait, dispatch, classify, requeue, finalize)",
            environment={**env, "POWERTOOLS_SERVICE_NAME": "berth-workflow"},
            bundle=bundle,
        )
        self.scheduler_fn = ControlFunction(
            self,
            "SchedulerFunction",
            handler="berth.handlers.scheduler.lambda_handler",
            description="Berth scheduler service: one scheduling pass per trigger batch",
            # The pass restarts a queued job's execution whose start was lost (repair_executions).
            environment={
                **env,
                "BERTH_STATE_MACHINE_ARN": sm_arn,
                "POWERTOOLS_SERVICE_NAME": "berth-scheduler",
            },
            bundle=bundle,
            timeout_s=60,
            memory_mb=1769,
            reserved_concurrency=SCHEDULER_CONCURRENCY,
        )
        self.agent_fn = ControlFunction(
            self,
            "AgentApiFunction",
            handler="berth.handlers.agent_api.lambda_handler",
            description="Berth agent API (/v1/agent): host registration, heartbeats, claims, reports",
            environment={
                **env,
                "POWERTOOLS_SERVICE_NAME": "berth-agent-api",
                # /v1/agent/metrics stores attempts' usage samples here
                "BERTH_JOB_METRICS_TABLE": tables.job_metrics.table_name,
                # /v1/agent/credentials vends attempts' scoped credentials from this role
                **({"BERTH_JOB_ROLE_ARN": job_role.role_arn} if job_role is not None else {}),
            },
            bundle=bundle,
        )
        self.notifier_fn = ControlFunction(
            self,
            "NotifierFunction",
            handler="berth.handlers.notifier.lambda_handler",
            description="Berth notifier: job state changes from the events table's stream to EventBridge; "
            "a pass per batch that can place a job; completed runs into the run-time history",
            environment={**env, "POWERTOOLS_SERVICE_NAME": "berth-notifier"},
            bundle=bundle,
            reserved_concurrency=5,
        )

        self.batch_submit_fn = ControlFunction(
            self,
            "BatchSubmitFunction",
            handler="berth.handlers.batch_submit.lambda_handler",
            description="Berth cloud dispatcher: submits attempts to AWS Batch (throttled, idempotent)",
            environment={**env, "POWERTOOLS_SERVICE_NAME": "berth-batch-submit"},
            bundle=bundle,
            timeout_s=SUBMIT_TIMEOUT_S,
            reserved_concurrency=self.cloud.config.submit_concurrency,
        )
        self.batch_events_fn = ControlFunction(
            self,
            "BatchEventsFunction",
            handler="berth.handlers.batch_events.lambda_handler",
            description="Berth cloud watcher: Batch job state changes reconciled with DescribeJobs",
            environment={**env, "POWERTOOLS_SERVICE_NAME": "berth-batch-events"},
            bundle=bundle,
            timeout_s=60,
            reserved_concurrency=5,
        )

        # -- the state machine -----------------------------------------------------------------------
        self.state_machine = self._state_machine()
        # Every function answers task tokens (placement and dispatch waits); only the agent API
        # heartbeats them (agents' attempt heartbeats).
        answer_tokens = ["states:SendTaskSuccess", "states:SendTaskFailure"]

        # -- permissions, function by function (tests/infra holds the expected set) ----------------
        for fn in (self.workflow_fn, self.scheduler_fn, self.agent_fn):
            fn.allow("Jobs", ["dynamodb:GetItem", "dynamodb:PutItem"], [arns["jobs"]])
            fn.allow("JobEvents", ["dynamodb:PutItem"], [arns["job_events"]])
        # Pass requests: the scheduler's own (deferred placements, wake_at), the agent API's (a host
        # registered or undrained) and the job-events stream's consumer's, one per batch of changes
        # that can let a pass place a job (issue 18: no longer the workflow's tasks, one per job).
        for fn in (self.scheduler_fn, self.agent_fn, self.notifier_fn):
            fn.allow("Trigger", ["sqs:SendMessage"], [self.trigger_queue.queue_arn])
        self.workflow_fn.allow("Tokens", answer_tokens, [sm_arn])
        self.scheduler_fn.allow("Tokens", answer_tokens, [sm_arn])
        self.agent_fn.allow("Tokens", [*answer_tokens, "states:SendTaskHeartbeat"], [sm_arn])
        # The workflow's tasks end jobs (classify: FAILED/CANCELED, finalize: COMPLETED), and so does
        # the agent API when the last rank of an on-prem attempt reports success (COMPLETED, with the
        # attempt's final usage record): each decrements the tenant's active-job counter. The
        # scheduler never ends a job.
        for fn in (self.workflow_fn, self.agent_fn):
            fn.allow("TenantCounters", ["dynamodb:UpdateItem"], [arns["tenants"]], _tenant_counter_writes())
        self.agent_fn.allow("Usage", ["dynamodb:PutItem"], [arns["usage"]])
        self.workflow_fn.allow("Hosts", ["dynamodb:GetItem", "dynamodb:UpdateItem"], [arns["hosts"]])
        self.workflow_fn.allow(
            "HostQueues", ["sqs:CreateQueue", "sqs:TagQueue", "sqs:SendMessage"], [host_queues]
        )
        self.agent_fn.allow("Hosts", ["dynamodb:GetItem", "dynamodb:UpdateItem"], [arns["hosts"]])
        self.agent_fn.allow("Membership", ["dynamodb:GetItem"], [arns["tenants"]])
        self.agent_fn.allow("HostQueues", ["sqs:CreateQueue", "sqs:TagQueue"], [host_queues])
        # metrics: a batch of an attempt's usage samples (pynamodb's batch writer)
        self.agent_fn.allow("JobMetrics", ["dynamodb:BatchWriteItem"], [tables.job_metrics.table_arn])
        if job_role is not None:
            # CredentialService.for_attempt: AssumeRole with a session policy and SourceIdentity
            self.agent_fn.allow(
                "JobCredentials",
                ["sts:AssumeRole", "sts:SetSourceIdentity", "sts:TagSession"],
                [job_role.role_arn],
            )
        self.scheduler_fn.allow(
            "Hosts", ["dynamodb:Scan", "dynamodb:GetItem", "dynamodb:UpdateItem"], [arns["hosts"]]
        )
        # the queue index and the placed jobs (docs/scheduling.md); the full items of the jobs being
        # placed (BatchGetItem); a queued job's reason alone (UpdateItem of `reason`)
        self.scheduler_fn.allow(
            "Queue",
            ["dynamodb:Query"],
            [f"{arns['jobs']}/index/by_queue", f"{arns['jobs']}/index/by_placed"],
        )
        self.scheduler_fn.allow("JobsRead", ["dynamodb:BatchGetItem", "dynamodb:UpdateItem"], [arns["jobs"]])
        self.scheduler_fn.allow(
            "TenantDirectory", ["dynamodb:Query"], [f"{arns['tenants']}/index/by_directory"]
        )
        # TenantsRead: quotas, and the run-time histories of the tenants with jobs (RUNTIMES#, one
        # BatchGetItem a pass; berth.logic.runtimes). Only the notifier writes them (below).
        self.scheduler_fn.allow(
            "TenantsRead", ["dynamodb:GetItem", "dynamodb:BatchGetItem"], [arns["tenants"]]
        )
        # each tenant's queue as the pass saw it (QUEUE#<tenant>, replaced when it changed; the API
        # reads it with GetItem; berth.domain.queue_summary)
        self.scheduler_fn.allow(
            "QueueSummaries",
            ["dynamodb:PutItem"],
            [arns["tenants"]],
            {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["QUEUE#*"]}},
        )
        self.scheduler_fn.allow("Executions", ["states:StartExecution"], [sm_arn])
        # Job arrays (berth.logic.arrays): every writer of a task's state moves its array's counter
        # shard (<array id>#c<k>) in the same transaction; the scheduler's Lambda runs the expander:
        # it reads the list of arrays with work (ARRAYS#PENDING), creates tasks in chunks
        # (BatchWriteItem of jobs and first events), advances the parent and gives back the active-job
        # counts of tasks created canceled.
        counter_shards = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["*#c*"]}}
        for fn in (self.workflow_fn, self.agent_fn, self.batch_submit_fn, self.batch_events_fn):
            fn.allow("ArrayCounts", ["dynamodb:UpdateItem"], [arns["jobs"]], counter_shards)
        self.scheduler_fn.allow(
            "ArrayTasks",
            ["dynamodb:BatchWriteItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"],
            [arns["jobs"]],
        )
        self.scheduler_fn.allow("ArrayEvents", ["dynamodb:BatchWriteItem"], [arns["job_events"]])
        self.scheduler_fn.allow(
            "ArrayList",
            ["dynamodb:UpdateItem"],
            [arns["tenants"]],
            {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["ARRAYS#*", "TENANT#*"]}},
        )
        self.notifier_fn.allow("Publish", ["events:PutEvents"], [self.bus.event_bus_arn])
        # The stream's consumer learns a batch's completed runs (the COMPLETED rows' run_observation)
        # into their tenants' run-time histories: one conditional read-modify-write per tenant.
        self.notifier_fn.allow(
            "RuntimeHistory",
            ["dynamodb:GetItem", "dynamodb:PutItem"],
            [arns["tenants"]],
            {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["RUNTIMES#*"]}},
        )
        # The usage ledger: the workflow writes an attempt's final record, the scheduler running
        # attempts' records and reads tenants' months (their cloud spend against the budget).
        self.workflow_fn.allow("Usage", ["dynamodb:PutItem"], [arns["usage"]])
        self.scheduler_fn.allow("Usage", ["dynamodb:PutItem", "dynamodb:Query"], [arns["usage"]])

        self._cloud_permissions(arns, sm_arn)

        # -- event sources ------------------------------------------------------------------------
        submit_source, events_source = self.cloud.event_sources()
        self.batch_submit_fn.function.add_event_source(submit_source)
        self.batch_events_fn.function.add_event_source(events_source)
        self.scheduler_fn.function.add_event_source(
            sources.SqsEventSource(
                self.trigger_queue,
                batch_size=1000,
                max_batching_window=Duration.seconds(1),
                report_batch_item_failures=True,
            )
        )
        self.notifier_fn.function.add_event_source(
            sources.DynamoEventSource(
                tables.job_events,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=100,
                # Up to a second of job state changes per invocation: fewer invocations and PutEvents
                # (10 entries each) per job; a notification leaves at most a second later.
                max_batching_window=Duration.seconds(1),
                retry_attempts=10,
                bisect_batch_on_error=True,
            )
        )

        # Only Berth's notifier may put events with source "berth" on the bus (spoofed events).
        events.CfnEventBusPolicy(
            self,
            "BusPolicy",
            event_bus_name=self.bus.event_bus_name,
            statement_id="OnlyBerthPublishes",
            statement={
                "Sid": "OnlyBerthPublishes",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "events:PutEvents",
                "Resource": self.bus.event_bus_arn,
                "Condition": {
                    "StringNotEquals": {"aws:PrincipalArn": self.notifier_fn.role.role_arn},
                    "StringEquals": {"events:source": "berth"},
                },
            },
        )

        # -- what an on-prem host's own identity may do: its queue, and the agent API -----------------
        self.host_policy = iam.ManagedPolicy(
            self,
            "HostPolicy",
            description="Attach to each on-prem host's IAM role (tagged berth:host=<host id>)",
            statements=[
                iam.PolicyStatement(
                    sid="OwnWorkQueue",
                    actions=[
                        "sqs:ReceiveMessage",
                        "sqs:DeleteMessage",
                        "sqs:ChangeMessageVisibility",
                        "sqs:GetQueueUrl",
                    ],
                    resources=[
                        f"arn:{stack.partition}:sqs:{stack.region}:{stack.account}:{HOST_QUEUE_PREFIX}"
                        "${aws:PrincipalTag/berth:host}"
                    ],
                ),
            ],
        )

    def _cloud_permissions(self, arns: dict[str, str], sm_arn: str) -> None:
        """The cloud branch's grants: the submit queue, the circuits item, Batch lookups, and the submit
        role (SubmitJob, RegisterJobDefinition, TerminateJob and PassRole happen only in its sessions,
        tagged with the job's tenant; docs/security.md)."""
        submit_queue = self.cloud.submit_queue.queue_arn
        circuits = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["CIRCUITS"]}}
        self.workflow_fn.allow("BatchSubmitQueue", ["sqs:SendMessage"], [submit_queue])
        self.scheduler_fn.allow("BatchSubmitQueue", ["sqs:SendMessage"], [submit_queue])
        for fn in (self.batch_submit_fn, self.batch_events_fn):
            fn.allow("Jobs", ["dynamodb:GetItem", "dynamodb:PutItem"], [arns["jobs"]])
            fn.allow("CircuitsRead", ["dynamodb:GetItem"], [arns["tenants"]])
        self.batch_events_fn.allow("JobEvents", ["dynamodb:PutItem"], [arns["job_events"]])
        for fn in (self.batch_submit_fn, self.batch_events_fn, self.scheduler_fn):
            fn.allow("Circuits", ["dynamodb:PutItem"], [arns["tenants"]], circuits)
        self.batch_submit_fn.allow("Tokens", ["states:SendTaskFailure"], [sm_arn])
        self.batch_events_fn.allow("Tokens", ["states:SendTaskSuccess", "states:SendTaskFailure"], [sm_arn])
        # ListJobs and DescribeJobs have no resource-level permissions.
        self.batch_submit_fn.allow("BatchLookup", ["batch:ListJobs"], ["*"])
        self.batch_events_fn.allow("BatchLookup", ["batch:DescribeJobs"], ["*"])
        self.scheduler_fn.allow("BatchLookup", ["batch:DescribeJobs"], ["*"])
        role = self.cloud.config.submit_role_arn
        if role:
            for fn in (self.batch_submit_fn, self.batch_events_fn, self.scheduler_fn):
                fn.allow("AssumeBatchSubmitRole", ["sts:AssumeRole", "sts:TagSession"], [role])

    def _state_machine(self) -> sfn.StateMachine:
        fn = self.workflow_fn.function

        def task(
            state_id: str, action: str, extra: dict[str, Any], wait: bool = False, **kwargs: Any
        ) -> tasks.LambdaInvoke:
            payload = {"action": action, "job_id": sfn.JsonPath.string_at("$.job_id"), **extra}
            if wait:
                payload["task_token"] = sfn.JsonPath.task_token
            return tasks.LambdaInvoke(
                self,
                state_id,
                lambda_function=fn,
                payload=sfn.TaskInput.from_object(payload),
                integration_pattern=(
                    sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN
                    if wait
                    else sfn.IntegrationPattern.REQUEST_RESPONSE
                ),
                retry_on_service_exceptions=True,
                **kwargs,
            )

        attempt = {"attempt": sfn.JsonPath.number_at("$.placed.attempt")}
        wait_for_placement = task(
            "WaitForPlacement",
            "await_placement",
            {"execution": sfn.JsonPath.string_at("$$.Execution.Id")},
            wait=True,
            result_path="$.placed",
            comment="Park a task token on the queued job; the scheduler answers it when it places the job",
        )
        dispatch_onprem = task(
            "DispatchOnPrem",
            "dispatch_onprem",
            attempt,
            wait=True,
            result_path="$.result",
            heartbeat_timeout=sfn.Timeout.at("$.heartbeat_s"),
            task_timeout=sfn.Timeout.at("$.placed.timeout_s"),
            comment="Work messages to the placed hosts; their agents report through the agent API",
        )
        dispatch_cloud = task(
            "DispatchCloud",
            "dispatch_cloud",
            attempt,
            wait=True,
            result_path="$.result",
            # No heartbeat: Batch has no channel for one. The scheduler's sweep watches every cloud
            # attempt through DescribeJobs each pass (capacity waits, lost jobs, missed events); the
            # timeout is the job's limit plus the wait for an instance (a last resort).
            task_timeout=sfn.Timeout.at("$.placed.timeout_s"),
            comment="Submit request to the Batch submit queue; Batch events (and the sweep) answer it",
        )
        finalize = task(
            "Finalize",
            "finalize",
            attempt,
            result_selector={"status": sfn.JsonPath.string_at("$.Payload.status")},
            result_path="$.final",
        )
        classify = task(
            "ClassifyFailure",
            "classify_failure",
            {
                **attempt,
                "error": sfn.JsonPath.string_at("$.failure.Error"),
                "cause": sfn.JsonPath.string_at("$.failure.Cause"),
            },
            result_selector={
                "action": sfn.JsonPath.string_at("$.Payload.action"),
                "backoff_s": sfn.JsonPath.number_at("$.Payload.backoff_s"),
            },
            result_path="$.decision",
        )
        backoff = sfn.Wait(self, "Backoff", time=sfn.WaitTime.seconds_path("$.decision.backoff_s"))
        requeue = task(
            "Requeue",
            "requeue",
            {},
            result_selector={"outcome": sfn.JsonPath.string_at("$.Payload.outcome")},
            result_path="$.requeued",
        )
        done = sfn.Succeed(self, "Done")
        canceled = sfn.Succeed(self, "Canceled")
        failed = sfn.Fail(self, "JobFailed", error="Berth.JobFailed", cause="the job failed; see its events")

        # A task Lambda that fails (the store briefly unavailable, a crash) is retried with backoff:
        # each is idempotent, and none may leave its job stranded by ending the execution.
        for step in (wait_for_placement, finalize, classify, requeue):
            step.add_retry(
                errors=["States.TaskFailed"],
                interval=Duration.seconds(1),
                max_attempts=6,
                backoff_rate=2,
                jitter_strategy=sfn.JitterType.FULL,
            )
        dispatch_onprem.add_catch(classify, errors=["States.ALL"], result_path="$.failure")
        # The last rank's `succeeded` report completes the job itself (AgentService.report) and says
        # so; Finalize runs only when it did not (a start never reported, an older agent API).
        dispatch_onprem.next(
            sfn.Choice(self, "CompletedByReport")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.is_present("$.result.completed"),
                    sfn.Condition.boolean_equals("$.result.completed", True),
                ),
                done,
            )
            .otherwise(finalize)
        )
        dispatch_cloud.add_catch(classify, errors=["States.ALL"], result_path="$.failure")
        dispatch_cloud.next(finalize)
        finalize.next(done)
        classify.next(
            sfn.Choice(self, "RetryOrEnd")
            .when(sfn.Condition.string_equals("$.decision.action", "retry"), backoff)
            .when(sfn.Condition.string_equals("$.decision.action", "cancel"), canceled)
            .when(sfn.Condition.string_equals("$.decision.action", "done"), done)
            .otherwise(failed)
        )
        backoff.next(requeue)
        requeue.next(
            sfn.Choice(self, "Requeued")
            .when(sfn.Condition.string_equals("$.requeued.outcome", "queued"), wait_for_placement)
            .otherwise(canceled)
        )
        definition = wait_for_placement.next(
            sfn.Choice(self, "Placed")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.string_equals("$.placed.outcome", "placed"),
                    sfn.Condition.string_equals("$.placed.site", "onprem"),
                ),
                dispatch_onprem,
            )
            .when(
                sfn.Condition.and_(
                    sfn.Condition.string_equals("$.placed.outcome", "placed"),
                    sfn.Condition.string_equals("$.placed.site", "cloud"),
                ),
                dispatch_cloud,
            )
            .when(sfn.Condition.string_equals("$.placed.outcome", "canceled"), canceled)
            .otherwise(done)
        )
        self.state_machine_logs = logs.LogGroup(
            self, "StateMachineLogs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY
        )
        return sfn.StateMachine(
            self,
            "JobStateMachine",
            state_machine_name=self.state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=self.state_machine_logs, level=sfn.LogLevel.ALL, include_execution_data=False
            ),
            comment="One execution per Berth job (named after it): placement, dispatch, retries, finish",
        )
