"""The public HTTP API: API Gateway REST API (SigV4/AWS_IAM on every method) proxying to one Lambda."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from berth_infra.bundling import LAMBDA_ARCHITECTURE, LAMBDA_RUNTIME, function_code
from berth_infra.data import DataTables
from berth_infra.storage import Storage

API_STAGE_NAME = "api"
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
    "/v1/capacity": ("GET",),
    "/v1/tenants/{tenant}/quota": ("GET", "PUT"),
    "/v1/tenants/{tenant}/grants": ("GET", "PUT"),
    "/v1/bundles": ("POST",),
    "/v1/datasets/{name}": ("GET", "PUT"),
}


GATEWAY_ERROR_TEMPLATE = (
    '{"error": {"code": "$context.error.responseType", '
    '"message": $context.error.messageString, "details": null}}'
)


class ApiFunction(Construct):
    """The API's Lambda with its own log group and a least-privilege role."""

    def __init__(
        self, scope: Construct, construct_id: str, *, tables: DataTables, storage: Storage, bundle: bool
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
            description="Berth control-plane HTTP API (/v1)",
            environment={
                "BERTH_JOBS_TABLE": tables.jobs.table_name,
                "BERTH_JOB_EVENTS_TABLE": tables.job_events.table_name,
                "BERTH_TENANTS_TABLE": tables.tenants.table_name,
                "BERTH_IDEMPOTENCY_TABLE": tables.idempotency.table_name,
                "BERTH_ARTIFACTS_BUCKET": storage.artifacts.bucket_name,
                "BERTH_DATA_BUCKET": storage.data.bucket_name,
                "POWERTOOLS_SERVICE_NAME": "berth-api",
                "POWERTOOLS_METRICS_NAMESPACE": "Berth",
                "POWERTOOLS_LOG_LEVEL": "INFO",
            },
        )
        self.log_group.grant_write(self.role)
        # Jobs, events, idempotency: the API creates and transitions jobs (conditional writes) and
        # appends their history. Tenants: read for principal->tenant mapping and quotas, write for
        # admins setting quotas (authorised in the handler by role).
        for table in tables.all_tables:
            table.grant_read_write_data(self.role)
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


class BerthApi(Construct):
    """REST API ``BerthApi``, stage ``api``; every method AWS_IAM, Lambda proxy to ``ApiFunction``."""

    def __init__(self, scope: Construct, construct_id: str, *, handler: lambda_.IFunction) -> None:
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
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
            ),
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
        )
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
        # One invoke permission for the whole API instead of two per method.
        integration = apigw.LambdaIntegration(handler, proxy=True, scope_permission_to_method=False)

        self.methods: list[apigw.Method] = []
        for path, verbs in ROUTES.items():
            resource = self.rest_api.root.resource_for_path(path)
            params = {
                f"method.request.path.{part[1:-1]}": True for part in path.split("/") if part.startswith("{")
            }
            for verb in verbs:
                self.methods.append(
                    resource.add_method(
                        verb,
                        integration,
                        authorization_type=apigw.AuthorizationType.IAM,
                        request_validator=self.validator,
                        request_parameters=params or None,
                    )
                )

    @property
    def url(self) -> str:
        return self.rest_api.url
