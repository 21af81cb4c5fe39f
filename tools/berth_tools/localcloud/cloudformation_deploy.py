"""Deploy the synthesised CDK template into moto's CloudFormation, fixing moto's gaps on the way.

The template is the very one `cdk deploy` sends to AWS; nothing in `infra/` knows about moto. What moto
lacks is fixed here, either by preparing the account like `cdk bootstrap` would, by transforming the
template dict in memory, or by adjusting moto's models after the stack is created. Each fix is listed in
`FIXES` with the reason it is needed, and `docs/local-cloud.md` carries the same list.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import re
import time
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from berth_tools.localcloud import moto_compat
from berth_tools.localcloud.cfn_alarms import ALARM, create_alarms, take_alarms

DEFAULT_STACK_NAME = "Berth"
DEFAULT_REGION = "us-east-1"
DEFAULT_ACCOUNT_ID = "123456789012"  # moto's default account
#: The CheckBootstrapVersion rule of CDK's default synthesizer wants version >= 6.
BOOTSTRAP_VERSION = "30"

#: The stack's operations resources (docs/operations.md, "Operations resources on the local cloud")
#: that moto's CloudFormation does not implement and the local cloud skips, and why that changes
#: nothing a local run does. The dashboard, the alarm topic and its KMS key deploy; the alarms are
#: created through the CloudWatch API (fix "cloudwatch-alarms").
NOT_EMULATED_OPERATIONS: dict[str, str] = {
    "AWS::SNS::TopicPolicy": "the alarm topic's TLS-only policy; nothing publishes to the topic locally",
    "AWS::SNS::Subscription": "an alarm e-mail subscription (berth:alarmEmail); no mail leaves the machine",
}

FIXES: dict[str, str] = {
    "bootstrap-version-parameter": (
        "CDK's default synthesizer adds the parameter BootstrapVersion of type "
        "AWS::SSM::Parameter::Value<String> defaulting to /cdk-bootstrap/<qualifier>/version; moto resolves "
        "it from its SSM and crashes when it is missing, so it is created (as `cdk bootstrap` would)."
    ),
    "asset-bucket": (
        "Lambda code is an asset in cdk-<qualifier>-assets-<account>-<region>; the bucket is created with a "
        "small placeholder object per referenced key. The code itself runs in-process from the installed "
        "`berth` package (the asset is built from the same functions/ tree)."
    ),
    "api-stage": (
        "moto's CloudFormation does not implement AWS::ApiGateway::Stage (the resource is skipped and Ref "
        "to it yields 'None', so the ApiUrl output is wrong and the API has no stage). The stage name is "
        "folded into its AWS::ApiGateway::Deployment (moto's Deployment creates the stage), Refs to the "
        "stage are replaced by its name (what Ref returns on AWS), DependsOn on it points at the "
        "deployment, and stage variables are applied after creation."
    ),
    "method-integration-defaults": (
        "moto's AWS::ApiGateway::Method handler reads Integration.IntegrationHttpMethod and Integration.Uri "
        "unconditionally; MOCK integrations (e.g. CORS preflight) have neither, so neutral defaults are set."
    ),
    "lambda-logging-config": (
        "moto ignores a function's LoggingConfig.LogGroup and logs to /aws/lambda/<name>; after creation "
        "the function's log group is set to the deployed log group, so handler logs land where the "
        "template (and the CLI) expect them."
    ),
    "event-bus-refs": (
        "moto resolves Ref to an AWS::Events::EventBus as its model object (a rule naming its bus that "
        "way crashes, an environment variable holds an object); Refs to a bus are replaced by its Name "
        "(what Ref returns on AWS)."
    ),
    "event-source-mappings": (
        "moto invokes a mapping's function synchronously inside the SendMessage or DynamoDB write "
        "that fed it (no batching window, the writer blocked on the consumer); mappings are removed "
        "from the template and run by the local cloud's own pollers (event_sources.py) with the "
        "template's batch size, batching window and partial-batch responses."
    ),
    "executable-state-machines": (
        "With execute_state_machine on, moto's Step Functions API serves its executing backend while its "
        "CloudFormation creates state machines in the other one (the API cannot see them); each "
        "deployed state machine is created again through the API with its resolved definition and role."
    ),
    "local-timings": (
        "Function environment values named in the local cloud's timing overrides (heartbeat, lease, "
        "backoff, ...) are replaced so tests and demos take seconds, not minutes."
    ),
    "batch-service-linked-role": (
        "A Batch compute environment without ServiceRole uses Batch's service-linked role "
        "(AWSServiceRoleForBatch, created on first use); moto's CloudFormation requires the property and "
        "an existing role, so the service-linked role is created (CreateServiceLinkedRole) and named."
    ),
    "cloudwatch-alarms": (
        "moto's CloudFormation does not implement AWS::CloudWatch::Alarm: the alarms are taken out of the "
        "template (references become the ARNs CloudFormation would give them) and created with "
        "PutMetricAlarm after the stack (berth_tools/localcloud/cfn_alarms.py)."
    ),
    "unsupported-resources": (
        "Resource types moto's CloudFormation does not implement (e.g. AWS::ApiGateway::Account, which "
        "only sets the account-wide CloudWatch role) are skipped by moto with a warning; they are listed "
        "once at deploy time instead of warning per reference."
    ),
}


@dataclass
class DeployedStack:
    stack_name: str
    region: str
    outputs: dict[str, str]
    resources: dict[str, tuple[str, str]]  # logical id -> (resource type, physical id)
    skipped_types: list[str] = field(default_factory=list)
    applied_fixes: list[str] = field(default_factory=list)
    #: The template's event source mappings (logical id -> properties), run by the local cloud.
    event_source_mappings: dict[str, dict[str, Any]] = field(default_factory=dict)
    deploy_seconds: float = 0.0

    def physical_ids(self, resource_type: str) -> list[str]:
        return [physical for kind, physical in self.resources.values() if kind == resource_type]


class DeployError(RuntimeError):
    pass


def load_template(path: Path) -> dict[str, Any]:
    template: dict[str, Any] = json.loads(path.read_text())
    return template


# -- template transforms -------------------------------------------------------------------------
def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _replace_refs(node: Any, logical_id: str, value: str) -> Any:
    if isinstance(node, dict):
        if node == {"Ref": logical_id}:
            return value
        return {key: _replace_refs(item, logical_id, value) for key, item in node.items()}
    if isinstance(node, list):
        return [_replace_refs(item, logical_id, value) for item in node]
    return node


def _fold_api_stages(template: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Fix `api-stage`; returns {deployment logical id: stage variables} to apply after creation."""
    resources: dict[str, Any] = template.get("Resources", {})
    stage_variables: dict[str, dict[str, str]] = {}
    stages = {lid: res for lid, res in resources.items() if res.get("Type") == "AWS::ApiGateway::Stage"}
    for stage_id, stage in stages.items():
        props = stage.get("Properties", {})
        deployment_ref = props.get("DeploymentId")
        stage_name = props.get("StageName")
        if not (isinstance(deployment_ref, dict) and "Ref" in deployment_ref and isinstance(stage_name, str)):
            continue  # not the shape CDK synthesises: leave it to moto
        deployment_id = deployment_ref["Ref"]
        deployment = resources.get(deployment_id)
        if deployment is None:
            continue
        deployment.setdefault("Properties", {})["StageName"] = stage_name
        if props.get("Variables"):
            stage_variables[deployment_id] = dict(props["Variables"])
        del resources[stage_id]
        for key in list(template):
            template[key] = _replace_refs(template[key], stage_id, stage_name)
        for res in resources.values():
            depends = res.get("DependsOn")
            if isinstance(depends, str):
                depends = [depends]
            if isinstance(depends, list) and stage_id in depends:
                replaced = [deployment_id if dep == stage_id else dep for dep in depends]
                res["DependsOn"] = [dep for i, dep in enumerate(replaced) if dep not in replaced[:i]]
    return stage_variables


def _default_method_integrations(template: dict[str, Any]) -> bool:
    changed = False
    for res in template.get("Resources", {}).values():
        if res.get("Type") != "AWS::ApiGateway::Method":
            continue
        integration = res.setdefault("Properties", {}).setdefault("Integration", {"Type": "MOCK"})
        for key, default in (("IntegrationHttpMethod", "POST"), ("Uri", ""), ("Type", "MOCK")):
            if key not in integration:
                integration[key] = default
                changed = True
    return changed


def unsupported_resource_types(template: dict[str, Any]) -> list[str]:
    supported = moto_compat.cloudformation_model_map()
    types = {res.get("Type", "") for res in template.get("Resources", {}).values()}
    return sorted(t for t in types if t not in supported and not t.startswith("Custom::"))


@dataclass
class PreparedTemplate:
    template: dict[str, Any]
    applied_fixes: list[str]
    stage_variables: dict[str, dict[str, str]]
    skipped_types: list[str]
    event_source_mappings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The template's alarms (logical id -> properties), created through the CloudWatch API.
    alarms: dict[str, dict[str, Any]] = field(default_factory=dict)


def _fix_event_bus_refs(template: dict[str, Any]) -> bool:
    resources: dict[str, Any] = template.get("Resources", {})
    buses = {
        lid: res.get("Properties", {}).get("Name")
        for lid, res in resources.items()
        if res.get("Type") == "AWS::Events::EventBus"
        and isinstance(res.get("Properties", {}).get("Name"), str)
    }
    for bus_id, name in buses.items():
        for key in list(template):
            template[key] = _replace_refs(template[key], bus_id, name)
    return bool(buses)


def _take_event_source_mappings(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    resources: dict[str, Any] = template.get("Resources", {})
    taken = {
        lid: res.get("Properties", {})
        for lid, res in resources.items()
        if res.get("Type") == "AWS::Lambda::EventSourceMapping"
    }
    for lid in taken:
        del resources[lid]
    for res in resources.values():
        depends = res.get("DependsOn")
        if isinstance(depends, str):
            depends = [depends]
        if isinstance(depends, list) and any(d in taken for d in depends):
            res["DependsOn"] = [d for d in depends if d not in taken]
    return taken


def _override_function_environment(template: dict[str, Any], overrides: dict[str, str]) -> bool:
    changed = False
    for res in template.get("Resources", {}).values():
        if res.get("Type") != "AWS::Lambda::Function":
            continue
        variables = res.get("Properties", {}).get("Environment", {}).get("Variables", {})
        for key, value in overrides.items():
            if key in variables:
                variables[key] = value
                changed = True
    return changed


def prepare_template(template: dict[str, Any], environment: dict[str, str] | None = None) -> PreparedTemplate:
    """Return a transformed copy of `template` that moto's CloudFormation deploys faithfully."""
    fixed = copy.deepcopy(template)
    applied: list[str] = []
    if _fix_event_bus_refs(fixed):
        applied.append("event-bus-refs")
    mappings = _take_event_source_mappings(fixed)
    if mappings:
        applied.append("event-source-mappings")
    alarms = take_alarms(fixed)
    if alarms:
        applied.append("cloudwatch-alarms")
    if environment and _override_function_environment(fixed, environment):
        applied.append("local-timings")
    has_stage = any(r.get("Type") == "AWS::ApiGateway::Stage" for r in fixed.get("Resources", {}).values())
    stage_variables = _fold_api_stages(fixed)
    if has_stage:
        applied.append("api-stage")
    if _default_method_integrations(fixed):
        applied.append("method-integration-defaults")
    skipped = unsupported_resource_types(fixed)
    if skipped:
        applied.append("unsupported-resources")
    return PreparedTemplate(fixed, applied, stage_variables, skipped, mappings, alarms)


# -- account preparation (what `cdk bootstrap` would have done) ------------------------------------
_ASSET_BUCKET = re.compile(r"^cdk-(?P<qualifier>[a-z0-9]+)-assets-\$\{AWS::AccountId\}-\$\{AWS::Region\}$")


def _asset_objects(template: dict[str, Any], account: str, region: str) -> dict[str, set[str]]:
    objects: dict[str, set[str]] = {}
    for node in _walk(template.get("Resources", {})):
        bucket, key = node.get("S3Bucket"), node.get("S3Key")
        sub = bucket.get("Fn::Sub") if isinstance(bucket, dict) else None
        if isinstance(sub, str) and isinstance(key, str) and _ASSET_BUCKET.match(sub):
            name = sub.replace("${AWS::AccountId}", account).replace("${AWS::Region}", region)
            objects.setdefault(name, set()).add(key)
    return objects


def _placeholder_zip() -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr(
            "README.txt", "berth local cloud: this function's code runs in-process from the berth package.\n"
        )
    return data.getvalue()


def prepare_account(session: boto3.session.Session, endpoint_url: str, template: dict[str, Any]) -> list[str]:
    applied: list[str] = []
    region = session.region_name or DEFAULT_REGION
    for name, parameter in template.get("Parameters", {}).items():
        if str(parameter.get("Type", "")).startswith("AWS::SSM::Parameter::Value") and parameter.get(
            "Default"
        ):
            ssm = session.client("ssm", endpoint_url=endpoint_url)
            value = BOOTSTRAP_VERSION if name == "BootstrapVersion" else "local"
            ssm.put_parameter(Name=parameter["Default"], Value=value, Type="String", Overwrite=True)
            applied.append("bootstrap-version-parameter")
    objects = _asset_objects(template, DEFAULT_ACCOUNT_ID, region)
    if objects:
        s3 = session.client("s3", endpoint_url=endpoint_url)
        body = _placeholder_zip()
        for bucket, keys in objects.items():
            s3.create_bucket(Bucket=bucket)
            for key in keys:
                s3.put_object(Bucket=bucket, Key=key, Body=body)
        applied.append("asset-bucket")
    return sorted(set(applied))


BATCH_SERVICE = "batch.amazonaws.com"


def _batch_service_linked_role(
    session: boto3.session.Session, endpoint_url: str, template: dict[str, Any]
) -> bool:
    """Fix `batch-service-linked-role`: name Batch's service-linked role on CEs that rely on it."""
    environments = [
        res.setdefault("Properties", {})
        for res in template.get("Resources", {}).values()
        if res.get("Type") == "AWS::Batch::ComputeEnvironment"
        and "ServiceRole" not in res.get("Properties", {})
    ]
    if not environments:
        return False
    iam = session.client("iam", endpoint_url=endpoint_url)
    roles = iam.list_roles(PathPrefix=f"/aws-service-role/{BATCH_SERVICE}/")["Roles"]
    arn = (
        roles[0]["Arn"]
        if roles
        else iam.create_service_linked_role(AWSServiceName=BATCH_SERVICE)["Role"]["Arn"]
    )
    for props in environments:
        props["ServiceRole"] = arn
    return True


class _UnsupportedTypeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No Moto CloudFormation support")


def _quiet_unsupported_type_logs() -> None:
    logger = logging.getLogger("moto")
    if not any(isinstance(f, _UnsupportedTypeFilter) for f in logger.filters):
        logger.addFilter(_UnsupportedTypeFilter())


# -- deploy ----------------------------------------------------------------------------------------
def deploy_stack(
    session: boto3.session.Session,
    endpoint_url: str,
    template: dict[str, Any],
    stack_name: str = DEFAULT_STACK_NAME,
    timeout_s: float = 120.0,
    environment: dict[str, str] | None = None,
) -> DeployedStack:
    started = time.monotonic()
    prepared = prepare_template(template, environment)
    applied = prepare_account(session, endpoint_url, prepared.template) + prepared.applied_fixes
    if _batch_service_linked_role(session, endpoint_url, prepared.template):
        applied.append("batch-service-linked-role")
    cfn = session.client("cloudformation", endpoint_url=endpoint_url)
    # moto warns once per reference to an unsupported type; they are reported in `skipped_types` instead.
    warnings.filterwarnings(
        "ignore", message=r"Tried to parse .* not supported by moto", category=UserWarning
    )
    cfn.create_stack(
        StackName=stack_name,
        TemplateBody=json.dumps(prepared.template),
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    deadline = time.monotonic() + timeout_s
    while True:
        stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
        status = stack["StackStatus"]
        if status == "CREATE_COMPLETE":
            break
        if not status.endswith("_IN_PROGRESS") or time.monotonic() > deadline:
            raise DeployError(f"stack {stack_name} is {status}: {stack.get('StackStatusReason', '')}")
        time.sleep(0.2)
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
    resources: dict[str, tuple[str, str]] = {}
    paginator = cfn.get_paginator("list_stack_resources")
    for page in paginator.paginate(StackName=stack_name):
        for summary in page["StackResourceSummaries"]:
            resources[summary["LogicalResourceId"]] = (
                summary["ResourceType"],
                summary.get("PhysicalResourceId", ""),
            )
    deployed = DeployedStack(
        stack_name=stack_name,
        region=session.region_name or DEFAULT_REGION,
        outputs=outputs,
        resources=resources,
        skipped_types=prepared.skipped_types,
        applied_fixes=applied,
        event_source_mappings=prepared.event_source_mappings,
    )
    _apply_stage_variables(session, endpoint_url, prepared, deployed)
    if _recreate_state_machines(session, endpoint_url, prepared.template, deployed):
        deployed.applied_fixes.append("executable-state-machines")
    if _apply_lambda_log_groups(prepared.template, deployed):
        deployed.applied_fixes.append("lambda-logging-config")
    alarms = create_alarms(
        session, endpoint_url, prepared.alarms, lambda node: _resolve(node, session, endpoint_url, deployed)
    )
    deployed.resources.update({lid: (ALARM, name) for lid, name in alarms.items()})
    deployed.deploy_seconds = time.monotonic() - started
    return deployed


def _resolve(node: Any, session: boto3.session.Session, endpoint_url: str, deployed: DeployedStack) -> Any:
    """Resolve Fn::Join, Ref and Fn::GetAtt ... Arn against the deployed stack (what CloudFormation did)."""
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return [_resolve(n, session, endpoint_url, deployed) for n in node]
    if not isinstance(node, dict):
        return node
    if "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return sep.join(str(_resolve(p, session, endpoint_url, deployed)) for p in parts)
    if "Ref" in node:
        pseudo = {
            "AWS::Partition": "aws",
            "AWS::Region": deployed.region,
            "AWS::AccountId": DEFAULT_ACCOUNT_ID,
        }
        ref = node["Ref"]
        return pseudo.get(ref) or deployed.resources[ref][1]
    if "Fn::GetAtt" in node:
        logical, attr = node["Fn::GetAtt"]
        kind, physical = deployed.resources[logical]
        if attr == "Arn" and kind == "AWS::Lambda::Function":
            lam = session.client("lambda", endpoint_url=endpoint_url)
            return lam.get_function(FunctionName=physical)["Configuration"]["FunctionArn"]
        if attr == "Arn" and kind == "AWS::IAM::Role":
            return session.client("iam", endpoint_url=endpoint_url).get_role(RoleName=physical)["Role"]["Arn"]
        if attr == "QueueName" and kind == "AWS::SQS::Queue":
            return physical.rsplit("/", 1)[-1]  # a queue's physical id is its URL
        return physical
    return {k: _resolve(v, session, endpoint_url, deployed) for k, v in node.items()}


def _recreate_state_machines(
    session: boto3.session.Session, endpoint_url: str, template: dict[str, Any], deployed: DeployedStack
) -> bool:
    sfn = session.client("stepfunctions", endpoint_url=endpoint_url)
    done = False
    for logical, res in template.get("Resources", {}).items():
        if res.get("Type") != "AWS::StepFunctions::StateMachine" or logical not in deployed.resources:
            continue
        props = res.get("Properties", {})
        arn = deployed.resources[logical][1]
        sfn.create_state_machine(
            name=arn.rsplit(":", 1)[1],
            definition=_resolve(props["DefinitionString"], session, endpoint_url, deployed),
            roleArn=_resolve(props.get("RoleArn", ""), session, endpoint_url, deployed),
            type=props.get("StateMachineType", "STANDARD"),
        )
        done = True
    return done


def _apply_stage_variables(
    session: boto3.session.Session, endpoint_url: str, prepared: PreparedTemplate, deployed: DeployedStack
) -> None:
    if not prepared.stage_variables:
        return
    client = session.client("apigateway", endpoint_url=endpoint_url)
    resources = prepared.template["Resources"]
    for deployment_id, variables in prepared.stage_variables.items():
        props = resources[deployment_id]["Properties"]
        api_ref = props.get("RestApiId", {})
        api_logical = api_ref.get("Ref") if isinstance(api_ref, dict) else None
        if api_logical is None or api_logical not in deployed.resources:
            continue
        client.update_stage(
            restApiId=deployed.resources[api_logical][1],
            stageName=props["StageName"],
            patchOperations=[
                {"op": "replace", "path": f"/variables/{key}", "value": str(value)}
                for key, value in variables.items()
            ],
        )


def _apply_lambda_log_groups(template: dict[str, Any], deployed: DeployedStack) -> bool:
    """Fix `lambda-logging-config` on moto's in-process Lambda models."""
    changed = False
    for logical_id, res in template.get("Resources", {}).items():
        if res.get("Type") != "AWS::Lambda::Function" or logical_id not in deployed.resources:
            continue
        log_group = res.get("Properties", {}).get("LoggingConfig", {}).get("LogGroup")
        if isinstance(log_group, dict) and "Ref" in log_group and log_group["Ref"] in deployed.resources:
            group_name = deployed.resources[log_group["Ref"]][1]
        elif isinstance(log_group, str):
            group_name = log_group
        else:
            continue
        name = deployed.resources[logical_id][1]
        fn = moto_compat.lambda_function(DEFAULT_ACCOUNT_ID, deployed.region, name)
        fn.logs_group_name = group_name
        changed = True
    return changed


# -- verification ----------------------------------------------------------------------------------
def verify_stack(
    session: boto3.session.Session, endpoint_url: str, template: dict[str, Any], deployed: DeployedStack
) -> None:
    """Check that what the template declares really exists in moto; raise DeployError otherwise."""
    problems: list[str] = []
    declared = template.get("Resources", {})
    by_type: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for logical_id, res in declared.items():
        by_type.setdefault(res.get("Type", ""), []).append((logical_id, res.get("Properties", {})))

    def physical(logical_id: str) -> str | None:
        entry = deployed.resources.get(logical_id)
        return entry[1] if entry else None

    dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
    for logical_id, props in by_type.get("AWS::DynamoDB::Table", []):
        name = physical(logical_id)
        if not name:
            problems.append(f"table {logical_id} was not created")
            continue
        table = dynamodb.describe_table(TableName=name)["Table"]
        want = {g["IndexName"] for g in props.get("GlobalSecondaryIndexes", [])}
        have = {g["IndexName"] for g in table.get("GlobalSecondaryIndexes", [])}
        if want - have:
            problems.append(f"table {logical_id} lacks GSIs {sorted(want - have)}")

    lambda_client = session.client("lambda", endpoint_url=endpoint_url)
    for logical_id, props in by_type.get("AWS::Lambda::Function", []):
        name = physical(logical_id)
        if not name:
            problems.append(f"function {logical_id} was not created")
            continue
        config = lambda_client.get_function_configuration(FunctionName=name)
        if config.get("Handler") != props.get("Handler"):
            problems.append(f"function {logical_id} has handler {config.get('Handler')}")

    apigw = session.client("apigateway", endpoint_url=endpoint_url)
    want_methods = len(by_type.get("AWS::ApiGateway::Method", []))
    for logical_id, _props in by_type.get("AWS::ApiGateway::RestApi", []):
        api_id = physical(logical_id)
        if not api_id:
            problems.append(f"REST API {logical_id} was not created")
            continue
        items = apigw.get_resources(restApiId=api_id, limit=500, embed=["methods"])["items"]
        have_methods = sum(len(item.get("resourceMethods", {})) for item in items)
        if have_methods < want_methods:
            problems.append(f"REST API {logical_id} has {have_methods} of {want_methods} methods")
        if not apigw.get_stages(restApiId=api_id).get("item"):
            problems.append(f"REST API {logical_id} has no stage")
    problems += _verify_batch(session, endpoint_url, by_type, physical)
    if problems:
        raise DeployError("deployed stack does not match the template: " + "; ".join(problems))


def _verify_batch(
    session: boto3.session.Session,
    endpoint_url: str,
    by_type: dict[str, list[tuple[str, dict[str, Any]]]],
    physical: Any,
) -> list[str]:
    """Each declared compute environment and job queue exists by its name, ENABLED and VALID."""
    problems: list[str] = []
    declared = by_type.get("AWS::Batch::ComputeEnvironment", []) + by_type.get("AWS::Batch::JobQueue", [])
    if not declared:
        return problems
    client = session.client("batch", endpoint_url=endpoint_url)
    found = {
        **{
            c["computeEnvironmentArn"]: (c["computeEnvironmentName"], c.get("state"), c.get("status"))
            for c in client.describe_compute_environments()["computeEnvironments"]
        },
        **{
            q["jobQueueArn"]: (q["jobQueueName"], q.get("state"), q.get("status"))
            for q in client.describe_job_queues()["jobQueues"]
        },
    }
    for logical_id, props in declared:
        arn = physical(logical_id)
        name = props.get("ComputeEnvironmentName") or props.get("JobQueueName")
        got = found.get(arn or "")
        if got is None:
            problems.append(f"Batch resource {logical_id} was not created")
        elif (name and got[0] != name) or got[1:] != ("ENABLED", "VALID"):
            problems.append(f"Batch resource {logical_id} is {got}, expected {name} ENABLED VALID")
    return problems
