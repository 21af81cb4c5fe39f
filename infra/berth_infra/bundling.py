"""The Lambda code asset: ``functions/`` minus what only runs on a laptop, plus its dependencies.

By default (context ``berth:bundle`` false) the asset is the plain source tree: synth is offline and
fast, and the local cloud runs the handlers in-process with the virtualenv's packages. With
``-c berth:bundle=true`` the asset is bundled locally (no docker): ``pip install --target`` of the
pinned runtime dependencies as manylinux wheels for the Lambda's Python and architecture, then the
source tree on top. That needs PyPI (or a mirror configured for pip) and is what ``cdk deploy`` uses.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, ILocalBundling
from aws_cdk import aws_lambda as lambda_

REPO_ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS_DIR = REPO_ROOT / "functions"

#: What the control plane imports at runtime. Keep in step with the ``control-plane`` extra and core
#: dependencies in pyproject.toml. boto3/botocore are pinned too: aws-xray-sdk pulls botocore into the
#: bundle, where it would shadow the runtime's copy; pinning both keeps the pair consistent and equal
#: to what the tests run against.
RUNTIME_REQUIREMENTS: tuple[str, ...] = (
    "aws-lambda-powertools[tracer,validation]==3.37.0",
    "pynamodb==6.1.0",
    "pydantic==2.14.3",
    "pydantic-settings==2.16.3",
    "PyYAML==6.0.3",
    "boto3==1.44.5",
    "botocore==1.44.5",
)

LAMBDA_RUNTIME = lambda_.Runtime.PYTHON_3_11
LAMBDA_ARCHITECTURE = lambda_.Architecture.X86_64
PIP_PLATFORM = "manylinux2014_x86_64"
PIP_PYTHON_VERSION = "3.11"

#: Never shipped to Lambda: laptop-only packages (local cloud, CLI, simulator, benchmarks, client-side
#: load tests, demo),
#: tests and build litter. Glob patterns relative to ``functions/``.
ASSET_EXCLUDES: tuple[str, ...] = (
    "**/__pycache__",
    "**/*.pyc",
    "berth/localcloud",
    "berth/cli",
    "berth/sim",
    "berth/bench",
    "berth/loadtest",
    "berth/demo*",
    "tests",
    "**/tests",
    "*.egg-info",
)

_IGNORE_NAMES = ("__pycache__", "*.pyc", "tests", "*.egg-info")
_IGNORE_TOP = ("localcloud", "cli", "sim", "bench", "loadtest")


def _ignore(directory: str, names: list[str]) -> set[str]:
    ignored = set(shutil.ignore_patterns(*_IGNORE_NAMES)(directory, names))
    if Path(directory).resolve() == (FUNCTIONS_DIR / "berth").resolve():
        ignored |= {n for n in names if n in _IGNORE_TOP or n.startswith("demo")}
    return ignored


def copy_sources(output_dir: Path) -> None:
    """Copy ``functions/`` into ``output_dir`` with the same exclusions as the unbundled asset."""
    shutil.copytree(FUNCTIONS_DIR, output_dir, ignore=_ignore, dirs_exist_ok=True)


@jsii.implements(ILocalBundling)
class PipLocalBundling:
    """Bundles on the host with pip; CDK calls ``try_bundle`` before it would fall back to docker."""

    def try_bundle(self, output_dir: str, *args: Any, **kwargs: Any) -> bool:
        out = Path(output_dir)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-compile",
                "--target",
                str(out),
                "--platform",
                PIP_PLATFORM,
                "--implementation",
                "cp",
                "--python-version",
                PIP_PYTHON_VERSION,
                "--only-binary=:all:",
                *RUNTIME_REQUIREMENTS,
            ],
            check=True,
        )
        copy_sources(out)
        return True


def function_code(bundle: bool) -> lambda_.Code:
    """The ``ApiFunction`` code asset; ``bundle`` selects the deployable, dependency-carrying bundle."""
    if not bundle:
        return lambda_.Code.from_asset(str(FUNCTIONS_DIR), exclude=list(ASSET_EXCLUDES))
    return lambda_.Code.from_asset(
        str(FUNCTIONS_DIR),
        exclude=list(ASSET_EXCLUDES),
        # The source hash covers the sources and these options; the pins below are part of them.
        asset_hash_type=AssetHashType.SOURCE,
        bundling=BundlingOptions(
            # Only used if local bundling declined; ours never does (it raises on failure instead).
            image=LAMBDA_RUNTIME.bundling_image,
            local=PipLocalBundling(),
            environment={"BERTH_REQUIREMENTS": " ".join(RUNTIME_REQUIREMENTS)},
        ),
    )
