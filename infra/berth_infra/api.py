"""The public HTTP API: API Gateway REST API (SigV4/AWS_IAM on every method) proxying to one Lambda."""

from __future__ import annotations

import json
from dataclasses import dataclass

from aws_cdk import Aws, Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from berth_infra.bundling import LAMBDA_ARCHITECTURE, LAMBDA_RUNTIME, function_code
from berth_infra.data import DataTables
from berth_infra.storage import Storage

API_STAGE_NAME = "api"
#: Agents ship job output to ``<prefix>/<tenant>``, stream ``<job_id>/<attempt>``
#: (berth.domain.observability).
JOB_LOG_GROUP_PREFIX = "/berth/jobs"
LOG_RETENTION = logs.RetentionDays.ONE_MONTH

#: Every route of the HTTP API contract (docs/BRIEF): path -> methods. Paths start with /v1.
ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/jobs": ("GET", "POST"),
    "/v1/jobs/{id}": ("GET",),
    "/v1/jobs/{id}/cancel": ("POST",),
    "/v1/jobs/{id}/events": ("GET",),
    "/v1/jobs/{id}/logs": ("GET",),
    "/v1/jobs/{id}/metrics": ("GET",),
    "/v1/jobs/{id}/explain": ("GET",),
    "/v1/jobs/{id}/outputs": ("GET",),
    "/v1/jobs/plan": ("POST",),
    "/v1/capacity": ("GET",),
    "/v1/policy": ("GET", "PUT"),
    "/v1/offers": ("GET", "PUT"),
    "/v1/tenants/{tenant}/quota": ("GET", "PUT"),
    "/v1/tenants/{tenant}/queue": ("GET",),
    "/v1/tenants/{tenant}/grants": ("GET", "PUT"),
    "/v1/bundles": ("POST",),
    "/v1/datasets/{name}": ("GET", "PUT"),
    "/v1/tenants/{tenant}/usage": ("GET",),
    "/v1/usage": ("GET",),
    "/v1/queue": ("GET",),
    "/v1/hosts/{host}/drain": ("PUT",),
    "/v1/hosts/{host}/admission": ("PUT",),
    "/v1/hosts/{host}/gpus/{gpu}/clear": ("POST",),
    "/v1/circuits": ("GET",),
    "/v1/circuits/{region}": ("DELETE",),
}

#: The agent API (docs/agent-protocol.md), served by its own function; hosts only.
AGENT_ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/agent/register": ("POST",),
    "/v1/agent/heartbeat": ("POST",),
    "/v1/agent/claim": ("POST",),
    "/v1/agent/report": ("POST",),
    "/v1/agent/credentials": ("POST",),
    "/v1/agent/metrics": ("POST",),
}


#: The principal tag that marks an IAM principal of the account as allowed to reach the API at all
#: (the API's resource policy denies every other caller). Which tenant and role a caller has is still
#: decided by the Tenants table, never by the tag's value.
DEFAULT_MEMBER_TAG = "berth:tenant"
#: The principal tag of an on-prem host's identity (its value: the host id); admitted like members.
HOST_TAG = "berth:host"
#: Enhanced TLS policy: TLS 1.3, or TLS 1.2 with forward-secret (and post-quantum hybrid) key exchange.
TLS_SECURITY_POLICY = "SecurityPolicy_TLS13_1_2_PFS_PQ_2025_09"
#: Each function's reserved concurrency: bounds what one caller can make Berth spend, and keeps other
#: functions of the account from starving it. ``-c berth:apiReservedConcurrency=N`` overrides it.
DEFAULT_API_RESERVED_CONCURRENCY = 50
#: Requests per second each tenant may make (all its principals together); ``-c
#: berth:tenantRequestsPerSecond=N`` overrides it. Over it the API answers 429 with Retry-After.
DEFAULT_TENANT_REQUESTS_PER_SECOND = 50


@dataclass(frozen=True)
class TableAccess:
    """What one function does with one table: the actions it calls, and for writes restricted to some
    partition keys, the ``dynamodb:LeadingKeys`` patterns it may write."""

    actions: tuple[str, ...]
    write_leading_keys: tuple[str, ...] = ()


#: The API function's DynamoDB use, table by table (``tests/infra`` holds its own copy to compare).
#: Transactions (TransactWriteItems) are authorised per item by PutItem/UpdateItem.
API_TABLE_ACCESS: dict[str, TableAccess] = {
    # create/save jobs (transactions), read one job (and GET /v1/jobs reads a page's items with
    # BatchGetItem: its indexes hold keys only); arrays: the parent's cancel flag and its tasks'
    # counter shards (UpdateItem), its tasks and counters (BatchGetItem)
    "jobs": TableAccess(
        ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem")
    ),
    # GET /v1/jobs: the by_tenant and by_tenant_status GSIs; explain: the queue (by_queue) and the
    # placed jobs (by_placed)
    "jobs_indexes": TableAccess(("dynamodb:Query",)),
    # explain: the tenants with jobs (by_directory)
    "tenants_indexes": TableAccess(("dynamodb:Query",)),
    # append events (in the job's transaction), read a job's history
    "job_events": TableAccess(("dynamodb:PutItem", "dynamodb:Query")),
    # read membership, tenants, quotas, the pagination-token key
    "tenants_read": TableAccess(("dynamodb:GetItem", "dynamodb:BatchGetItem")),
    # quotas, data grants and active-job counters (TENANT#), registered datasets (DATASET#),
    # rate-limit windows (RATE#), the token key (KEY#), the policy and offers versions (DOC#), the
    # arrays with work for the expander (ARRAYS#PENDING), the circuits an admin resets (CIRCUITS);
    # never membership rows (PRINCIPAL#): no route writes them, so no logic bug can mint an admin.
    "tenants_write": TableAccess(
        ("dynamodb:PutItem", "dynamodb:UpdateItem"),
        write_leading_keys=("TENANT#*", "DATASET#*", "RATE#*", "KEY#*", "DOC#*", "ARRAYS#*", "CIRCUITS"),
    ),
    # feasibility at submit, explain and capacity read the fleet; an admin's drain sets a host's
    # drain request (HostRepository.request_drain, a conditional UpdateItem of that flag), an admin's
    # admission its admitted inventory (HostRepository.admit), an admin's GPU clear a fault
    # (HostRepository.clear_gpu_fault); holds and
    # leases are written by the scheduler and the agent API only
    "hosts": TableAccess(("dynamodb:Scan", "dynamodb:UpdateItem")),
    # Powertools idempotency records (it deletes its record when the wrapped call fails) and the
    # submit claim written in the job's creation transaction
    "idempotency": TableAccess(
        ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
    ),
    # GET /v1/tenants/{tenant}/usage reads a tenant's month (the API never writes usage)
    "usage": TableAccess(("dynamodb:Query",)),
}


GATEWAY_ERROR_TEMPLATE = (
    '{"error": {"code": "$context.error.responseType", '
    '"message": $context.error.messageString, "details": null}}'
)


#: One JSON object per request in the access log: who (ARN, access key), what, how it ended (error
#: type), and over which TLS version and cipher.
ACCESS_LOG_FIELDS: dict[str, str] = {
    "requestId": "$context.requestId",
    "extendedRequestId": "$context.extendedRequestId",
    "requestTime": "$context.requestTime",
    "ip": "$context.identity.sourceIp",
    "userAgent": "$context.identity.userAgent",
    "caller": "$context.identity.caller",
    "user": "$context.identity.user",
    "userArn": "$context.identity.userArn",
    "accessKey": "$context.identity.accessKey",
    "accountId": "$context.identity.accountId",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "path": "$context.path",
    "protocol": "$context.protocol",
    "status": "$context.status",
    "responseLength": "$context.responseLength",
    "responseLatency": "$context.responseLatency",
    "integrationLatency": "$context.integrationLatency",
    "errorType": "$context.error.responseType",
    "tlsVersion": "$context.tlsVersion",
    "cipherSuite": "$context.cipherSuite",
}


def resource_policy(member_tag: str) -> iam.PolicyDocument:
    """Who may invoke the API at all: principals of this account carrying ``member_tag``.

    Within one account API Gateway allows a call when either the caller's IAM policy or the resource
    policy allows it, so the restriction is made of explicit denies (an explicit deny always wins):
    any other account, and any principal without the tag (account root, untagged roles and users).
    """
    invoke = {"actions": ["execute-api:Invoke"], "resources": ["execute-api:/*"]}
    return iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                sid="AccountMembersMayInvoke",
                principals=[iam.AccountRootPrincipal()],
                conditions={"Null": {f"aws:PrincipalTag/{member_tag}": "false"}},
                **invoke,  # type: ignore[arg-type]
            ),
            iam.PolicyStatement(
                sid="AccountHostsMayInvoke",
                principals=[iam.AccountRootPrincipal()],
                conditions={"Null": {f"aws:PrincipalTag/{HOST_TAG}": "false"}},
                **invoke,  # type: ignore[arg-type]
            ),
            iam.PolicyStatement(
                sid="DenyOtherAccounts",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                conditions={"StringNotEquals": {"aws:PrincipalAccount": Aws.ACCOUNT_ID}},
                **invoke,  # type: ignore[arg-type]
            ),
            iam.PolicyStatement(
                sid="DenyPrincipalsWithoutMemberTag",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                # Conditions of one statement are ANDed: denied when neither tag is present.
                conditions={
                    "Null": {f"aws:PrincipalTag/{member_tag}": "true", f"aws:PrincipalTag/{HOST_TAG}": "true"}
                },
                **invoke,  # type: ignore[arg-type]
            ),
        ]
    )


def base_environment(tables: DataTables, storage: Storage) -> dict[str, str]:
    """What every control-plane function reads (``berth.handlers.settings``)."""
    return {
        "BERTH_JOBS_TABLE": tables.jobs.table_name,
        "BERTH_JOB_EVENTS_TABLE": tables.job_events.table_name,
        "BERTH_TENANTS_TABLE": tables.tenants.table_name,
        "BERTH_IDEMPOTENCY_TABLE": tables.idempotency.table_name,
        "BERTH_HOSTS_TABLE": tables.hosts.table_name,
        "BERTH_USAGE_TABLE": tables.usage.table_name,
        "BERTH_ARTIFACTS_BUCKET": storage.artifacts.bucket_name,
        "BERTH_DATA_BUCKET": storage.data.bucket_name,
        "POWERTOOLS_METRICS_NAMESPACE": "Berth",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        # Responses carry job specs (env included): never copy them into X-Ray.
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
    }


class ApiFunction(Construct):
    """The API's Lambda with its own log group and a least-privilege role."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        tables: DataTables,
        storage: Storage,
        bundle: bool,
        reserved_concurrency: int = DEFAULT_API_RESERVED_CONCURRENCY,
        tenant_requests_per_second: int = DEFAULT_TENANT_REQUESTS_PER_SECOND,
        workflow_environment: dict[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)

        self.log_group = logs.LogGroup(
            self, "LogGroup", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY
        )
        # Own role instead of the default one: no AWSLambdaBasicExecutionRole managed policy, logs
        # only to this function's log group.
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Berth API Lambda: DynamoDB state tables, its log group, X-Ray",
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            handler="berth.handlers.api.lambda_handler",
            code=function_code(bundle),
            memory_size=512,
            timeout=Duration.seconds(29),
            tracing=lambda_.Tracing.ACTIVE,
            role=self.role,
            log_group=self.log_group,
            reserved_concurrent_executions=reserved_concurrency,
            description="Berth control-plane HTTP API (/v1)",
            environment={
                **base_environment(tables, storage),
                **(workflow_environment or {}),
                "POWERTOOLS_SERVICE_NAME": "berth-api",
                "BERTH_RATE_LIMIT_REQUESTS": str(tenant_requests_per_second),
                "BERTH_RATE_LIMIT_WINDOW_S": "1",
                "BERTH_JOB_METRICS_TABLE": tables.job_metrics.table_name,
            },
        )
        self.log_group.grant_write(self.role)
        self._grant_tables(tables)
        # Bundles: HeadObject (GetObject) to see whether a digest is stored and check its checksum;
        # PutObject to sign the presigned upload (the caller's PUT runs with these rights, for that one
        # key, size and checksum); PutObjectTagging to mark a bundle referenced at submit.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"],
                resources=[storage.artifacts.arn_for_objects("bundles/*")],
            )
        )
        # Secrets named in a spec must exist (DescribeSecret; never GetSecretValue: values are the
        # job's, read with its own credentials at run time).
        stack = Stack.of(self)
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:DescribeSecret"],
                resources=[
                    f"arn:{stack.partition}:secretsmanager:{stack.region}:{stack.account}:secret:berth/*"
                ],
            )
        )

        # GET /v1/jobs/{id}/logs: the job's attempt stream in its tenant's group (the agents write
        # them with the attempts' own credentials); GET /v1/jobs/{id}/metrics: the attempt's samples.
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="JobLogs",
                actions=["logs:GetLogEvents"],
                resources=[
                    f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:{JOB_LOG_GROUP_PREFIX}/*"
                ],
            )
        )
        # GET /v1/jobs/{id}/outputs: list a job's output prefix (<tenant>/jobs/<job>/) and presign a
        # GET per object (the caller's download runs with these rights, for that one key). Only job
        # output prefixes: never a tenant's own data.
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="JobOutputsList",
                actions=["s3:ListBucket"],
                resources=[storage.data.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["*/jobs/*"]}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="JobOutputsRead",
                actions=["s3:GetObject"],
                resources=[storage.data.arn_for_objects("*/jobs/*")],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="JobMetrics", actions=["dynamodb:Query"], resources=[tables.job_metrics.table_arn]
            )
        )

    def _grant_tables(self, tables: DataTables) -> None:
        """One statement per table (and per write restriction) with exactly ``API_TABLE_ACCESS``."""
        jobs_arn = tables.jobs.table_arn
        resources = {
            "jobs": [jobs_arn],
            "jobs_indexes": [f"{jobs_arn}/index/{name}" for name in tables.jobs_index_names],
            "job_events": [tables.job_events.table_arn],
            "tenants_read": [tables.tenants.table_arn],
            "tenants_indexes": [f"{tables.tenants.table_arn}/index/{n}" for n in tables.tenants_index_names],
            "tenants_write": [tables.tenants.table_arn],
            "idempotency": [tables.idempotency.table_arn],
            "hosts": [tables.hosts.table_arn],
            "usage": [tables.usage.table_arn],
        }
        for name, access in API_TABLE_ACCESS.items():
            conditions = (
                {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": list(access.write_leading_keys)}}
                if access.write_leading_keys
                else None
            )
            self.role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="".join(part.capitalize() for part in name.split("_")),
                    actions=list(access.actions),
                    resources=resources[name],
                    conditions=conditions,
                )
            )


class BerthApi(Construct):
    """REST API ``BerthApi``, stage ``api``; every method AWS_IAM, Lambda proxy to ``ApiFunction``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: lambda_.IFunction,
        member_tag: str = DEFAULT_MEMBER_TAG,
        agent_handler: lambda_.IFunction | None = None,
    ) -> None:
        super().__init__(scope, construct_id)

        self.access_log_group = logs.LogGroup(
            self, "AccessLogs", retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY
        )
        self.rest_api = apigw.RestApi(
            self,
            "BerthApi",
            rest_api_name="BerthApi",
            description="Berth hybrid-cloud GPU allocation API (SigV4-signed, routes under /v1)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            policy=resource_policy(member_tag),
            # Execution logging (APIG6) needs the account-level CloudWatch role; CDK creates it with the
            # AWS::ApiGateway::Account resource (no custom resource).
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN,
            deploy_options=apigw.StageOptions(
                stage_name=API_STAGE_NAME,
                tracing_enabled=True,
                logging_level=apigw.MethodLoggingLevel.INFO,
                data_trace_enabled=False,  # request/response bodies never go to logs
                metrics_enabled=True,
                throttling_rate_limit=100,
                throttling_burst_limit=200,
                access_log_destination=apigw.LogGroupLogDestination(self.access_log_group),
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FIELDS)),
            ),
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
        )
        # Enhanced TLS policy (TLS 1.2+ with forward secrecy, or 1.3); it requires an endpoint access mode,
        # STRICT: the request's SNI host must be this API's endpoint.
        cfn_api: apigw.CfnRestApi = self.rest_api.node.default_child  # type: ignore[assignment]
        cfn_api.security_policy = TLS_SECURITY_POLICY
        cfn_api.endpoint_access_mode = "STRICT"
        # The default `Endpoint` output is replaced by the stack's contract output `ApiUrl`.
        self.rest_api.node.try_remove_child("Endpoint")

        # API Gateway's own refusals (bad signature, throttling, integration failure) answer in the
        # API's error shape too: {"error": {"code", "message", "details"}}.
        for response_type in (apigw.ResponseType.DEFAULT_4_XX, apigw.ResponseType.DEFAULT_5_XX):
            self.rest_api.add_gateway_response(
                f"Gateway{response_type.response_type}",
                type=response_type,
                templates={"application/json": GATEWAY_ERROR_TEMPLATE},
            )

        # Rejects requests missing declared parameters before they reach Lambda. Body validation is
        # on for any method that declares a request model; today none does: bodies are validated by
        # the handler against the pydantic job-spec model (one schema, one place, clear 4xx errors).
        self.validator = self.rest_api.add_request_validator(
            "RequestValidator",
            request_validator_name="berth-params-and-body",
            validate_request_parameters=True,
            validate_request_body=True,
        )
        # One invoke permission for the whole API instead of two per method, limited to the deployed
        # stage (not `*`: no other stage, nor the console's test-invoke, may call the function).
        # LambdaIntegration adds an API-scoped permission for any stage unless one with its id exists.
        handler.add_permission(
            f"ApiPermission.ApiScoped.{Names.node_unique_id(handler.node)}.{Names.node_unique_id(self.rest_api.node)}",
            principal=iam.ServicePrincipal("apigateway.amazonaws.com"),
            scope=self.rest_api,
            source_arn=self.rest_api.arn_for_execute_api(method="*", path="/*", stage=API_STAGE_NAME),
        )
        integration = apigw.LambdaIntegration(handler, proxy=True, scope_permission_to_method=False)
        routes: list[tuple[str, tuple[str, ...], apigw.LambdaIntegration]] = [
            (path, verbs, integration) for path, verbs in ROUTES.items()
        ]
        if agent_handler is not None:
            agent_handler.add_permission(
                f"ApiPermission.ApiScoped.{Names.node_unique_id(agent_handler.node)}.{Names.node_unique_id(self.rest_api.node)}",
                principal=iam.ServicePrincipal("apigateway.amazonaws.com"),
                scope=self.rest_api,
                source_arn=self.rest_api.arn_for_execute_api(method="*", path="/*", stage=API_STAGE_NAME),
            )
            agent_integration = apigw.LambdaIntegration(
                agent_handler, proxy=True, scope_permission_to_method=False
            )
            routes += [(path, verbs, agent_integration) for path, verbs in AGENT_ROUTES.items()]

        self.methods: list[apigw.Method] = []
        for path, verbs, route_integration in routes:
            resource = self.rest_api.root.resource_for_path(path)
            params = {
                f"method.request.path.{part[1:-1]}": True for part in path.split("/") if part.startswith("{")
            }
            for verb in verbs:
                self.methods.append(
                    resource.add_method(
                        verb,
                        route_integration,
                        authorization_type=apigw.AuthorizationType.IAM,
                        request_validator=self.validator,
                        request_parameters=params or None,
                    )
                )

    @property
    def url(self) -> str:
        return self.rest_api.url
