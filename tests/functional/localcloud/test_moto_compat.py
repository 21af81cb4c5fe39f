"""moto_compat: the local cloud's private moto surfaces are checked at start-up and fail loudly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import moto
import pytest
from moto.awslambda.models import LambdaFunction
from moto.dynamodb.models import DynamoDBBackend

from berth_tools.localcloud import dynamodb_isolation, lambda_runtime, moto_compat
from berth_tools.localcloud.moto_server import MotoServer


@pytest.fixture
def recheck(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Forget that this process already passed the check, so the next call checks again."""
    monkeypatch.setattr(moto_compat, "_checked", False)
    yield


def test_the_installed_moto_passes() -> None:
    assert moto.__version__ == moto_compat.MOTO_VERSION == "5.2.5"
    assert moto_compat.problems() == []
    moto_compat.check(force=True)
    for surface in moto_compat.SURFACES:
        assert moto_compat.resolve(surface.path) is not None, surface.path


def test_every_module_gets_moto_through_the_compat_module() -> None:
    """No other local-cloud module imports moto at run time (type-only imports are fine)."""
    import ast
    from pathlib import Path

    package = Path(moto_compat.__file__).parent
    for source in sorted(package.glob("*.py")):
        if source.name == "moto_compat.py":
            continue
        tree = ast.parse(source.read_text())
        guarded = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "moto":
                pytest.fail(f"{source.name} imports {node.module} directly")
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "moto" for a in node.names):
                pytest.fail(f"{source.name} imports moto directly")


def test_a_wrong_version_fails_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moto, "__version__", "5.3.0")
    with pytest.raises(moto_compat.MotoCompatError) as err:
        moto_compat.check(force=True)
    assert "moto 5.3.0 is installed" in str(err.value)
    assert "moto 5.2.5" in str(err.value)


def test_a_missing_patch_target_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(LambdaFunction, "_invoke_lambda")
    with pytest.raises(moto_compat.MotoCompatError) as err:
        moto_compat.check(force=True)
    assert "moto.awslambda.models:LambdaFunction._invoke_lambda: _invoke_lambda is missing" in str(err.value)


def test_a_changed_signature_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def invoke(self: Any, payload: str, headers: Any) -> bytes:
        return b""

    monkeypatch.setattr(LambdaFunction, "invoke", invoke)
    problems = moto_compat.problems()
    assert len(problems) == 1
    assert problems[0].startswith("moto.awslambda.models:LambdaFunction.invoke: parameters are (payload")


def test_a_missing_module_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        moto_compat,
        "SURFACES",
        (*moto_compat.SURFACES, moto_compat.Surface("moto.nosuchservice.models:Backend", "read", "test")),
    )
    assert moto_compat.problems() == [
        "moto.nosuchservice.models:Backend: module moto.nosuchservice.models cannot be imported "
        "(No module named 'moto.nosuchservice')"
    ]


def test_dynamodb_isolation_no_longer_skips_a_missing_write_method(
    monkeypatch: pytest.MonkeyPatch, recheck: None
) -> None:
    monkeypatch.delattr(DynamoDBBackend, "batch_write_item")
    with pytest.raises(moto_compat.MotoCompatError, match=r"DynamoDBBackend\.batch_write_item"):
        dynamodb_isolation.install()


def test_lambda_runtime_refuses_to_install_on_a_changed_moto(
    monkeypatch: pytest.MonkeyPatch, recheck: None
) -> None:
    monkeypatch.setattr(moto, "__version__", "6.0.0")
    runtime = lambda_runtime.ProcessLambdaRuntime(endpoint_url="http://127.0.0.1:1")
    with pytest.raises(moto_compat.MotoCompatError, match=r"moto 6\.0\.0"):
        lambda_runtime.install(runtime)
    assert runtime not in lambda_runtime._ACTIVE


def test_the_server_fails_at_start_up_before_serving(monkeypatch: pytest.MonkeyPatch, recheck: None) -> None:
    monkeypatch.delattr(DynamoDBBackend, "transact_write_items")
    server = MotoServer()
    with pytest.raises(moto_compat.MotoCompatError, match=r"DynamoDBBackend\.transact_write_items"):
        server.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port


def test_an_undeclared_surface_is_refused() -> None:
    with pytest.raises(moto_compat.MotoCompatError, match="not declared"):
        moto_compat.surface("moto.dynamodb.models:DynamoDBBackend.list_tables")


def test_weak_instance_tracking_keeps_only_live_models() -> None:
    class Model:
        pass

    tracked = moto_compat.WeakInstances()
    alive = Model()
    tracked.append(alive)
    tracked.append(Model())  # garbage at once
    assert list(tracked) == [alive]


def test_the_p3_sizes_aws_sells_are_valid_compute_environment_types_while_installed() -> None:
    from moto import mock_aws
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    from berth_tools.localcloud import moto_faithful

    # moto 5.2.5's table lacks them (a local cloud started earlier in this process may have added them)
    before = {n for n in moto_faithful.MISSING_INSTANCE_TYPES if n in INSTANCE_TYPES}
    undo = moto_faithful.install()
    try:
        sizes = {n: INSTANCE_TYPES[n] for n in ("p3.2xlarge", "p3.8xlarge", "p3.16xlarge")}
        assert [s["VCpuInfo"]["DefaultVCpus"] for s in sizes.values()] == [8, 32, 64]
        assert [s["GpuInfo"]["Gpus"][0]["Count"] for s in sizes.values()] == [1, 4, 8]
        assert {s["GpuInfo"]["Gpus"][0]["Name"] for s in sizes.values()} == {"V100"}
        with mock_aws():
            ec2 = boto3.client("ec2", region_name="us-east-1")
            subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
            iam = boto3.client("iam", region_name="us-east-1")
            role = iam.create_role(RoleName="svc", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            iam.create_instance_profile(InstanceProfileName="svc")
            iam.add_role_to_instance_profile(InstanceProfileName="svc", RoleName="svc")
            instance_role = iam.get_instance_profile(InstanceProfileName="svc")["InstanceProfile"]["Arn"]
            ce = boto3.client("batch", region_name="us-east-1").create_compute_environment(
                computeEnvironmentName="v100",
                type="MANAGED",
                serviceRole=role,
                computeResources={
                    "type": "EC2",
                    "minvCpus": 0,
                    "maxvCpus": 64,
                    "instanceTypes": list(sizes),
                    "subnets": [subnet],
                    "securityGroupIds": [ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"]],
                    "instanceRole": instance_role,
                },
            )
            assert ce["computeEnvironmentName"] == "v100"
    finally:
        undo()
    assert {n for n in moto_faithful.MISSING_INSTANCE_TYPES if n in INSTANCE_TYPES} == before
