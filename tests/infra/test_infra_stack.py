"""Template assertions: the contract other components rely on and the security posture."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match

from berth_infra.api import AGENT_ROUTES, API_STAGE_NAME, ROUTES
from tests.infra.conftest import Synthesized


def _table_by_output(s: Synthesized, output_id: str) -> dict[str, Any]:
    ref = s.json["Outputs"][output_id]["Value"]["Ref"]
    table: dict[str, Any] = s.json["Resources"][ref]
    assert table["Type"] == "AWS::DynamoDB::Table"
    return table


def _key_schema(props: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k["AttributeName"], k["KeyType"]) for k in props["KeySchema"]]


def _attr_types(props: dict[str, Any]) -> dict[str, str]:
    return {a["AttributeName"]: a["AttributeType"] for a in props["AttributeDefinitions"]}


def test_stack_name_and_outputs(synthesized: Synthesized) -> None:
    assert synthesized.stack.stack_name == "Berth"
    assert synthesized.template_path.name == "Berth.template.json"
    assert set(synthesized.json["Outputs"]) == {
        "ApiUrl",
        "ApiId",
        "JobsTableName",
        "JobEventsTableName",
        "TenantsTableName",
        "IdempotencyTableName",
        "HostsTableName",
        "JobMetricsTableName",
        "UsageTableName",
        "ApiFunctionName",
        "ArtifactsBucketName",
        "DataBucketName",
        "JobRoleArn",
        "StateMachineArn",
        "SchedulerQueueUrl",
        "EventBusName",
        "JobEventsQueueUrl",
        "HostPolicyArn",
        "BatchSubmitRoleArn",
        "CloudRegions",
        "BatchSubmitQueueUrl",
        "BatchEventsQueueUrl",
        "AlarmTopicArn",
        "DashboardName",
    }
    url = synthesized.json["Outputs"]["ApiUrl"]["Value"]["Fn::Join"][1]
    stage_id = url[-2]["Ref"]
    assert synthesized.json["Resources"][stage_id]["Properties"]["StageName"] == API_STAGE_NAME
    assert url[0] == "https://" and url[-1] == "/"
    outputs = synthesized.json["Outputs"]
    resources = synthesized.json["Resources"]
    for output_id, type_ in {
        "SchedulerQueueUrl": "AWS::SQS::Queue",
        "JobEventsQueueUrl": "AWS::SQS::Queue",
        "EventBusName": "AWS::Events::EventBus",
        "HostPolicyArn": "AWS::IAM::ManagedPolicy",
    }.items():
        assert resources[outputs[output_id]["Value"]["Ref"]]["Type"] == type_, output_id
    # The state machine's ARN is built from its name (no reference cycle with the workflow function).
    (machine,) = synthesized.resources("AWS::StepFunctions::StateMachine").values()
    arn = outputs["StateMachineArn"]["Value"]["Fn::Join"][1]
    assert arn[-1] == ":stateMachine:" + machine["Properties"]["StateMachineName"]


def test_every_table_is_on_demand_encrypted_with_pitr(synthesized: Synthesized) -> None:
    tables = synthesized.resources("AWS::DynamoDB::Table")
    assert len(tables) == 7
    for table in tables.values():
        props = table["Properties"]
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert props["SSESpecification"]["SSEEnabled"] is True


def test_state_tables_are_retained(synthesized: Synthesized) -> None:
    for output_id in (
        "JobsTableName",
        "JobEventsTableName",
        "TenantsTableName",
        "HostsTableName",
        "UsageTableName",
    ):
        table = _table_by_output(synthesized, output_id)
        assert table["DeletionPolicy"] == "Retain"
        assert table["UpdateReplacePolicy"] == "Retain"


def test_jobs_table_schema(synthesized: Synthesized) -> None:
    props = _table_by_output(synthesized, "JobsTableName")["Properties"]
    assert _key_schema(props) == [("job_id", "HASH")]
    assert _attr_types(props) == {
        "job_id": "S",
        "tenant": "S",
        "tenant_status": "S",
        "created_key": "S",
        "queue_pk": "S",
        "queue_sk": "S",
        "placed_status": "S",
    }
    gsis = {g["IndexName"]: g for g in props["GlobalSecondaryIndexes"]}
    assert set(gsis) == {"by_tenant", "by_tenant_status", "by_queue", "by_placed"}
    assert _key_schema(gsis["by_tenant"]) == [("tenant", "HASH"), ("created_key", "RANGE")]
    assert _key_schema(gsis["by_tenant_status"]) == [("tenant_status", "HASH"), ("created_key", "RANGE")]
    # the queue index: sparse, per tenant and shard, only what the pass reads (docs/scheduling.md)
    assert _key_schema(gsis["by_queue"]) == [("queue_pk", "HASH"), ("queue_sk", "RANGE")]
    assert gsis["by_queue"]["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": ["version", "reason", "queue_entry"],
    }
    assert _key_schema(gsis["by_placed"]) == [("placed_status", "HASH"), ("created_key", "RANGE")]
    assert gsis["by_placed"]["Projection"] == {"ProjectionType": "ALL"}
    for name in ("by_tenant", "by_tenant_status"):
        assert gsis[name]["Projection"] == {"ProjectionType": "KEYS_ONLY"}


def test_job_events_tenants_idempotency_schemas(synthesized: Synthesized) -> None:
    events = _table_by_output(synthesized, "JobEventsTableName")["Properties"]
    assert _key_schema(events) == [("job_id", "HASH"), ("seq", "RANGE")]
    assert _attr_types(events) == {"job_id": "S", "seq": "N"}

    tenants = _table_by_output(synthesized, "TenantsTableName")["Properties"]
    assert _key_schema(tenants) == [("pk", "HASH")]
    assert _attr_types(tenants) == {"pk": "S", "directory": "S"}
    [directory] = tenants["GlobalSecondaryIndexes"]
    assert directory["IndexName"] == "by_directory"
    assert _key_schema(directory) == [("directory", "HASH"), ("pk", "RANGE")]
    assert directory["Projection"] == {"ProjectionType": "KEYS_ONLY"}

    hosts = _table_by_output(synthesized, "HostsTableName")["Properties"]
    assert _key_schema(hosts) == [("host_id", "HASH")]
    assert _attr_types(hosts) == {"host_id": "S"}
    assert "GlobalSecondaryIndexes" not in hosts

    usage = _table_by_output(synthesized, "UsageTableName")["Properties"]
    assert _key_schema(usage) == [("pk", "HASH"), ("sk", "RANGE")]
    assert _attr_types(usage) == {"pk": "S", "sk": "S"}
    assert "GlobalSecondaryIndexes" not in usage

    idem = _table_by_output(synthesized, "IdempotencyTableName")["Properties"]
    assert _key_schema(idem) == [("id", "HASH")]
    assert _attr_types(idem) == {"id": "S"}
    assert idem["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}
    for props in (events, idem):
        assert "GlobalSecondaryIndexes" not in props


def test_job_metrics_schema(synthesized: Synthesized) -> None:
    table = _table_by_output(synthesized, "JobMetricsTableName")
    props = table["Properties"]
    assert _key_schema(props) == [("job_id", "HASH"), ("sk", "RANGE")]
    assert _attr_types(props) == {"job_id": "S", "sk": "S"}
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert "GlobalSecondaryIndexes" not in props
    assert table["DeletionPolicy"] == "Delete"  # samples expire anyway


def _function_by_handler(s: Synthesized, handler: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (fn_id, fn)
        for fn_id, fn in s.resources("AWS::Lambda::Function").items()
        if fn["Properties"]["Handler"] == handler
    ]
    return found


API_HANDLER = "berth.handlers.api.lambda_handler"
AGENT_HANDLER = "berth.handlers.agent_api.lambda_handler"


def test_api_function(synthesized: Synthesized) -> None:
    assert len(synthesized.resources("AWS::Lambda::Function")) == 7
    fn_id, fn = _function_by_handler(synthesized, API_HANDLER)
    assert synthesized.json["Outputs"]["ApiFunctionName"]["Value"] == {"Ref": fn_id}
    props = fn["Properties"]
    assert props["Handler"] == "berth.handlers.api.lambda_handler"
    assert props["Runtime"] in ("python3.11", "python3.12")
    assert props["Architectures"] == ["x86_64"]
    assert props["MemorySize"] == 512
    assert props["Timeout"] == 29
    assert props["TracingConfig"] == {"Mode": "Active"}
    outputs = synthesized.json["Outputs"]
    assert props["Environment"]["Variables"] == {
        "BERTH_JOBS_TABLE": outputs["JobsTableName"]["Value"],
        "BERTH_JOB_EVENTS_TABLE": outputs["JobEventsTableName"]["Value"],
        "BERTH_TENANTS_TABLE": outputs["TenantsTableName"]["Value"],
        "BERTH_IDEMPOTENCY_TABLE": outputs["IdempotencyTableName"]["Value"],
        "BERTH_HOSTS_TABLE": outputs["HostsTableName"]["Value"],
        "BERTH_USAGE_TABLE": outputs["UsageTableName"]["Value"],
        "BERTH_ARTIFACTS_BUCKET": outputs["ArtifactsBucketName"]["Value"],
        "BERTH_DATA_BUCKET": outputs["DataBucketName"]["Value"],
        "POWERTOOLS_SERVICE_NAME": "berth-api",
        "POWERTOOLS_METRICS_NAMESPACE": "Berth",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        "BERTH_RATE_LIMIT_REQUESTS": "50",
        "BERTH_RATE_LIMIT_WINDOW_S": "1",
        # The workflow's timings (the execution input carries the heartbeat), its trigger queue and
        # the state machine it starts one execution of per job.
        "BERTH_HEARTBEAT_S": "60",
        "BERTH_LEASE_S": "90",
        "BERTH_OUTAGE_TOLERANCE_S": "300",
        "BERTH_FENCE_MARGIN_S": "60",
        "BERTH_CLAIM_S": "300",
        "BERTH_BACKOFF_BASE_S": "2",
        "BERTH_BACKOFF_CAP_S": "300",
        "BERTH_ORPHAN_GRACE_S": "120",
        "BERTH_SCHEDULER_QUEUE_URL": outputs["SchedulerQueueUrl"]["Value"],
        "BERTH_STATE_MACHINE_ARN": outputs["StateMachineArn"]["Value"],
        "BERTH_CLOUD_ENABLED": "true",
        "BERTH_JOB_METRICS_TABLE": outputs["JobMetricsTableName"]["Value"],
        # What the Batch compute environments hold: offers of anything else are never made.
        "BERTH_CLOUD_CAPACITY": json.dumps(
            {r["region"]: sorted(r["instance_types"]) for r in json.loads(outputs["CloudRegions"]["Value"])},
            separators=(",", ":"),
        ),
    }
    log_group_id = props["LoggingConfig"]["LogGroup"]["Ref"]
    assert synthesized.json["Resources"][log_group_id]["Type"] == "AWS::Logs::LogGroup"


def test_every_log_group_has_retention(synthesized: Synthesized) -> None:
    log_groups = synthesized.resources("AWS::Logs::LogGroup")
    assert len(log_groups) >= 2
    for log_group in log_groups.values():
        assert log_group["Properties"]["RetentionInDays"] == 30


def _statements(s: Synthesized) -> list[dict[str, Any]]:
    """Every identity-policy statement of the stack: policies, managed policies, roles' inline ones."""
    out: list[dict[str, Any]] = []
    for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for policy in s.resources(kind).values():
            out.extend(_as_list(policy["Properties"]["PolicyDocument"]["Statement"]))
    for role in s.resources("AWS::IAM::Role").values():
        for inline in role["Properties"].get("Policies", []):
            out.extend(_as_list(inline["PolicyDocument"]["Statement"]))
    return out


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


#: What each function's code does, written out independently of infra/: (resource, actions) per
#: statement. A resource is a table output name, "<output>/index/<name>", the function's log group
#: ("logs") or "*". A new function, a new action or a new table must be added here on purpose.
STATE_MACHINE = "stateMachine:berth-jobs-Berth"
HOST_QUEUES = "sqs:berth-host-*"
WORKFLOW_FUNCTION = "function:berth.handlers.workflow.lambda_handler"

EXPECTED_STATEMENTS: dict[str, dict[tuple[str, str | None], set[str]]] = {
    "berth.handlers.api.lambda_handler": {
        ("*", None): {"xray:PutTraceSegments", "xray:PutTelemetryRecords"},
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        ("JobsTableName", None): {
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:BatchGetItem",
        },
        ("JobsTableName/index/by_tenant", None): {"dynamodb:Query"},
        ("JobsTableName/index/by_tenant_status", None): {"dynamodb:Query"},
        # explain reads the queue as a pass does
        ("JobsTableName/index/by_queue", None): {"dynamodb:Query"},
        ("JobsTableName/index/by_placed", None): {"dynamodb:Query"},
        ("TenantsTableName/index/by_directory", None): {"dynamodb:Query"},
        # the fleet read; PUT /v1/hosts/{host}/drain sets a host's drain request, .../admission its bound
        ("HostsTableName", None): {"dynamodb:Scan", "dynamodb:UpdateItem"},
        # GET /v1/tenants/{tenant}/usage
        ("UsageTableName", None): {"dynamodb:Query"},
        ("JobEventsTableName", None): {"dynamodb:PutItem", "dynamodb:Query"},
        # quotas, membership, documents; explain and capacity read the run-time histories (RUNTIMES#)
        ("TenantsTableName", None): {"dynamodb:GetItem", "dynamodb:BatchGetItem"},
        ("TenantsTableName", "TENANT#*,DATASET#*,RATE#*,KEY#*,DOC#*,ARRAYS#*,CIRCUITS"): {
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        },
        ("ArtifactsBucketName/bundles/*", None): {"s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"},
        # GET /v1/jobs/{id}/outputs: list job output prefixes only, presign GETs of their objects
        ("DataBucketName", "s3:prefix=*/jobs/*"): {"s3:ListBucket"},
        ("DataBucketName/*/jobs/*", None): {"s3:GetObject"},
        ("secret:berth/*", None): {"secretsmanager:DescribeSecret"},
        ("IdempotencyTableName", None): {
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
        },
        # WorkflowHooks: start a submitted job's execution; answer the placement wait of a job
        # canceled while queued.
        (STATE_MACHINE, None): {"states:StartExecution", "states:SendTaskSuccess"},
        # a pass when a running cloud job is canceled (the sweep terminates its Batch job)
        ("SchedulerQueueUrl", None): {"sqs:SendMessage"},
        # GET /v1/jobs/{id}/logs (CloudWatchLogReader) and /metrics (DynamoMetricsRepository)
        ("log-group:/berth/jobs/*", None): {"logs:GetLogEvents"},
        ("JobMetricsTableName", None): {"dynamodb:Query"},
    },
    # WorkflowService (logic/workflow.py): one action per task state.
    "berth.handlers.workflow.lambda_handler": {
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        # jobs.get; jobs.update (a put) and jobs.save (a transaction: job put + event put)
        ("JobsTableName", None): {"dynamodb:GetItem", "dynamodb:PutItem"},
        # an array task's change moves its array's counter shard in the same transaction
        ("JobsTableName", "*#c*"): {"dynamodb:UpdateItem"},
        ("JobEventsTableName", None): {"dynamodb:PutItem"},
        # classify (FAILED/CANCELED) and finalize (COMPLETED) decrement the tenant's active jobs
        ("TenantsTableName", "TENANT#*"): {"dynamodb:UpdateItem"},
        # release_holds: hosts.release reads the hold, then removes it conditionally
        ("HostsTableName", None): {"dynamodb:GetItem", "dynamodb:UpdateItem"},
        # classify and finalize write the ended attempt's final usage record
        ("UsageTableName", None): {"dynamodb:PutItem"},
        # await_placement answers a placed/ended job's token; dispatch_onprem fails a stale one
        (STATE_MACHINE, None): {"states:SendTaskSuccess", "states:SendTaskFailure"},
        # dispatch_onprem: SqsWorkQueues.send ensures the host's queue (created with a tag) first
        (HOST_QUEUES, None): {"sqs:CreateQueue", "sqs:TagQueue", "sqs:SendMessage"},
        # dispatch_cloud: the attempt's submit request
        ("BatchSubmitQueueUrl", None): {"sqs:SendMessage"},
    },
    # SchedulerService (logic/scheduler_service.py) and SnapshotSource (logic/snapshot.py).
    "berth.handlers.scheduler.lambda_handler": {
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        # jobs.get (orphans), jobs.update (reasons, stop), jobs.save (QUEUED -> STARTING: never a
        # terminal transition, so no tenant counter)
        ("JobsTableName", None): {
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:BatchWriteItem",
            "dynamodb:BatchGetItem",
            "dynamodb:UpdateItem",
        },
        # the queue index and the placed jobs; the tenants with jobs (by_directory)
        ("JobsTableName/index/by_queue", None): {"dynamodb:Query"},
        ("JobsTableName/index/by_placed", None): {"dynamodb:Query"},
        ("TenantsTableName/index/by_directory", None): {"dynamodb:Query"},
        ("JobEventsTableName", None): {"dynamodb:PutItem", "dynamodb:BatchWriteItem"},
        # the array expander (berth.logic.arrays): the list of arrays with work, tasks created canceled
        ("TenantsTableName", "ARRAYS#*,TENANT#*"): {"dynamodb:UpdateItem"},
        # quotas, registered datasets, the stored policy and offers (DOC#), run-time histories
        ("TenantsTableName", None): {"dynamodb:GetItem", "dynamodb:BatchGetItem"},
        # list_hosts, get, hold/release/mark_lost
        ("HostsTableName", None): {"dynamodb:Scan", "dynamodb:GetItem", "dynamodb:UpdateItem"},
        # accrual writes running attempts' usage records; the budget reads tenants' months
        ("UsageTableName", None): {"dynamodb:PutItem", "dynamodb:Query"},
        # answers placement tokens; fails the dispatch token of a lost host's attempt
        (STATE_MACHINE, None): {"states:SendTaskSuccess", "states:SendTaskFailure", "states:StartExecution"},
        # wake_at (a delayed pass), and the SQS event source mapping's own actions
        ("SchedulerQueueUrl", None): {
            "sqs:SendMessage",
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        },
        # CloudSweep (logic/cloud_sweep.py): a lost submit request sent again, Batch jobs looked up,
        # circuit failures recorded (the CIRCUITS item only)
        ("BatchSubmitQueueUrl", None): {"sqs:SendMessage"},
        ("*", None): {"batch:DescribeJobs"},
        ("TenantsTableName", "CIRCUITS"): {"dynamodb:PutItem"},
        # each tenant's queue as the pass saw it (positions, estimated starts; berth.domain.queue_summary)
        ("TenantsTableName", "QUEUE#*"): {"dynamodb:PutItem"},
        # Batch calls act through BatchSubmitRole, assumed with a berth:tenant session tag
        ("BatchSubmitRoleArn", None): {"sts:AssumeRole", "sts:TagSession"},
    },
    # CloudDispatchService.submit (logic/cloud_dispatch.py), fed by the FIFO submit queue; SubmitJob,
    # RegisterJobDefinition and PassRole only in BatchSubmitRole sessions
    "berth.handlers.batch_submit.lambda_handler": {
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        ("JobsTableName", None): {"dynamodb:GetItem", "dynamodb:PutItem"},
        # an array task's change moves its array's counter shard in the same transaction
        ("JobsTableName", "*#c*"): {"dynamodb:UpdateItem"},
        ("TenantsTableName", None): {"dynamodb:GetItem"},
        ("TenantsTableName", "CIRCUITS"): {"dynamodb:PutItem"},
        # fails the dispatch token of an attempt whose region refused the submit, or was canceled
        (STATE_MACHINE, None): {"states:SendTaskFailure"},
        # find: a submit that may have happened before a redelivery
        ("*", None): {"batch:ListJobs"},
        # Batch calls act through BatchSubmitRole, assumed with a berth:tenant session tag
        ("BatchSubmitRoleArn", None): {"sts:AssumeRole", "sts:TagSession"},
        ("BatchSubmitQueueUrl", None): {
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        },
    },
    # CloudDispatchService.on_event, fed by the home bus's aws.batch rule
    "berth.handlers.batch_events.lambda_handler": {
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        # jobs.save STARTING -> RUNNING (job + event), jobs.update (the Batch job id adopted)
        ("JobsTableName", None): {"dynamodb:GetItem", "dynamodb:PutItem"},
        # an array task's change moves its array's counter shard in the same transaction
        ("JobsTableName", "*#c*"): {"dynamodb:UpdateItem"},
        ("JobEventsTableName", None): {"dynamodb:PutItem"},
        ("TenantsTableName", None): {"dynamodb:GetItem"},
        ("TenantsTableName", "CIRCUITS"): {"dynamodb:PutItem"},
        (STATE_MACHINE, None): {"states:SendTaskSuccess", "states:SendTaskFailure"},
        ("*", None): {"batch:DescribeJobs"},
        # an attempt's last checkpoint, listed once when it ends (logic/cloud_checkpoints.py)
        ("DataBucketName", "s3:prefix=*/jobs/*/checkpoints/"): {"s3:ListBucket"},
        # Batch calls act through BatchSubmitRole, assumed with a berth:tenant session tag
        ("BatchSubmitRoleArn", None): {"sts:AssumeRole", "sts:TagSession"},
        ("BatchEventsQueueUrl", None): {
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        },
    },
    # AgentService (logic/agent.py) and TenantService.host.
    AGENT_HANDLER: {
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        # jobs.get, jobs.update (claim, report), jobs.save (STARTING -> RUNNING, and the last rank's
        # success: RUNNING -> COMPLETED)
        ("JobsTableName", None): {"dynamodb:GetItem", "dynamodb:PutItem"},
        # an array task's change moves its array's counter shard in the same transaction
        ("JobsTableName", "*#c*"): {"dynamodb:UpdateItem"},
        ("JobEventsTableName", None): {"dynamodb:PutItem"},
        # the caller's PRINCIPAL# membership row (role host)
        ("TenantsTableName", None): {"dynamodb:GetItem"},
        # the completion decrements the tenant's active-job counter, and stores the final usage record
        ("TenantsTableName", "TENANT#*"): {"dynamodb:UpdateItem"},
        ("UsageTableName", None): {"dynamodb:PutItem"},
        # register (get + conditional update), heartbeat
        ("HostsTableName", None): {"dynamodb:GetItem", "dynamodb:UpdateItem"},
        # attempt heartbeats, success of the last rank, failures, cancel before start
        (STATE_MACHINE, None): {
            "states:SendTaskSuccess",
            "states:SendTaskFailure",
            "states:SendTaskHeartbeat",
        },
        # register ensures the host's queue (never sends to it)
        (HOST_QUEUES, None): {"sqs:CreateQueue", "sqs:TagQueue"},
        ("SchedulerQueueUrl", None): {"sqs:SendMessage"},
        # credentials: CredentialService.for_attempt (session policy + SourceIdentity = job id)
        ("JobRoleArn", None): {"sts:AssumeRole", "sts:SetSourceIdentity", "sts:TagSession"},
        # metrics: DynamoMetricsRepository.put (pynamodb's batch writer)
        ("JobMetricsTableName", None): {"dynamodb:BatchWriteItem"},
    },
    # EventBridgePublisher and SqsPassTrigger (dal/workflow.py) fed by the job-events stream.
    "berth.handlers.notifier.lambda_handler": {
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        ("EventBusName", None): {"events:PutEvents"},
        # a batch's completed runs learnt into their tenants' run-time histories (berth.logic.runtimes)
        ("TenantsTableName", "RUNTIMES#*"): {"dynamodb:GetItem", "dynamodb:PutItem"},
        # one pass per batch whose changes can let it place a job (berth.logic.pass_triggers)
        ("SchedulerQueueUrl", None): {"sqs:SendMessage"},
        ("JobEventsTableName/stream", None): {
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator",
        },
        ("*", None): {"dynamodb:ListStreams"},
    },
}

#: The only wildcards allowed in any identity policy of the stack, each with its reason.
WILDCARD_ALLOW_LIST: dict[tuple[str, str], str] = {
    ("xray:PutTraceSegments", "*"): "X-Ray has no resource-level permissions",
    ("xray:PutTelemetryRecords", "*"): "X-Ray has no resource-level permissions",
    ("s3:GetObject", "ArtifactsBucketName/bundles/*"): "bundle keys of every tenant: the API checks the "
    "caller's tenant's key; a job's session policy names its one bundle",
    ("s3:PutObject", "ArtifactsBucketName/bundles/*"): "signs presigned uploads of the caller's tenant's key",
    ("s3:PutObjectTagging", "ArtifactsBucketName/bundles/*"): "marks the caller's bundle referenced",
    ("secretsmanager:DescribeSecret", "secret:berth/*"): "existence of a secret under the caller's prefix",
    ("s3:GetObject", "DataBucketName/*"): "job role's outer bound; each session policy narrows it",
    ("s3:PutObject", "DataBucketName/*/jobs/*"): "job role's outer bound of output prefixes",
    ("s3:GetObject", "DataBucketName/*/jobs/*"): "the API presigns GETs of a tenant-checked job's outputs",
    (
        "secretsmanager:GetSecretValue",
        "secret:berth/*",
    ): "job role's outer bound; sessions name their secrets",
    ("sqs:CreateQueue", HOST_QUEUES): "one work queue per host, created at registration: host ids are "
    "not known at deploy time",
    ("sqs:TagQueue", HOST_QUEUES): "the host queue is tagged berth:host at creation",
    ("sqs:SendMessage", HOST_QUEUES): "work messages to the placed hosts' queues",
    ("logs:GetLogEvents", "log-group:/berth/jobs/*"): "every tenant's job log group (created per "
    "tenant): the API reads only the caller's job's stream, after the tenant check",
    ("dynamodb:ListStreams", "*"): "the stream event source's ListStreams has no resource-level permissions",
    ("batch:DescribeJobs", "*"): "Batch lookups have no resource-level permissions (read only)",
    ("batch:ListJobs", "*"): "Batch lookups have no resource-level permissions (read only)",
    ("lambda:InvokeFunction", f"{WORKFLOW_FUNCTION}:*"): "CDK's LambdaInvoke grant: the workflow "
    "function's versions and aliases, the one function the state machine calls",
    **{
        (action, "*"): "state machine logging and tracing: no resource-level permissions"
        for action in (
            "logs:CreateLogDelivery",
            "logs:DeleteLogDelivery",
            "logs:DescribeLogGroups",
            "logs:DescribeResourcePolicies",
            "logs:GetLogDelivery",
            "logs:ListLogDeliveries",
            "logs:PutResourcePolicy",
            "logs:UpdateLogDelivery",
            "xray:GetSamplingRules",
            "xray:GetSamplingTargets",
        )
    },
    # The cloud path (cloud_roles.py): each tenant's Batch job role, on that tenant's prefixes only.
    **{
        (action, resource.format(t=tenant)): "a Batch job role is one tenant's: keys under its prefix"
        for tenant in ("vision", "nlp", "platform")
        for action, resource in (
            ("s3:GetObject", "ArtifactsBucketName/bundles/{t}/*"),
            ("s3:GetObject", "DataBucketName/{t}/*"),
            ("s3:PutObject", "DataBucketName/{t}/jobs/*"),
            ("secretsmanager:GetSecretValue", "secret:berth/{t}/*"),
        )
    },
    # BatchSubmitRole, in each region of the shipped price file.
    **{
        (action, f"arn::batch:{region}::{resource}"): "Batch names jobs, Berth's definitions at run time; "
        "Berth's queues of the region by their prefix"
        for region in ("us-east-1", "us-east-2", "us-west-2")
        for action, resource in (
            ("batch:SubmitJob", f"job-queue/berth-{region}-*"),  # one queue per instance type
            ("batch:SubmitJob", "job-definition/berth-*"),
            ("batch:RegisterJobDefinition", "job-definition/berth-*"),
            ("batch:TagResource", "job-definition/berth-*"),
            ("batch:TagResource", "job/*"),
            ("batch:TerminateJob", "job/*"),
        )
    },
    **{
        (action, "*"): "Batch's Describe* calls have no resource-level permissions"
        for action in ("batch:DescribeJobs", "batch:DescribeJobDefinitions", "batch:DescribeJobQueues")
    },
    ("iam:PassRole", "iam:role/Berth-job-*"): "only a Berth-job-<tenant> role whose berth:tenant tag is the "
    "session's, passed to Batch or ECS tasks",
    ("iam:PassRole", "iam:role/Berth-exec-*"): "only a Berth-exec-<tenant> role whose berth:tenant tag is "
    "the session's, passed to Batch or ECS tasks",
    # Each tenant's ECS execution role (Berth-exec-<tenant>): its secrets are covered above (same key);
    # image pulls as the ECS instance role already allows.
    ("ecr:GetAuthorizationToken", "*"): "ECR's registry token has no resource-level permissions",
    **{
        (action, "arn::ecr:*::repository/*"): "image pulls from the account's ECR (named by jobs at submit)"
        for action in ("ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage")
    },
}


def _resource_name(s: Synthesized, resource: Any, log_groups: set[str]) -> str:
    """A readable name for a policy resource: tables and buckets by their output name."""
    if isinstance(resource, str):
        return resource
    named = {
        s.json["Outputs"][o]["Value"]["Ref"]: o
        for o in s.json["Outputs"]
        if o.endswith(("TableName", "BucketName", "QueueUrl", "BusName"))
        and "Ref" in s.json["Outputs"][o]["Value"]
    }
    named.update(
        {
            s.json["Outputs"][o]["Value"]["Fn::GetAtt"][0]: o
            for o in s.json["Outputs"]
            if o.endswith("RoleArn") and "Fn::GetAtt" in s.json["Outputs"][o]["Value"]
        }
    )
    named.update(
        {
            fn_id: f"function:{fn['Properties']['Handler']}"
            for fn_id, fn in s.resources("AWS::Lambda::Function").items()
        }
    )

    def get_att(value: dict[str, Any]) -> str:
        logical, attribute = value["Fn::GetAtt"]
        if logical in log_groups:
            return "logs"
        return named[logical] + ("/stream" if attribute == "StreamArn" else "")

    if "Fn::GetAtt" in resource:
        return get_att(resource)
    parts = resource["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else (get_att(p) if "Fn::GetAtt" in p else "") for p in parts)
    if text.startswith("arn::") and ":::" in text:
        # arn:<partition>:<service>:<region>:<account>:<rest>, pseudo parameters left out
        service, rest = text.split(":")[2], text.split(":::", 1)[1]
        return rest if ":" in rest else f"{service}:{rest}"
    return text


def _role_statements(s: Synthesized, role_id: str) -> list[dict[str, Any]]:
    return [
        st
        for policy in s.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_each_function_has_exactly_the_actions_its_code_uses(synthesized: Synthesized) -> None:
    log_groups = set(synthesized.resources("AWS::Logs::LogGroup"))
    functions = synthesized.resources("AWS::Lambda::Function")
    assert {fn["Properties"]["Handler"] for fn in functions.values()} == set(EXPECTED_STATEMENTS)
    for fn in functions.values():
        granted: dict[tuple[str, str | None], set[str]] = {}
        for statement in _role_statements(synthesized, fn["Properties"]["Role"]["Fn::GetAtt"][0]):
            assert statement["Effect"] == "Allow"
            condition = statement.get("Condition")
            leading = None
            if condition is not None and "s3:prefix" in condition.get("StringLike", {}):
                assert set(condition) == {"StringLike"}, statement
                leading = "s3:prefix=" + ",".join(condition["StringLike"]["s3:prefix"])
            elif condition is not None:
                assert set(condition) == {"ForAllValues:StringLike"}, statement
                leading = ",".join(condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
            for resource in _as_list(statement["Resource"]):
                key = (_resource_name(synthesized, resource, log_groups), leading)
                granted.setdefault(key, set()).update(_as_list(statement["Action"]))
        assert granted == EXPECTED_STATEMENTS[fn["Properties"]["Handler"]]


def test_no_wildcard_outside_the_allow_list(synthesized: Synthesized) -> None:
    log_groups = set(synthesized.resources("AWS::Logs::LogGroup"))
    for statement in _statements(synthesized):
        for action in _as_list(statement["Action"]):
            assert "*" not in action or (action, "*") in WILDCARD_ALLOW_LIST, statement
            for resource in _as_list(statement["Resource"]):
                if "*" in json.dumps(resource):
                    name = _resource_name(synthesized, resource, log_groups)
                    assert (action, name) in WILDCARD_ALLOW_LIST, (action, name)
    for reason in WILDCARD_ALLOW_LIST.values():
        assert reason


def test_membership_rows_are_not_writable_by_the_api(synthesized: Synthesized) -> None:
    tenants = synthesized.json["Outputs"]["TenantsTableName"]["Value"]["Ref"]
    writes = {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"}
    for statement in _statements(synthesized):
        actions = set(_as_list(statement["Action"]))
        if tenants not in json.dumps(statement["Resource"]) or not writes & actions:
            continue
        keys = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
        assert not any(k.startswith(("PRINCIPAL", "*", "?")) for k in keys), keys


def test_reserved_concurrency_on_every_function(synthesized: Synthesized) -> None:
    for fn in synthesized.resources("AWS::Lambda::Function").values():
        assert fn["Properties"]["ReservedConcurrentExecutions"] >= 1


def test_tracer_never_captures_responses(synthesized: Synthesized) -> None:
    for fn in synthesized.resources("AWS::Lambda::Function").values():
        assert fn["Properties"]["Environment"]["Variables"]["POWERTOOLS_TRACER_CAPTURE_RESPONSE"] == "false"


def test_api_resource_policy_admits_only_tagged_principals_of_the_account(synthesized: Synthesized) -> None:
    (api,) = synthesized.resources("AWS::ApiGateway::RestApi").values()
    statements = {st["Sid"]: st for st in api["Properties"]["Policy"]["Statement"]}
    assert set(statements) == {
        "AccountMembersMayInvoke",
        "AccountHostsMayInvoke",
        "DenyOtherAccounts",
        "DenyPrincipalsWithoutMemberTag",
    }
    for st in statements.values():
        assert st["Action"] == "execute-api:Invoke" and st["Resource"] == "execute-api:/*"
    assert statements["DenyOtherAccounts"]["Effect"] == "Deny"
    assert statements["DenyOtherAccounts"]["Condition"] == {
        "StringNotEquals": {"aws:PrincipalAccount": {"Ref": "AWS::AccountId"}}
    }
    assert statements["DenyPrincipalsWithoutMemberTag"]["Effect"] == "Deny"
    # Conditions of one statement are ANDed: denied only when the principal carries neither tag.
    assert statements["DenyPrincipalsWithoutMemberTag"]["Condition"] == {
        "Null": {"aws:PrincipalTag/berth:tenant": "true", "aws:PrincipalTag/berth:host": "true"}
    }
    for sid, tag in (("AccountMembersMayInvoke", "berth:tenant"), ("AccountHostsMayInvoke", "berth:host")):
        assert statements[sid]["Effect"] == "Allow"
        assert "root" in json.dumps(statements[sid]["Principal"])
        assert statements[sid]["Condition"] == {"Null": {f"aws:PrincipalTag/{tag}": "false"}}


def test_api_has_an_enhanced_tls_policy(synthesized: Synthesized) -> None:
    (api,) = synthesized.resources("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["SecurityPolicy"].startswith("SecurityPolicy_TLS13_")
    assert api["Properties"]["EndpointAccessMode"] == "STRICT"


def test_access_log_names_caller_key_error_and_tls(synthesized: Synthesized) -> None:
    (stage,) = synthesized.resources("AWS::ApiGateway::Stage").values()
    fields = json.loads(stage["Properties"]["AccessLogSetting"]["Format"])
    for key, variable in {
        "userArn": "$context.identity.userArn",
        "accessKey": "$context.identity.accessKey",
        "errorType": "$context.error.responseType",
        "tlsVersion": "$context.tlsVersion",
        "requestId": "$context.requestId",
        "status": "$context.status",
    }.items():
        assert fields[key] == variable


def test_lambda_roles_have_no_managed_policies(synthesized: Synthesized) -> None:
    roles = set()
    for fn in synthesized.resources("AWS::Lambda::Function").values():
        role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
        roles.add(role_id)
        assert "ManagedPolicyArns" not in synthesized.json["Resources"][role_id]["Properties"]
    assert len(roles) == 7  # a role per function


def _method_paths(s: Synthesized) -> dict[tuple[str, str], dict[str, Any]]:
    """(path, verb) -> method properties, rebuilding each resource's path from its parents."""
    resources = s.resources("AWS::ApiGateway::Resource")

    def path_of(resource_id: str) -> str:
        props = resources[resource_id]["Properties"]
        parent = props["ParentId"]
        prefix = path_of(parent["Ref"]) if "Ref" in parent else ""
        return f"{prefix}/{props['PathPart']}"

    out = {}
    for method in s.resources("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        out[(path_of(props["ResourceId"]["Ref"]), props["HttpMethod"])] = props
    return out


def test_routes_match_the_http_contract(synthesized: Synthesized) -> None:
    public = {(path, verb) for path, verbs in ROUTES.items() for verb in verbs}
    agent = {(path, verb) for path, verbs in AGENT_ROUTES.items() for verb in verbs}
    assert set(_method_paths(synthesized)) == public | agent
    assert not public & agent
    assert ("/v1/jobs", "POST") in public and ("/v1/tenants/{tenant}/quota", "PUT") in public
    assert len(public) == 31
    assert ("/v1/policy", "PUT") in public and ("/v1/offers", "GET") in public
    assert agent == {
        ("/v1/agent/register", "POST"),
        ("/v1/agent/heartbeat", "POST"),
        ("/v1/agent/claim", "POST"),
        ("/v1/agent/report", "POST"),
        ("/v1/agent/credentials", "POST"),
        ("/v1/agent/metrics", "POST"),
    }
    assert not any(path.startswith("/v1/agent") for path, _ in public)


def _integration_function(integration: dict[str, Any]) -> str:
    """The logical id of the Lambda function a proxy integration's URI names."""
    (fn_id,) = [
        p["Fn::GetAtt"][0]
        for p in integration["Uri"]["Fn::Join"][1]
        if isinstance(p, dict) and "Fn::GetAtt" in p
    ]
    return str(fn_id)


def test_every_method_uses_aws_iam_and_lambda_proxy(synthesized: Synthesized) -> None:
    api_fn, _ = _function_by_handler(synthesized, API_HANDLER)
    agent_fn, _ = _function_by_handler(synthesized, AGENT_HANDLER)
    methods = _method_paths(synthesized)
    assert methods
    for (path, _verb), props in methods.items():
        assert props["AuthorizationType"] == "AWS_IAM"
        integration = props["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert integration["IntegrationHttpMethod"] == "POST"
        # The agent routes go to the agent API's own function, every other route to the API's.
        expected = agent_fn if path.startswith("/v1/agent/") else api_fn
        assert _integration_function(integration) == expected, path
        assert "RequestValidatorId" in props


def test_path_parameters_are_required(synthesized: Synthesized) -> None:
    for (path, _verb), props in _method_paths(synthesized).items():
        names = [p[1:-1] for p in path.split("/") if p.startswith("{")]
        expected = {f"method.request.path.{n}": True for n in names}
        assert props.get("RequestParameters", {}) == expected


def test_stage_logging_tracing_throttling(synthesized: Synthesized) -> None:
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {
            "StageName": API_STAGE_NAME,
            "TracingEnabled": True,
            "AccessLogSetting": {"DestinationArn": Match.any_value(), "Format": Match.any_value()},
            "MethodSettings": Match.array_with(
                [
                    Match.object_like(
                        {
                            "HttpMethod": "*",
                            "ResourcePath": "/*",
                            "LoggingLevel": "INFO",
                            "DataTraceEnabled": False,
                            "ThrottlingRateLimit": Match.any_value(),
                            "ThrottlingBurstLimit": Match.any_value(),
                        }
                    )
                ]
            ),
        },
    )
    synthesized.template.resource_count_is("AWS::ApiGateway::RestApi", 1)
    synthesized.template.has_resource_properties("AWS::ApiGateway::RestApi", {"Name": "BerthApi"})
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::RequestValidator", {"ValidateRequestBody": True, "ValidateRequestParameters": True}
    )


def test_invoke_permission_is_scoped_to_this_api_and_stage(synthesized: Synthesized) -> None:
    permissions = synthesized.resources("AWS::Lambda::Permission")
    api_id = synthesized.json["Outputs"]["ApiId"]["Value"]["Ref"]
    # One permission per function the API integrates with, none for any other function.
    integrated = {
        _integration_function(props["Integration"]) for props in _method_paths(synthesized).values()
    }
    assert integrated == {
        _function_by_handler(synthesized, API_HANDLER)[0],
        _function_by_handler(synthesized, AGENT_HANDLER)[0],
    }
    assert len(permissions) == len(integrated)
    assert {p["Properties"]["FunctionName"]["Fn::GetAtt"][0] for p in permissions.values()} == integrated
    for permission in permissions.values():
        props = permission["Properties"]
        assert props["Action"] == "lambda:InvokeFunction"
        assert props["Principal"] == "apigateway.amazonaws.com"
        parts = props["SourceArn"]["Fn::Join"][1]
        assert parts[-2:] == [{"Ref": api_id}, f"/{API_STAGE_NAME}/*/*"]


def test_no_custom_resources(synthesized: Synthesized) -> None:
    types = {r["Type"] for r in synthesized.json["Resources"].values()}
    assert not any(t.startswith("Custom::") or t == "AWS::CloudFormation::CustomResource" for t in types)


def test_gateway_errors_use_the_api_error_shape(synthesized: Synthesized) -> None:
    responses = synthesized.resources("AWS::ApiGateway::GatewayResponse")
    types = {r["Properties"]["ResponseType"]: r["Properties"] for r in responses.values()}
    assert set(types) == {"DEFAULT_4XX", "DEFAULT_5XX"}
    for props in types.values():
        template = props["ResponseTemplates"]["application/json"]
        assert '"error"' in template and '"code"' in template and '"message"' in template
