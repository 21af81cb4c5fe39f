"""The Makefile's dependency graph (read from `make -p`, nothing run): files depend on files, so a
second `make up` with nothing changed does not synthesise again; every test target makes what its
tests need."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = "cdk.out/Berth.template.json"


@pytest.fixture(scope="module")
def rules() -> dict[str, list[str]]:
    make = shutil.which("make")
    assert make is not None, "GNU make is needed (the README's first commands are make targets)"
    # -p prints the database, -q runs nothing; the goal is a file that is always there
    out = subprocess.run(
        [make, "-p", "-q", "-f", "Makefile", "Makefile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        target, sep, prereqs = line.partition(":")
        if (
            sep
            and not line.startswith(("#", "\t", " "))
            and "=" not in target
            and not prereqs.startswith("=")
        ):
            found.setdefault(target.strip(), []).extend(prereqs.split())
    return found


def test_the_template_depends_on_files_only(rules: dict[str, list[str]]) -> None:
    phony = set(rules[".PHONY"])
    prereqs = rules[TEMPLATE]
    assert not phony & set(prereqs), f"{TEMPLATE} depends on phony targets {phony & set(prereqs)}"
    assert {".venv/.installed", "node_modules/.installed", "cdk.json", "pyproject.toml"} <= set(prereqs)
    assert "infra/berth_infra/app.py" in prereqs and "functions/berth/__init__.py" in prereqs


@pytest.mark.parametrize("target", ["test", "test-functional", "test-infra", "test-e2e", "demo", "up"])
def test_targets_that_deploy_the_template_synthesise_it_first(
    rules: dict[str, list[str]], target: str
) -> None:
    assert "synth" in rules[target], f"make {target} does not depend on synth: {rules[target]}"
    assert rules["synth"] == [TEMPLATE]
