"""Every private surface of moto that the local cloud replaces, wraps or reads, in one place.

The local cloud needs more of moto than its public API: it runs Lambda handlers in-process by
replacing moto's invoke path, serialises and journals DynamoDB writes, reads IAM users and STS
sessions to verify SigV4, writes Lambda output through the Logs backend, asks CloudFormation which
resource types it models and stops moto's models from being remembered forever. None of that is a
stable interface, so this module

- pins the moto version those surfaces were read from (`MOTO_VERSION`, the same pin as pyproject);
- lists each surface (`SURFACES`): what it is, how the local cloud uses it, and the parameters or
  attributes it relies on;
- checks them all (`check()`, run once at start-up by `MotoServer.start()` and before any patch is
  installed) and fails with one message naming every surface that is missing or changed, instead of
  a patch that silently does nothing or an AttributeError deep inside a request;
- is the only place the other local-cloud modules get those moto objects from (`resolve()` and the
  small accessors below), so a moto upgrade means reviewing this file and the modules it names.

Paths are written `module:Qualified.name`; `module:Class#attr` is an instance attribute that the
class's `__init__` (or one of its bases') assigns, or a property.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: The moto release every surface below was read from (pyproject pins `moto[server,cloudformation]`).
MOTO_VERSION = "5.2.5"


class MotoCompatError(RuntimeError):
    """moto is not the version, or does not have the shape, the local cloud was written against."""


@dataclass(frozen=True)
class Surface:
    path: str
    use: str  # replaced | wrapped | called | read | written
    why: str
    params: tuple[str, ...] = ()  # for callables: parameter names relied on (in order, after self)


#: DynamoDB's request handlers that read or write single items, run whole under
#: ``dynamodb_isolation``'s lock (moto builds their answers from the live item).
DYNAMODB_ITEM_HANDLERS = (
    "put_item",
    "update_item",
    "delete_item",
    "transact_write_items",
    "batch_write_item",
    "get_item",
    "batch_get_item",
    "transact_get_items",
)
SURFACES: tuple[Surface, ...] = (
    # -- Lambda: run handlers in-process (lambda_runtime) -----------------------------------------------
    Surface(
        "moto.awslambda.models:LambdaFunction.invoke",
        "replaced",
        "every invocation path (Invoke API, event sources, SNS, Logs subscriptions) ends here",
        ("body", "request_headers", "response_headers"),
    ),
    Surface(
        "moto.awslambda.models:LambdaFunction._invoke_lambda",
        "replaced",
        "moto's docker helper; served in-process for any path that calls it directly",
        ("event",),
    ),
    Surface(
        "moto.awslambda_simple.models:LambdaSimpleBackend.invoke",
        "replaced",
        "the docker-less backend answers canned payloads; pointed back at the real backend's invoke",
        ("function_name", "qualifier", "body", "headers", "response_headers"),
    ),
    Surface(
        "moto.awslambda.models:LambdaBackend.invoke",
        "read",
        "what LambdaSimpleBackend.invoke is pointed at",
        ("function_name", "qualifier", "body", "headers", "response_headers"),
    ),
    Surface("moto.awslambda.utils:get_backend", "called", "the Lambda backend of an account and region"),
    Surface(
        "moto.awslambda.models:LambdaFunction#reserved_concurrency",
        "read",
        "a function's reserved concurrency bounds its in-process sandboxes",
    ),
    Surface("moto.awslambda.models:LambdaBackend.get_function", "called", "a function model by name"),
    *(
        Surface(f"moto.awslambda.models:LambdaFunction#{attr}", "read", "the function's configuration")
        for attr in (
            "function_name",
            "function_arn",
            "version",
            "handler",
            "run_time",
            "memory_size",
            "timeout",
            "region",
            "account_id",
            "role",
            "environment_vars",
        )
    ),
    Surface(
        "moto.awslambda.models:LambdaFunction#logs_group_name",
        "written",
        "set to the template's LoggingConfig.LogGroup (moto ignores it)",
    ),
    # -- EC2: instance types AWS sells that moto's table lacks (moto_faithful) ---------------------------
    Surface(
        "moto.ec2.models.instance_types:INSTANCE_TYPES",
        "written",
        "p3.2xlarge, p3.8xlarge and p3.16xlarge added (Batch validates compute environments against it)",
    ),
    # -- CloudWatch Logs: Lambda output (lambda_runtime) ------------------------------------------------
    Surface("moto.awslambda.models:LambdaFunction#logs_backend", "read", "the Logs backend of the function"),
    Surface(
        "moto.logs.models:LogsBackend.ensure_log_group",
        "called",
        "the function's log group",
        ("log_group_name",),
    ),
    Surface(
        "moto.logs.models:LogsBackend.create_log_stream",
        "called",
        "one stream per function",
        ("log_group_name", "log_stream_name"),
    ),
    Surface(
        "moto.logs.models:LogsBackend.put_log_events",
        "called",
        "START/END/REPORT and the handler's output",
        ("log_group_name", "log_stream_name", "log_events"),
    ),
    # -- STS and IAM: the Lambda role's credentials, SigV4 secrets (lambda_runtime, sigv4) --------------
    Surface("moto.sts.models:sts_backends", "read", "STS backends by account and partition"),
    Surface(
        "moto.sts.models:STSBackend.assume_role",
        "called",
        "temporary credentials of a function's execution role",
        ("region_name", "role_session_name", "role_arn", "policy", "duration", "external_id"),
    ),
    Surface("moto.sts.models:STSBackend#assumed_roles", "read", "sessions whose keys sign API calls"),
    *(
        Surface(f"moto.sts.models:AssumedRole#{attr}", "read", "an STS session's key, secret and identity")
        for attr in ("access_key_id", "secret_access_key", "session_token", "expiration", "account_id")
    ),
    Surface("moto.sts.models:AssumedRole.arn", "read", "the session's ARN (property)"),
    Surface("moto.sts.models:AssumedRole.user_id", "read", "the session's user id (property)"),
    Surface("moto.iam.models:iam_backends", "read", "IAM backends by account and partition"),
    Surface("moto.iam.models:IAMBackend#users", "read", "IAM users whose access keys sign API calls"),
    Surface("moto.iam.models:User#access_keys", "read", "a user's access keys"),
    Surface("moto.iam.models:User#id", "read", "a user's id (the caller in API Gateway's identity)"),
    Surface("moto.iam.models:User.arn", "read", "a user's ARN (property)"),
    *(
        Surface(f"moto.iam.models:AccessKey#{attr}", "read", "an access key's id, secret and status")
        for attr in ("access_key_id", "secret_access_key", "status")
    ),
    # -- CloudFormation (cloudformation_deploy) ---------------------------------------------------------
    Surface(
        "moto.cloudformation.parsing:get_model_map",
        "called",
        "which resource types moto's CloudFormation implements (the rest are listed as not emulated)",
    ),
    # -- DynamoDB: isolation and transactions (dynamodb_isolation) --------------------------------------
    *(
        Surface(f"moto.dynamodb.models:DynamoDBBackend.{name}", "wrapped", "writes serialised, as DynamoDB")
        for name in ("put_item", "update_item", "delete_item", "batch_write_item")
    ),
    *(
        Surface(f"moto.dynamodb.models:DynamoDBBackend.{name}", "wrapped", "iterating reads, under the lock")
        for name in ("query", "scan")
    ),
    *(
        Surface(
            f"moto.dynamodb.responses:DynamoHandler.{name}",
            "wrapped",
            "a single-item request under the lock: its answer is built from the live item",
        )
        for name in DYNAMODB_ITEM_HANDLERS
    ),
    # -- Batch: the jobs dict is iterated by DescribeJobs and ListJobs while SubmitJob adds to it -----
    *(
        Surface(f"moto.batch.models:BatchBackend.{name}", "wrapped", "serialised by local_batch (one lock)")
        for name in ("submit_job", "describe_jobs", "list_jobs")
    ),
    Surface(
        "moto.dynamodb.models:DynamoDBBackend.transact_write_items",
        "replaced",
        "moto deep-copies every table a transaction touches; replaced by an item-level undo journal",
        ("transact_items",),
    ),
    *(
        Surface(f"moto.dynamodb.models:DynamoDBBackend.{name}", "called", "used by the journaled transaction")
        for name in ("get_table", "get_item", "get_keys_value")
    ),
    Surface("moto.dynamodb.models:DynamoDBBackend#tables", "read", "the tables a transaction touches"),
    Surface("moto.dynamodb.models.table:Table.get_item", "called", "an item before a transaction writes it"),
    *(
        Surface(f"moto.dynamodb.models.table:Table#{attr}", "read", "where a transaction's undo writes back")
        for attr in ("items", "hash_key_attr", "range_key_attr", "stream_shard")
    ),
    Surface("moto.dynamodb.models.table:StreamShard#items", "written", "a rolled-back transaction's records"),
    Surface("moto.dynamodb.models:get_filter_expression", "called", "a transaction's condition expression"),
    *(
        Surface(f"moto.dynamodb.exceptions:{name}", "read", "raised by transactions as moto does")
        for name in (
            "ConditionalCheckFailed",
            "MockValidationException",
            "MultipleTransactionsException",
            "TooManyTransactionsException",
            "TransactionCanceledException",
            "TransactWriteSingleOpException",
        )
    ),
    # -- moto's model registry (untrack_instances) ------------------------------------------------------
    Surface(
        "moto.core.common_models:BaseModel.__new__",
        "replaced",
        "appends every model instance ever created to a class list for the dashboard; kept weakly instead",
    ),
    Surface("moto.core.model_instances:model_data", "read", "the classes whose instances are tracked"),
    # -- the server (moto_server) -----------------------------------------------------------------------
    Surface(
        "moto.moto_server.threaded_moto_server:ThreadedMotoServer",
        "called",
        "moto's server in a thread of this process",
        ("ip_address", "port", "verbose"),
    ),
    Surface("moto.moto_server.threaded_moto_server:ThreadedMotoServer.get_host_and_port", "called", "port"),
    Surface(
        "moto.moto_server.werkzeug_app:DomainDispatcherApplication",
        "called",
        "the server's WSGI app; Lambda sandboxes' SDK calls to moto are served by it in their own thread",
        ("create_app",),
    ),
    Surface("moto.moto_server.werkzeug_app:create_backend_app", "called", "what the WSGI app dispatches to"),
    Surface(
        "moto.logs.models:LogStream.put_log_events",
        "wrapped",
        "moto_logs: a function's log stream keeps its newest events only (moto never applies retention)",
        ("log_events",),
    ),
    Surface(
        "moto.logs.models:LogStream#events", "written", "moto_logs drops a function stream's oldest events"
    ),
    Surface("moto.logs.models:LogStream#log_group", "read", "moto_logs: which group a stream belongs to"),
    Surface(
        "moto.moto_server.werkzeug_app:DomainDispatcherApplication.__init__",
        "wrapped",
        "moto_flask: the apps its create_app makes run without Flask's debug mode (a cycle per request)",
        ("create_app",),
    ),
    Surface(
        "moto.core.request:normalize_request",
        "called",
        "the request type every moto mode hands its response classes (what the server's Flask view builds)",
    ),
    Surface(
        "moto.dynamodb.responses:DynamoHandler.dispatch",
        "called",
        "DynamoDB's API, called as the server's Flask view calls it (without Flask) for DynamoDB requests",
    ),
    Surface(
        "moto.core.responses:method_names_from_class",
        "replaced",
        "inspect.getmembers of the response class on every request; computed once per class instead",
    ),
    Surface(
        "moto.backends:list_of_moto_modules",
        "replaced",
        "lists moto's package directory (about 170 stat calls) on every request; computed once instead",
    ),
    # -- metering: what the control plane would be billed for (metering) ------------------------------------
    Surface(
        "moto.moto_server.threaded_moto_server:ThreadedMotoServer#_server",
        "read",
        "the werkzeug server whose WSGI app the meter's middleware wraps (`app` is werkzeug's, public)",
    ),
    Surface(
        "moto.stepfunctions.parser.asl.eval.event.event_manager:EventManager.add_event",
        "wrapped",
        "every history event of every execution: StateEntered events are the billed state transitions",
        ("context", "event_type"),
    ),
    *(
        Surface(f"moto.dynamodb.models.table:Table#{attr}", "read", "the indexes a metered write also writes")
        for attr in ("indexes", "global_indexes")
    ),
    *(
        Surface(f"moto.dynamodb.models.table:SecondaryIndex#{attr}", "read", "an index's key and projection")
        for attr in ("name", "schema", "projection")
    ),
    Surface(
        "moto.stepfunctions.parser.asl.component.state.exec.execute_state:ExecutionState._handle_retry",
        "wrapped",
        "a Retry that retries is a billed state transition too (RetryOutcome.CanRetry)",
        ("env", "failure_event"),
    ),
    Surface(
        "moto.iam.models:get_account_id_from", "called", "the account of a DynamoDB request's access key"
    ),
    Surface(
        "moto.dynamodb.models:dynamodb_backends",
        "read",
        "the tables whose items a write's units are sized by",
    ),
    Surface(
        "moto.dynamodb.models.dynamo_type:Item.to_json", "called", "a stored item in wire format, to size it"
    ),
    # -- STS GetSessionToken mints real temporary credentials (session_tokens) ----------------------------
    Surface(
        "moto.sts.responses:TokenResponse.get_session_token",
        "replaced",
        "moto hands every caller the same documentation keys; the front door must tell callers apart",
    ),
    Surface("moto.core.responses:ActionResult", "called", "the result type a replaced STS action returns"),
    Surface("moto.iam.models:User#name", "read", "a user's name (the session's user)"),
    Surface("moto.iam.models:User#tags", "read", "a user's tags (the resource policy's principal tag)"),
    Surface("moto.iam.models:IAMBackend.get_role_by_arn", "called", "an assumed role's tags", ("arn",)),
    # -- AWS guarantees moto skips, for per-job credentials and bundles (moto_faithful) -------------------
    Surface(
        "moto.iam.access_control:IAMRequestBase.check_action_permitted",
        "wrapped",
        "assumed-role credentials: intersect with the session policy and refuse them once expired",
        ("resource",),
    ),
    Surface("moto.iam.access_control:IAMRequestBase._raise_access_denied", "called", "refuse a request"),
    Surface(
        "moto.iam.access_control:IAMRequestBase._raise_invalid_access_key",
        "called",
        "refuse an expired key",
        ("reason",),
    ),
    Surface("moto.iam.access_control:AssumedRoleAccessKey", "read", "tells assumed-role credentials apart"),
    Surface("moto.iam.access_control:IAMPolicyStatement", "read", "owner of _match (a staticmethod)"),
    Surface("moto.iam.access_control:IAMPolicy", "called", "evaluates the session policy", ("policy",)),
    Surface("moto.iam.access_control:PermissionResult", "read", "the verdict of a policy"),
    Surface(
        "moto.iam.access_control:IAMPolicyStatement._match",
        "replaced",
        "IAM wildcards: '*' any run, '?' one character, everything else literal (moto uses raw regex)",
        ("pattern", "string"),
    ),
    Surface("moto.sts.models:STSBackend.get_assumed_role_from_access_key", "called", "a session's policy"),
    Surface("moto.sts.models:AssumedRole#policy", "read", "the session policy passed to AssumeRole"),
    Surface("moto.sts.models:AssumedRole#expiration", "read", "when the session's credentials expire"),
    Surface("moto.core.utils:utcnow", "called", "moto's clock for session expiry"),
    Surface(
        "moto.stepfunctions.responses:StepFunctionResponse.send_task_failure",
        "replaced",
        "SendTaskFailure keeps its cause (moto drops it; the Catch's Cause carries the failure detail)",
    ),
    Surface("moto.core.responses:EmptyResult", "called", "the empty answer of SendTaskFailure"),
    Surface(
        "moto.s3.responses:S3Response._get_checksum",
        "wrapped",
        "S3 refuses a PutObject whose content does not hash to its x-amz-checksum-sha256 (BadDigest)",
        ("response_headers",),
    ),
    Surface("moto.s3.exceptions:S3ClientError", "read", "the S3 error type moto serialises (BadDigest)"),
    Surface(
        "moto.secretsmanager.responses:SecretsManagerResponse",
        "read",
        "gets a _determine_resource: the secret's ARN, so resource-scoped policies can match",
    ),
    # -- Batch: jobs of berth-* queues run as host processes (local_batch) -------------------------------
    Surface(
        "moto.batch_simple.models:BatchSimpleBackend.submit_job",
        "replaced",
        "a berth-* queue's job goes to the real backend's submit_job (stored, its thread started)",
        ("job_name", "job_def_id", "job_queue"),
    ),
    Surface(
        "moto.batch.models:BatchBackend.submit_job",
        "called",
        "stores the job and starts its thread (Job.run)",
        ("job_name", "job_def_id", "job_queue"),
    ),
    Surface(
        "moto.batch.models:BatchBackend.get_job_queue", "called", "the queue a submit names", ("identifier",)
    ),
    Surface("moto.batch_simple.models:BatchSimpleBackend.backend", "read", "the real backend it wraps"),
    Surface(
        "moto.batch.models:Job.run",
        "replaced",
        "the job's thread: a berth-* queue's job is run by LocalBatch.execute (else moto's docker run)",
    ),
    Surface(
        "moto.batch.models:Job._container_details",
        "wrapped",
        "DescribeJobs' container: exitCode and reason added, the submit's env no longer grows per call",
    ),
    Surface("moto.batch.models:Job.status", "written", "the job's status (ManagedState's setter), driven"),
    # -- Batch multi-node parallel jobs (local_batch_gang) ----------------------------------------------
    Surface(
        "moto.batch.responses:BatchResponse.submitjob",
        "wrapped",
        "SubmitJob's nodeOverrides (moto drops them) kept on the job for the local gang run",
    ),
    Surface(
        "moto.batch.responses:BatchResponse._get_param",
        "called",
        "the request's nodeOverrides",
        ("param_name",),
    ),
    Surface(
        "moto.batch.models:Job",
        "called",
        "a gang's node: a job of its own (<job id>#<index>) driven like any other, never stored by moto",
        ("name", "job_def", "job_queue", "backend", "log_backend", "container_overrides"),
    ),
    Surface(
        "moto.batch.models:JobDefinition",
        "called",
        "a node's container definition: the multi-node definition's node range for it",
        ("name", "parameters", "_type", "container_properties", "node_properties"),
    ),
    Surface(
        "moto.batch.models:JobDefinition#node_properties", "read", "a multi-node definition's node ranges"
    ),
    Surface("moto.batch.models:JobDefinition#type", "read", "container or multinode"),
    Surface("moto.batch.models:JobQueue#jobs", "written", "a gang's node, listed by moto's Job, taken out"),
    Surface("moto.batch.models:Job._start_attempt", "called", "appends attempts[] at STARTING"),
    Surface("moto.batch.models:Job._mark_stopped", "called", "SUCCEEDED/FAILED with stoppedAt", ("success",)),
    Surface("moto.batch.models:Job._get_attempt_duration", "called", "attemptDurationSeconds"),
    Surface("moto.batch.models:Job._add_parameters_to_command", "called", "Ref:: parameters", ("command",)),
    Surface("moto.batch.models:Job.describe_short", "called", "the event detail's common fields"),
    Surface(
        "moto.batch.models:JobDefinition._get_resource_requirement",
        "called",
        "the job's vCPUs",
        ("req_type", "default"),
    ),
    *(
        Surface(f"moto.batch.models:Job#{attr}", "read", "the job being run")
        for attr in (
            "job_queue",
            "job_definition",
            "container_overrides",
            "job_id",
            "job_name",
            "arn",
            "stop",
            "job_stopped",
            "attempts",
            "backend",
            "parameters",
            "depends_on",
        )
    ),
    *(
        Surface(f"moto.batch.models:Job#{attr}", "written", "set as AWS Batch would")
        for attr in ("exit_code", "job_stopped_reason", "job_started_at", "latest_attempt", "log_stream_name")
    ),
    *(
        Surface(f"moto.batch.models:JobQueue#{attr}", "read", "the queue's name, ARN, compute environments")
        for attr in ("name", "arn", "environments")
    ),
    *(
        Surface(
            f"moto.batch.models:ComputeEnvironment#{attr}",
            "read",
            "maxvCpus and instance types; its ECS cluster (the attempt's taskArn)",
        )
        for attr in ("name", "arn", "compute_resources", "ecs_name")
    ),
    *(
        Surface(f"moto.batch.models:JobDefinition#{attr}", "read", "the job's container")
        for attr in ("name", "container_properties")
    ),
    # -- Local AWS Batch: a definition's `secrets`, read as its execution role (local_batch) -------------
    Surface(
        "moto.iam.access_control:AssumedRoleAccessKey",
        "called",
        "the IAM view of an execution role's STS session",
        ("account_id", "partition", "access_key_id", "headers"),
    ),
    Surface(
        "moto.iam.access_control:AssumedRoleAccessKey.collect_policies",
        "called",
        "the inline and attached policies of the session's role",
    ),
    Surface(
        "moto.iam.access_control:IAMPolicy.is_action_permitted",
        "called",
        "may the execution role GetSecretValue on the secret's ARN",
        ("action", "resource"),
    ),
    Surface("moto.sts.models:AssumedRole#partition", "read", "an STS session's partition"),
    # -- emulator hot paths: SQS without walks of the whole queue per message (moto_sqs) ------------------
    Surface("moto.sqs.models:Queue.attributes", "replaced", "the counts in one pass; none on send/receive"),
    Surface("moto.sqs.models:Queue.messages", "replaced", "visible messages, one clock reading per call"),
    Surface(
        "moto.sqs.models:Queue.add_message", "wrapped", "drops expired messages at the head", ("message",)
    ),
    Surface(
        "moto.sqs.models:Queue.delete_message", "replaced", "by the receipt-handle index", ("receipt_handle",)
    ),
    Surface(
        "moto.sqs.models:SQSBackend.receive_message",
        "replaced",
        "moto's algorithm, walking lazily, retention read from the queue, handles indexed",
        ("queue_name", "count", "wait_seconds_timeout", "visibility_timeout", "message_attribute_names"),
    ),
    Surface(
        "moto.sqs.models:Message.change_visibility",
        "called",
        "sqs-duplicate: a received message visible again at once",
        ("visibility_timeout",),
    ),
    Surface(
        "moto.sqs.models:SQSBackend.change_message_visibility",
        "replaced",
        "finds the message by the receipt-handle index",
        ("queue_name", "receipt_handle", "visibility_timeout"),
    ),
    Surface(
        "moto.sqs.models:SQSBackend.is_message_valid_based_on_retention_period",
        "replaced",
        "reads the queue's retention instead of computing every attribute",
        ("queue_name", "message"),
    ),
    *(
        Surface(f"moto.sqs.models:SQSBackend.{name}", "wrapped", "on the hot path: attributes without counts")
        for name in ("send_message", "_validate_message")
    ),
    Surface(
        "moto.sqs.models:SQSBackend.purge_queue",
        "wrapped",
        "clears the receipt-handle index",
        ("queue_name",),
    ),
    Surface("moto.sqs.models:_filter_message_attributes", "called", "a received copy's message attributes"),
    *(
        Surface(f"moto.sqs.exceptions:{name}", "read", "raised as moto raises them")
        for name in ("ReceiptHandleIsInvalid", "InvalidParameterValue")
    ),
    *(
        Surface(f"moto.core.utils:{name}", "called", "moto's clock and names")
        for name in ("unix_time", "unix_time_millis", "camelcase_to_underscores")
    ),
    *(
        Surface(f"moto.sqs.models:Queue#{attr}", "read", "the queue's messages and settings")
        for attr in (
            "_messages",
            "_pending_messages",
            "_messages_lock",
            "deleted_messages",
            "dead_letter_queue",
            "fifo_queue",
        )
    ),
    # -- emulator hot paths: is any job in flight, read in-process for the idle timer (local_activity) -------
    Surface("moto.dynamodb.models.dynamo_type:Item#attrs", "read", "a job item's status attribute"),
    Surface("moto.dynamodb.models.dynamo_type:DynamoType#value", "read", "the status attribute's value"),
    Surface("moto.dynamodb.models.dynamo_type:DynamoType#type", "read", "a key attribute's type (S, N, B)"),
    # -- emulator hot paths: a DynamoDB Query reads its partition (moto_dynamodb_query) --------------------
    Surface(
        "moto.dynamodb.models.table:Table.query",
        "wrapped",
        "narrows all_items() to the queried partition while moto's query runs",
        (
            "hash_key",
            "range_comparison",
            "range_objs",
            "limit",
            "exclusive_start_key",
            "scan_index_forward",
            "projection_expressions",
            "index_name",
            "consistent_read",
            "filter_expression",
            "hash_key_conditions",
        ),
    ),
    Surface("moto.dynamodb.models.table:Table.all_items", "wrapped", "answers the narrowed candidates"),
    Surface(
        "moto.dynamodb.models.table:SecondaryIndex.project",
        "replaced",
        "an index entry keeps the projected attributes of the (deep-copied) item as they are",
        ("item",),
    ),
    Surface(
        "moto.dynamodb.models.table:Table.all_indexes", "called", "the queried index, for its projection"
    ),
    Surface(
        "moto.dynamodb.models.dynamo_type:Item.project",
        "replaced",
        "a projection of top-level names copies those attributes as they are",
        ("projection_expressions",),
    ),
    Surface(
        "moto.dynamodb.models.table:Table.sorted_items",
        "called",
        "an index's kept candidates sorted as moto's query sorts them",
        ("hash_key_attrs", "range_key_attrs", "items"),
    ),
    Surface(
        "moto.dynamodb.models.table:Table._item_comes_before_dct",
        "called",
        "where a page's start key falls among the kept candidates (moto's own comparison, by bisection)",
        ("item", "dct", "hash_key_attrs", "range_key_attrs", "scan_index_forward"),
    ),
    Surface(
        "moto.dynamodb.models.table:SecondaryIndex#projection", "read", "ProjectionType, NonKeyAttributes"
    ),
    Surface("moto.dynamodb.models.table:SecondaryIndex#table_key_attrs", "read", "an entry's table keys"),
    Surface("moto.dynamodb.models.table:SecondaryIndex#schema", "read", "an entry's index keys"),
    Surface("moto.dynamodb.models.table:SecondaryIndex#name", "read", "the queried index"),
    # -- emulator hot paths: DynamoDB attribute values written directly (moto_dynamodb_json) ----------------
    Surface(
        "moto.dynamodb.responses:DynamoResult.execute_result",
        "wrapped",
        "serialises with a subclass of moto's serializer that writes each AttributeValue directly",
        ("context",),
    ),
    Surface("moto.core.responses:ActionContext#serializer_class", "read", "the serializer moto picked"),
    Surface(
        "moto.core.serialize:ResponseSerializer._serialize",
        "wrapped",
        "overridden in the subclass for the AttributeValue shape",
        ("serialized", "value", "shape", "key"),
    ),
    Surface(
        "moto.core.serialize:ResponseSerializer._default_serialize",
        "called",
        "writes the directly serialised attribute value under its name",
        ("serialized", "value", "shape", "key"),
    ),
    # -- emulator hot paths: parsers built once (moto_events, moto_asl) -------------------------------------
    Surface(
        "moto.events.utils:EventTemplateParser.parse",
        "replaced",
        "moto's input transformation, each JSONPath compiled once per process instead of per event",
        ("input_template", "input_paths_map", "event"),
    ),
    Surface("moto.events.utils:EventTemplateParser", "read", "its default template, paths and _stringify"),
    Surface(
        "moto.stepfunctions.parser.asl.parse.asl_parser:AmazonStateLanguageParser.parse",
        "wrapped",
        "a definition's ANTLR parse and program, cached by its text (once per state machine)",
        ("definition",),
    ),
    Surface(
        "moto.stepfunctions.parser.asl.component.eval_component:EvalComponent.heap_key",
        "read",
        "assigned on every component before a cached program is shared by executions",
    ),
    Surface(
        "moto.stepfunctions.parser.asl.component.eval_component:EvalComponent",
        "read",
        "the components of a program",
    ),
    # -- emulator hot paths: DynamoDB condition expressions parsed once (moto_dynamodb_conditions) ----------
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser.parse",
        "wrapped",
        "a condition's syntax tree, kept by its text, names and value names; values bound per request",
    ),
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser",
        "read",
        "subclassed to parse to the tree (its Kind names the value nodes)",
    ),
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser.Kind",
        "read",
        "EXPRESSION_ATTRIBUTE_VALUE: the kind of the nodes a request's values are bound into",
    ),
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser.Node",
        "read",
        "the tree's nodes: a namedtuple of nonterminal, kind, text, value, children (copied with _replace)",
    ),
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser._lookup_expression_attribute_value",
        "wrapped",
        "checks the value is given (raising as moto does), then leaves a reference to it in the tree",
        ("name",),
    ),
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser._make_op_condition",
        "called",
        "overridden to stop the template's parse at the tree; called to build each request's operation",
        ("node",),
    ),
    *(
        Surface(f"moto.dynamodb.comparisons:ConditionExpressionParser#{attr}", "read", "the parse's inputs")
        for attr in ("condition_expression", "expression_attribute_names", "expression_attribute_values")
    ),
    *(
        Surface(
            f"moto.dynamodb.comparisons:ConditionExpressionParser#{attr}",
            "written",
            "what the expression uses, filled as moto's parse fills it (the response layer checks it)",
        )
        for attr in ("expr_attr_names_found", "expr_attr_values_found")
    ),
    Surface(
        "moto.dynamodb.comparisons:ConditionExpressionParser._lookup_expression_attribute_name",
        "wrapped",
        "checks the name is given (raising as moto does), then leaves a reference to it in the tree",
        ("name",),
    ),
    Surface(
        "moto.dynamodb.parsing.expressions:UpdateExpressionParser.make",
        "wrapped",
        "an update expression's tree (placeholders only) kept by its text; users read or deep-copy it",
        ("expression_str",),
    ),
    Surface(
        "moto.dynamodb.parsing.expressions:UpdateExpressionParser",
        "read",
        "the class whose classmethod make is replaced, and put back by the undo",
    ),
    # -- emulator hot paths: Step Functions' Lambda client built once (moto_sfn_clients) --------------------
    Surface(
        "moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils:boto_client_for",
        "wrapped",
        "a lambda:invoke task's SDK client, built once per region, service and endpoint, not per task run",
        ("region", "service", "state_credentials"),
    ),
    Surface("moto.core.models:botocore_stubber", "read", "whether moto intercepts botocore (a key part)"),
    Surface("moto.settings:moto_server_port", "called", "the server's port (part of the client cache key)"),
    # -- emulator hot paths: stream pollers woken by stream writes (moto_streams) ---------------------------
    Surface(
        "moto.dynamodb.models.table:StreamShard.add",
        "wrapped",
        "a stream record wakes the local cloud's stream pollers",
        ("old", "new"),
    ),
    *(
        Surface(f"moto.sqs.models:Message#{attr}", "read", "a message's visibility, delay, age and handles")
        for attr in (
            "visible_at",
            "delayed_until",
            "sent_timestamp",
            "receipt_handle",
            "_old_receipt_handles",
            "group_id",
            "approximate_receive_count",
        )
    ),
)


# -- resolving and checking ------------------------------------------------------------------------------
def resolve(path: str) -> Any:
    """The object at `module:Qualified.name` (raises MotoCompatError naming the path if it is missing)."""
    module_name, _, qualname = path.partition(":")
    qualname = qualname.split("#", 1)[0]
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise MotoCompatError(f"{path}: module {module_name} cannot be imported ({exc})") from exc
    for part in qualname.split("."):
        if part == "__new__":  # inherited from object unless the class defines it: look in its own dict
            found = vars(obj).get("__new__") if isinstance(obj, type) else None
            if found is None:
                raise MotoCompatError(f"{path}: {qualname} is not defined by moto")
            obj = found
            continue
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise MotoCompatError(f"{path}: {part} is missing") from None
    return obj


def _assigned_attributes(cls: type) -> set[str]:
    """Attribute names the `__init__`s of `cls` and its bases store on `self` (from their bytecode)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None:
            names.update(code.co_names)
    return names


def _problem(surface: Surface) -> str | None:
    try:
        obj = resolve(surface.path)
    except MotoCompatError as exc:
        return str(exc)
    _, _, qualname = surface.path.partition(":")
    if "#" in qualname:
        attr = qualname.split("#", 1)[1]
        if not isinstance(obj, type):
            return f"{surface.path}: {qualname.split('#')[0]} is not a class"
        if attr not in _assigned_attributes(obj) and not hasattr(obj, attr):
            return f"{surface.path}: instances no longer have {attr!r}"
        return None
    if surface.params:
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            return f"{surface.path}: not a callable with a signature"
        names = [n for n in signature.parameters if n not in ("self", "cls")]
        if names[: len(surface.params)] != list(surface.params):
            return (
                f"{surface.path}: parameters are ({', '.join(names)}), "
                f"the local cloud calls it with ({', '.join(surface.params)})"
            )
    return None


def installed_version() -> str:
    import moto

    return str(moto.__version__)


def problems() -> list[str]:
    """Everything about the installed moto that the local cloud cannot work with (empty: all good)."""
    found: list[str] = []
    version = installed_version()
    if version != MOTO_VERSION:
        found.append(
            f"moto {version} is installed; the local cloud was written against moto {MOTO_VERSION} "
            "(install the version pyproject.toml pins, or review every surface in "
            "berth_tools/localcloud/moto_compat.py before changing the pin)"
        )
    found.extend(p for p in map(_problem, SURFACES) if p is not None)
    return found


_checked = False
_check_lock = threading.Lock()


def check(force: bool = False) -> None:
    """Fail loudly, once per process, if moto is not what the local cloud's patches expect."""
    global _checked
    with _check_lock:
        if _checked and not force:
            return
        found = problems()
        if found:
            raise MotoCompatError("the local cloud cannot run on this moto:\n  - " + "\n  - ".join(found))
        _checked = True


def surface(path: str) -> Any:
    """`resolve(path)` for a path declared in SURFACES (so every use is listed and checked)."""
    if path not in _DECLARED:
        raise MotoCompatError(f"{path} is not declared in moto_compat.SURFACES")
    return resolve(path)


_DECLARED = frozenset(s.path for s in SURFACES)


# -- replacing attributes ---------------------------------------------------------------------------------
@dataclass
class Patch:
    """One replaced attribute of a moto class or module; `undo()` puts the original back."""

    owner: Any
    name: str
    original: Any
    replacement: Any

    def undo(self) -> None:
        if vars(self.owner).get(self.name) is self.replacement:
            setattr(self.owner, self.name, self.original)


def replace(path: str, replacement: Any) -> Patch:
    """Replace the declared surface at `path` with `replacement` (after `check()`)."""
    check()
    original = surface(path)
    module_name, _, qualname = path.partition(":")
    owner_path, _, name = qualname.rpartition(".")
    owner = resolve(f"{module_name}:{owner_path}") if owner_path else importlib.import_module(module_name)
    setattr(owner, name, replacement)
    return Patch(owner, name, original, replacement)


# -- accessors used by the other local-cloud modules ---------------------------------------------------
def lambda_function(account_id: str, region: str, name: str) -> Any:
    """moto's model of a Lambda function."""
    return surface("moto.awslambda.utils:get_backend")(account_id, region).get_function(name)


def assume_role(account_id: str, region: str, session_name: str, role_arn: str, duration: int) -> Any:
    """An STS session for `role_arn` (moto's AssumedRole: access_key_id, secret_access_key, session_token)."""
    sts_backends = surface("moto.sts.models:sts_backends")
    return sts_backends[account_id]["aws"].assume_role(
        region_name=region,
        role_session_name=session_name,
        role_arn=role_arn,
        policy="",
        duration=duration,
        external_id="",
    )


def session_permits(session: Any, action: str, resource: str) -> bool:
    """Whether the STS `session` (moto's AssumedRole) may do `action` on `resource` as IAM decides: some
    policy of its role allows it, none denies it, and its session policy (if any) allows it too. moto
    evaluates policies only for requests once `INITIAL_NO_AUTH_ACTION_COUNT` is reached (never in the
    local cloud); this asks its evaluator directly. A role that is gone permits nothing."""
    ac = "moto.iam.access_control"
    key = surface(f"{ac}:AssumedRoleAccessKey")(
        session.account_id,
        session.partition,
        session.access_key_id,
        {"X-Amz-Security-Token": session.session_token},
    )
    policy_type = surface(f"{ac}:IAMPolicy")
    result = surface(f"{ac}:PermissionResult")
    try:
        policies = key.collect_policies()
    except Exception:  # the role does not exist (NoSuchEntity)
        return False
    verdicts = [policy_type(p).is_action_permitted(action, resource) for p in policies]
    if result.DENIED in verdicts or result.PERMITTED not in verdicts:
        return False
    if session.policy:
        return bool(policy_type(session.policy).is_action_permitted(action, resource) == result.PERMITTED)
    return True


def iam_users() -> Iterator[tuple[str, Any]]:
    """(account id, moto IAM User) for every user of every account."""
    iam_backends = surface("moto.iam.models:iam_backends")
    for account_id in list(iam_backends.keys()):
        backend = iam_backends[account_id].get("aws")
        if backend is not None:
            for user in list(backend.users.values()):
                yield account_id, user


def sts_sessions() -> Iterator[Any]:
    """moto's AssumedRole for every STS session of every account."""
    sts_backends = surface("moto.sts.models:sts_backends")
    for account_id in list(sts_backends.keys()):
        backend = sts_backends[account_id].get("aws")
        if backend is not None:
            yield from list(backend.assumed_roles)


def session_role(session: Any) -> Any | None:
    """moto's IAM Role of an STS session (None when the role is gone)."""
    iam = surface("moto.iam.models:iam_backends")[session.account_id].get("aws")
    if iam is None:
        return None
    try:
        return iam.get_role_by_arn(session.role_arn)
    except Exception:  # the role was deleted: no tags (and no id: see AssumedRole.user_id)
        return None


def cloudformation_model_map() -> dict[str, Any]:
    """Resource type → moto model class, for the types moto's CloudFormation implements."""
    model_map: dict[str, Any] = surface("moto.cloudformation.parsing:get_model_map")()
    return model_map


def threaded_moto_server() -> Any:
    return surface("moto.moto_server.threaded_moto_server:ThreadedMotoServer")


def moto_wsgi_app() -> Any:
    """A WSGI app serving moto's API, as the server's (backends are process-global: same state)."""
    app_class = surface("moto.moto_server.werkzeug_app:DomainDispatcherApplication")
    return app_class(surface("moto.moto_server.werkzeug_app:create_backend_app"))


def cache_method_names() -> Patch:
    """moto looks up a response class's methods with inspect.getmembers on every request; once per class."""
    path = "moto.core.responses:method_names_from_class"
    current = surface(path)
    owner = importlib.import_module("moto.core.responses")
    if getattr(current, "_berth_cached", False):
        return Patch(owner, "method_names_from_class", current, current)
    cache: dict[type, frozenset[str]] = {}

    def method_names_from_class(clazz: Any) -> frozenset[str]:
        names = cache.get(clazz)
        if names is None:
            names = cache[clazz] = frozenset(current(clazz))
        return names

    method_names_from_class._berth_cached = True  # type: ignore[attr-defined]
    return replace(path, method_names_from_class)


def cache_module_list() -> Patch:
    """moto's request dispatcher lists its own package directory on every request; list it once."""
    path = "moto.backends:list_of_moto_modules"
    current = surface(path)
    owner = importlib.import_module("moto.backends")
    if getattr(current, "_berth_cached", False):
        return Patch(owner, "list_of_moto_modules", current, current)
    modules = tuple(current())

    def list_of_moto_modules() -> Iterator[str]:
        return iter(modules)

    list_of_moto_modules._berth_cached = True  # type: ignore[attr-defined]
    return replace(path, list_of_moto_modules)


# -- a moto fix: models are tracked weakly ------------------------------------------------------------
class WeakInstances:
    """A stand-in for moto's `instances_tracked` list that does not keep instances alive.

    moto appends every model instance it ever creates (every DynamoDB item, each deep copy of one, each
    deep-copied table, each log event) to a list on its class, for the dashboard (`/moto-api/data.json`),
    and never removes it: under load the process grows without bound although the instances are garbage.
    """

    def __init__(self, existing: list[Any] | None = None) -> None:
        # by identity: moto's models define __hash__/__eq__ on attributes not set yet in __new__
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._strong: list[Any] = []  # instances that cannot be weakly referenced
        for item in existing or []:
            self.append(item)

    def append(self, instance: Any) -> None:
        key = id(instance)
        refs = self._refs

        def forget(ref: weakref.ref[Any]) -> None:
            if refs.get(key) is ref:
                refs.pop(key, None)

        try:
            refs[key] = weakref.ref(instance, forget)
        except TypeError:
            self._strong.append(instance)

    def __iter__(self) -> Iterator[Any]:
        for ref in list(self._refs.values()):
            instance = ref()
            if instance is not None:
                yield instance
        yield from list(self._strong)

    def __len__(self) -> int:
        return len(self._refs) + len(self._strong)


#: Classes whose instances moto itself walks on reset (S3 closes their temporary files): kept strongly.
STRONGLY_TRACKED = frozenset({"FakeKey", "FakeMultipart"})


def untrack_instances() -> Patch:
    """Make moto track model instances weakly (S3's FakeKey/FakeMultipart stay strong); idempotent."""
    path = "moto.core.common_models:BaseModel.__new__"
    current = surface(path)
    if getattr(getattr(current, "__func__", None), "_berth_weak", False):
        return Patch(resolve("moto.core.common_models:BaseModel"), "__new__", current, current)
    base_model = resolve("moto.core.common_models:BaseModel")

    def tracked_new(cls: type, *args: Any, **kwargs: Any) -> Any:
        instance = super(base_model, cls).__new__(cls)
        tracked = cls.__dict__.get("instances_tracked")
        if tracked is None:  # the metaclass gives every model class its own list; be safe anyway
            tracked = []
            type.__setattr__(cls, "instances_tracked", tracked)
        if isinstance(tracked, list) and cls.__name__ not in STRONGLY_TRACKED:
            # moto's reset puts a fresh list back: switch it to a weak one on first use
            tracked = WeakInstances(tracked)
            type.__setattr__(cls, "instances_tracked", tracked)
        tracked.append(instance)
        return instance

    tracked_new._berth_weak = True  # type: ignore[attr-defined]
    return replace(path, staticmethod(tracked_new))
