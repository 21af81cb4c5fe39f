"""Template assertions: the contract other components rely on and the security posture."""

from __future__ import annotations

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
        "ApiFunctionName",
    }
    url = synthesized.json["Outputs"]["ApiUrl"]["Value"]["Fn::Join"][1]
    stage_id = url[-2]["Ref"]
    assert synthesized.json["Resources"][stage_id]["Properties"]["StageName"] == API_STAGE_NAME
    assert url[0] == "https://" and url[-1] == "/"


def test_every_table_is_on_demand_encrypted_with_pitr(synthesized: Synthesized) -> None:
    tables = synthesized.resources("AWS::DynamoDB::Table")
    assert len(tables) == 4
    for table in tables.values():
        props = table["Properties"]
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert props["SSESpecification"]["SSEEnabled"] is True


def test_state_tables_are_retained(synthesized: Synthesized) -> None:
    for output_id in ("JobsTableName", "JobEventsTableName", "TenantsTableName"):
        table = _table_by_output(synthesized, output_id)
        assert table["DeletionPolicy"] == "Retain"
        assert table["UpdateReplacePolicy"] == "Retain"


def test_jobs_table_schema(synthesized: Synthesized) -> None:
    props = _table_by_output(synthesized, "JobsTableName")["Properties"]
    assert _key_schema(props) == [("job_id", "HASH")]
    assert _attr_types(props) == {"job_id": "S", "tenant": "S", "tenant_status": "S", "created_key": "S"}
    gsis = {g["IndexName"]: g for g in props["GlobalSecondaryIndexes"]}
    assert set(gsis) == {"by_tenant", "by_tenant_status"}
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
        "POWERTOOLS_SERVICE_NAME": "berth-api",
        "POWERTOOLS_METRICS_NAMESPACE": "Berth",
        "POWERTOOLS_LOG_LEVEL": "INFO",
    }
    log_group_id = props["LoggingConfig"]["LogGroup"]["Ref"]
    assert synthesized.json["Resources"][log_group_id]["Type"] == "AWS::Logs::LogGroup"


def test_every_log_group_has_retention(synthesized: Synthesized) -> None:
    log_groups = synthesized.resources("AWS::Logs::LogGroup")
    assert len(log_groups) >= 2
    for log_group in log_groups.values():
        assert log_group["Properties"]["RetentionInDays"] == 30


def _statements(s: Synthesized) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in s.resources("AWS::IAM::Policy").values():
        out.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return out


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_lambda_role_is_least_privilege(synthesized: Synthesized) -> None:
    table_ids = set(synthesized.resources("AWS::DynamoDB::Table"))
    dynamodb_resources: list[Any] = []
    for statement in _statements(synthesized):
        actions = _as_list(statement["Action"])
        assert "*" not in actions and not any(a.endswith(":*") for a in actions), statement
        resources = _as_list(statement["Resource"])
        if any(a.startswith("dynamodb:") for a in actions):
            assert all(a.startswith("dynamodb:") for a in actions)
            dynamodb_resources.extend(resources)
        elif "*" in resources:
            # Only X-Ray, which has no resource-level permissions.
            assert all(a.startswith("xray:") for a in actions), statement
    assert dynamodb_resources
    assert "*" not in dynamodb_resources
    granted: set[str] = set()
    for resource in dynamodb_resources:
        if "Fn::GetAtt" in resource:
            granted.add(resource["Fn::GetAtt"][0])
        else:  # "<table arn>/index/*": the Jobs table's GSIs
            parts = resource["Fn::Join"][1]
            assert parts[1] == "/index/*"
            granted.add(parts[0]["Fn::GetAtt"][0])
    assert granted == table_ids


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
    assert len(expected) == 11


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


def test_invoke_permission_is_scoped_to_this_api(synthesized: Synthesized) -> None:
    permissions = synthesized.resources("AWS::Lambda::Permission")
    api_id = synthesized.json["Outputs"]["ApiId"]["Value"]["Ref"]
    assert permissions
    for permission in permissions.values():
        props = permission["Properties"]
        assert props["Principal"] == "apigateway.amazonaws.com"
        assert {"Ref": api_id} in props["SourceArn"]["Fn::Join"][1]


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
