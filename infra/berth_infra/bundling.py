"""The Lambda code asset: the deployable package ``berth`` (``functions/``) taken whole, plus its pins.

``functions/`` holds only what is deployed (domain, use cases, store adapters, handlers, scheduler
core, pricing); everything that runs on a laptop lives in ``tools/berth_tools`` and never reaches this
asset. The pins are read from ``pyproject.toml`` (the core dependencies and the ``control-plane``
extra), so there is one list of what the Lambda runs.

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
import tomllib
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, ILocalBundling
from aws_cdk import aws_lambda as lambda_

REPO_ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS_DIR = REPO_ROOT / "functions"
PYPROJECT = REPO_ROOT / "pyproject.toml"

#: The extra that names the control plane's runtime dependencies beside the core ones.
RUNTIME_EXTRA = "control-plane"


def runtime_requirements(pyproject: Path = PYPROJECT) -> tuple[str, ...]:
    """The Lambda's pins: ``[project] dependencies`` plus the ``control-plane`` extra, deduplicated."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = [*project["dependencies"], *project["optional-dependencies"][RUNTIME_EXTRA]]
    return tuple(dict.fromkeys(reqs))


RUNTIME_REQUIREMENTS: tuple[str, ...] = runtime_requirements()

LAMBDA_RUNTIME = lambda_.Runtime.PYTHON_3_11
LAMBDA_ARCHITECTURE = lambda_.Architecture.X86_64
PIP_PLATFORM = "manylinux2014_x86_64"
PIP_PYTHON_VERSION = "3.11"

#: Build litter only: the package itself is taken whole.
ASSET_EXCLUDES: tuple[str, ...] = ("**/__pycache__", "**/*.pyc", "*.egg-info")

_IGNORE_NAMES = ("__pycache__", "*.pyc", "*.egg-info")


def copy_sources(output_dir: Path) -> None:
    """Copy ``functions/`` into ``output_dir`` with the same exclusions as the unbundled asset."""
    shutil.copytree(
        FUNCTIONS_DIR, output_dir, ignore=shutil.ignore_patterns(*_IGNORE_NAMES), dirs_exist_ok=True
    )


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
