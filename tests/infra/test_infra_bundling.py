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

LAPTOP_ONLY = {"localcloud", "cli", "sim", "bench", "loadtest"}


def _laptop_only(name: str) -> bool:
    return name in LAPTOP_ONLY or name.startswith("demo")


def _asset_dir(outdir: Path) -> Path:
    (asset,) = [p for p in outdir.iterdir() if p.is_dir() and p.name.startswith("asset.")]
    return asset


def test_default_asset_is_source_without_laptop_only_packages(synthesized: Synthesized) -> None:
    berth = _asset_dir(synthesized.outdir) / "berth"
    assert (berth / "__init__.py").is_file()
    names = {p.name for p in berth.iterdir()}
    assert not any(_laptop_only(n) for n in names), names
    assert not list(berth.rglob("__pycache__"))


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
    berth = _asset_dir(tmp_path) / "berth"
    assert (berth / "__init__.py").is_file()
    assert not any(_laptop_only(p.name) for p in berth.iterdir())


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
