"""CloudFormation deploy (fixes, verification), seeding and the state directory."""

from __future__ import annotations

import json
import stat

import pytest

from berth_tools.localcloud import cloudformation_deploy
from berth_tools.localcloud.cloud import LocalCloud
from berth_tools.localcloud.state_dir import parse_exports

from .conftest import MINI_TEMPLATE


def test_prepare_template_folds_the_stage_into_the_deployment() -> None:
    template = json.loads(MINI_TEMPLATE.read_text())
    prepared = cloudformation_deploy.prepare_template(template)
    resources = prepared.template["Resources"]
    assert not [r for r in resources.values() if r["Type"] == "AWS::ApiGateway::Stage"]
    deployments = [r for r in resources.values() if r["Type"] == "AWS::ApiGateway::Deployment"]
    assert [d["Properties"]["StageName"] for d in deployments] == ["v1"]
    assert '"/", "v1", "/"' in json.dumps(prepared.template["Outputs"]["ApiUrl"])
    assert "api-stage" in prepared.applied_fixes
    assert "AWS::ApiGateway::Account" in prepared.skipped_types
    # the input is not modified
    assert any(r["Type"] == "AWS::ApiGateway::Stage" for r in template["Resources"].values())


def test_deployed_stack_has_the_declared_resources(cloud: LocalCloud) -> None:
    stack = cloud.stack
    assert stack is not None
    assert set(stack.outputs) >= {
        "ApiUrl",
        "ApiId",
        "JobsTableName",
        "JobEventsTableName",
        "TenantsTableName",
        "IdempotencyTableName",
        "ApiFunctionName",
    }
    assert stack.outputs["ApiUrl"].endswith("/v1/")
    assert {"bootstrap-version-parameter", "asset-bucket", "api-stage", "lambda-logging-config"} <= set(
        stack.applied_fixes
    )
    ddb = cloud.session().client("dynamodb", endpoint_url=cloud.endpoint_url)
    jobs = ddb.describe_table(TableName=stack.outputs["JobsTableName"])["Table"]
    assert {g["IndexName"] for g in jobs["GlobalSecondaryIndexes"]} == {"by_tenant", "by_tenant_status"}
    # verify_stack raises on any mismatch; it already ran during start(), run it again explicitly
    cloudformation_deploy.verify_stack(
        cloud.session(), cloud.endpoint_url, json.loads(MINI_TEMPLATE.read_text()), stack
    )


def test_users_are_seeded_with_their_tenants(
    cloud: LocalCloud, seeded_members: list[tuple[str, str, str]]
) -> None:
    assert seeded_members == [
        ("arn:aws:iam::123456789012:user/alice", "vision", "member"),
        ("arn:aws:iam::123456789012:user/bob", "nlp", "member"),
        ("arn:aws:iam::123456789012:user/admin", "platform", "admin"),
    ]
    iam = cloud.session().client("iam", endpoint_url=cloud.endpoint_url)
    policies = iam.list_attached_user_policies(UserName="bob")["AttachedPolicies"]
    assert [p["PolicyName"] for p in policies] == ["BerthApiInvoke"]


def test_state_dir_files(cloud: LocalCloud) -> None:
    state = cloud.state_dir
    assert state is not None
    env = parse_exports((state / "env").read_text())
    assert env == {
        "BERTH_API_URL": cloud.api_url,
        "AWS_CONFIG_FILE": str((state / "aws" / "config").resolve()),
        "AWS_SHARED_CREDENTIALS_FILE": str((state / "aws" / "credentials").resolve()),
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": cloud.endpoint_url,
        "BERTH_LOCAL_STATE_DIR": str(state.resolve()),
    }
    for path in (state / "env", state / "aws" / "config", state / "aws" / "credentials"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (state, state / "aws"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    config = (state / "aws" / "config").read_text()
    assert "[profile alice]" in config and "[profile bob]" in config and "[profile admin]" in config
    credentials = (state / "aws" / "credentials").read_text()
    assert cloud.profiles["bob"].secret_access_key in credentials


def test_boto3_profiles_from_the_state_dir_work(cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    state = cloud.state_dir
    assert state is not None
    monkeypatch.setenv("AWS_CONFIG_FILE", str(state / "aws" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(state / "aws" / "credentials"))
    identity = boto3.session.Session(profile_name="bob").client("sts").get_caller_identity()
    assert identity["Arn"].endswith(":user/bob")
