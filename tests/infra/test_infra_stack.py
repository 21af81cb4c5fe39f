"""Template assertions: the contract other components rely on and the security posture."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match

from berth_infra.api import API_STAGE_NAME, ROUTES
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
        "ApiFunctionName",
        "ArtifactsBucketName",
        "DataBucketName",
        "JobRoleArn",
    }
    url = synthesized.json["Outputs"]["ApiUrl"]["Value"]["Fn::Join"][1]
    stage_id = url[-2]["Ref"]
    assert synthesized.json["Resources"][stage_id]["Properties"]["StageName"] == API_STAGE_NAME
    assert url[0] == "https://" and url[-1] == "/"


def test_every_table_is_on_demand_encrypted_with_pitr(synthesized: Synthesized) -> None:
    tables = synthesized.resources("AWS::DynamoDB::Table")
    assert len(tables) == 5
    for table in tables.values():
        props = table["Properties"]
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert props["SSESpecification"]["SSEEnabled"] is True


def test_state_tables_are_retained(synthesized: Synthesized) -> None:
    for output_id in ("JobsTableName", "JobEventsTableName", "TenantsTableName", "HostsTableName"):
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
        "status": "S",
        "created_key": "S",
    }
    gsis = {g["IndexName"]: g for g in props["GlobalSecondaryIndexes"]}
    assert set(gsis) == {"by_tenant", "by_tenant_status", "by_status"}
    assert _key_schema(gsis["by_status"]) == [("status", "HASH"), ("created_key", "RANGE")]
    assert _key_schema(gsis["by_tenant"]) == [("tenant", "HASH"), ("created_key", "RANGE")]
    assert _key_schema(gsis["by_tenant_status"]) == [("tenant_status", "HASH"), ("created_key", "RANGE")]
    for gsi in gsis.values():
        assert gsi["Projection"] == {"ProjectionType": "ALL"}


def test_job_events_tenants_idempotency_schemas(synthesized: Synthesized) -> None:
    events = _table_by_output(synthesized, "JobEventsTableName")["Properties"]
    assert _key_schema(events) == [("job_id", "HASH"), ("seq", "RANGE")]
    assert _attr_types(events) == {"job_id": "S", "seq": "N"}

    tenants = _table_by_output(synthesized, "TenantsTableName")["Properties"]
    assert _key_schema(tenants) == [("pk", "HASH")]
    assert _attr_types(tenants) == {"pk": "S"}

    hosts = _table_by_output(synthesized, "HostsTableName")["Properties"]
    assert _key_schema(hosts) == [("host_id", "HASH")]
    assert _attr_types(hosts) == {"host_id": "S"}
    assert "GlobalSecondaryIndexes" not in hosts

    idem = _table_by_output(synthesized, "IdempotencyTableName")["Properties"]
    assert _key_schema(idem) == [("id", "HASH")]
    assert _attr_types(idem) == {"id": "S"}
    assert idem["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}
    for props in (events, tenants):
        assert "GlobalSecondaryIndexes" not in props


def test_api_function(synthesized: Synthesized) -> None:
    functions = synthesized.resources("AWS::Lambda::Function")
    assert len(functions) == 1
    (fn_id, fn), *_ = functions.items()
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
        "BERTH_ARTIFACTS_BUCKET": outputs["ArtifactsBucketName"]["Value"],
        "BERTH_DATA_BUCKET": outputs["DataBucketName"]["Value"],
        "POWERTOOLS_SERVICE_NAME": "berth-api",
        "POWERTOOLS_METRICS_NAMESPACE": "Berth",
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        "BERTH_RATE_LIMIT_REQUESTS": "50",
        "BERTH_RATE_LIMIT_WINDOW_S": "1",
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
EXPECTED_STATEMENTS: dict[str, dict[tuple[str, str | None], set[str]]] = {
    "berth.handlers.api.lambda_handler": {
        ("*", None): {"xray:PutTraceSegments", "xray:PutTelemetryRecords"},
        ("logs", None): {"logs:CreateLogStream", "logs:PutLogEvents"},
        ("JobsTableName", None): {"dynamodb:GetItem", "dynamodb:PutItem"},
        ("JobsTableName/index/by_tenant", None): {"dynamodb:Query"},
        ("JobsTableName/index/by_tenant_status", None): {"dynamodb:Query"},
        ("JobsTableName/index/by_status", None): {"dynamodb:Query"},
        ("HostsTableName", None): {"dynamodb:Scan"},
        ("JobEventsTableName", None): {"dynamodb:PutItem", "dynamodb:Query"},
        ("TenantsTableName", None): {"dynamodb:GetItem"},
        ("TenantsTableName", "TENANT#*,DATASET#*,RATE#*,KEY#*,DOC#*"): {
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
        },
        ("ArtifactsBucketName/bundles/*", None): {"s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"},
        ("secret:berth/*", None): {"secretsmanager:DescribeSecret"},
        ("IdempotencyTableName", None): {
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
        },
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
    (
        "secretsmanager:GetSecretValue",
        "secret:berth/*",
    ): "job role's outer bound; sessions name their secrets",
}


def _resource_name(s: Synthesized, resource: Any, log_groups: set[str]) -> str:
    """A readable name for a policy resource: tables and buckets by their output name."""
    if isinstance(resource, str):
        return resource
    named = {
        s.json["Outputs"][o]["Value"]["Ref"]: o
        for o in s.json["Outputs"]
        if o.endswith(("TableName", "BucketName")) and "Ref" in s.json["Outputs"][o]["Value"]
    }
    if "Fn::GetAtt" in resource:
        logical = resource["Fn::GetAtt"][0]
        return "logs" if logical in log_groups else named[logical]
    parts = resource["Fn::Join"][1]
    text = "".join(
        p if isinstance(p, str) else (named[p["Fn::GetAtt"][0]] if "Fn::GetAtt" in p else "") for p in parts
    )
    return text.split(":secret:", 1)[1].join(("secret:", "")) if ":secret:" in text else text


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
            if condition is not None:
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
    assert statements["DenyPrincipalsWithoutMemberTag"]["Condition"] == {
        "Null": {"aws:PrincipalTag/berth:tenant": "true"}
    }
    assert "root" in json.dumps(statements["AccountMembersMayInvoke"]["Principal"])


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


def test_lambda_role_has_no_managed_policies(synthesized: Synthesized) -> None:
    fn = next(iter(synthesized.resources("AWS::Lambda::Function").values()))
    role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    assert "ManagedPolicyArns" not in synthesized.json["Resources"][role_id]["Properties"]


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
    expected = {(path, verb) for path, verbs in ROUTES.items() for verb in verbs}
    assert set(_method_paths(synthesized)) == expected
    assert ("/v1/jobs", "POST") in expected and ("/v1/tenants/{tenant}/quota", "PUT") in expected
    assert len(expected) == 20
    assert ("/v1/policy", "PUT") in expected and ("/v1/offers", "GET") in expected


def test_every_method_uses_aws_iam_and_lambda_proxy(synthesized: Synthesized) -> None:
    fn_id = next(iter(synthesized.resources("AWS::Lambda::Function")))
    methods = synthesized.resources("AWS::ApiGateway::Method")
    assert methods
    for method in methods.values():
        props = method["Properties"]
        assert props["AuthorizationType"] == "AWS_IAM"
        integration = props["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert integration["IntegrationHttpMethod"] == "POST"
        assert fn_id in str(integration["Uri"])
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
    assert len(permissions) == 1
    for permission in permissions.values():
        props = permission["Properties"]
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
