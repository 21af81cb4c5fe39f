"""The Lambda asset: exclusions and the opt-in local (pip) bundling, without touching the network."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_

from berth_infra import bundling
from berth_infra.stack import context_flag
from tests.infra.conftest import Synthesized

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOL_MODULES = ("localcloud", "cli", "sim", "bench", "loadtest", "demo", "client", "berth_tools")


def _asset_dir(outdir: Path) -> Path:
    (asset,) = [p for p in outdir.iterdir() if p.is_dir() and p.name.startswith("asset.")]
    return asset


def _modules(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix in {".py", ".yaml", ".csv"}}


def _assert_is_deployable_package(asset: Path) -> None:
    """The asset holds ``berth`` exactly as ``functions/berth`` is, and not one module of the tools."""
    assert sorted(p.name for p in asset.iterdir() if p.name == "berth_tools") == []
    berth = asset / "berth"
    assert (berth / "__init__.py").is_file()
    assert _modules(berth) == _modules(REPO_ROOT / "functions" / "berth")
    parts = {part.removesuffix(".py") for p in berth.rglob("*") for part in p.relative_to(berth).parts}
    assert not parts & set(TOOL_MODULES), parts & set(TOOL_MODULES)
    for module in ("domain/job_spec.py", "handlers/api.py", "dal/jobs.py", "scheduler/core.py"):
        assert (berth / module).is_file(), module
    assert not list(berth.rglob("__pycache__"))


def test_default_asset_is_the_deployable_package_whole(synthesized: Synthesized) -> None:
    _assert_is_deployable_package(_asset_dir(synthesized.outdir))


def test_runtime_pins_come_from_pyproject() -> None:
    reqs = bundling.runtime_requirements()
    assert reqs == bundling.RUNTIME_REQUIREMENTS
    names = {r.split("[")[0].split("==")[0].lower() for r in reqs}
    assert {"pydantic", "pyyaml", "aws-lambda-powertools", "pynamodb", "pydantic-settings"} <= names
    assert not names & {"typer", "rich", "moto", "tenacity", "werkzeug", "aws-cdk-lib"}


def test_bundled_asset_pip_installs_pins_then_copies_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bundling.subprocess, "run", fake_run)
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "BundleProbe")
    lambda_.Function(
        stack, "Fn", runtime=bundling.LAMBDA_RUNTIME, handler="x.handler", code=bundling.function_code(True)
    )
    app.synth()

    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "install"]
    for flag, value in (("--platform", "manylinux2014_x86_64"), ("--python-version", "3.11")):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--only-binary=:all:" in cmd
    assert set(bundling.RUNTIME_REQUIREMENTS) <= set(cmd)
    assert all("==" in req for req in bundling.RUNTIME_REQUIREMENTS)
    _assert_is_deployable_package(_asset_dir(tmp_path))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        (True, True),
        (False, False),
        ("true", True),
        ("True", True),
        ("false", False),
        ("0", False),
    ],
)
def test_context_flag(value: Any, expected: bool) -> None:
    app = App(context={} if value is None else {"berth:bundle": value})
    assert context_flag(app, "berth:bundle") is expected
