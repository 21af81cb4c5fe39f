"""cdk-nag (AwsSolutions) and cfn-lint on the synthesized template."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import App, RemovalPolicy, Stack, Validations
from aws_cdk import aws_dynamodb as ddb
from cdk_nag import AwsSolutionsChecks

from berth_infra.nag import berth_acknowledgments
from tests.infra.conftest import Synthesized, load_json

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_cdk_nag_reports_nothing_unacknowledged(synthesized: Synthesized) -> None:
    # The session fixture's app.synth() would have raised on any finding; the report confirms it.
    report = load_json(synthesized.outdir / "validation-report.json")
    assert report["pluginReports"] == []


def test_cdk_nag_is_wired_and_fails_synth_on_a_finding(tmp_path: Path) -> None:
    """Guards the plumbing: the same plugin registration rejects a non-compliant stack."""
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "Bad")
    ddb.Table(
        stack,
        "NoPitr",
        partition_key=ddb.Attribute(name="pk", type=ddb.AttributeType.STRING),
        removal_policy=RemovalPolicy.DESTROY,
    )
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()


def test_every_acknowledgment_has_a_specific_reason(synthesized: Synthesized) -> None:
    acks = berth_acknowledgments(synthesized.stack)
    assert acks
    for ack in acks:
        assert ack.rule_id.startswith("AwsSolutions-")
        assert len(ack.reason) >= 60, ack
    # No blanket acknowledgment on the stack itself: each one is scoped to a construct.
    assert all(ack.scope is not synthesized.stack for ack in acks)


def test_documented_acknowledgments_match_code(synthesized: Synthesized) -> None:
    doc = (REPO_ROOT / "docs" / "infrastructure.md").read_text()
    for ack in berth_acknowledgments(synthesized.stack):
        rule = ack.rule_id.split("[")[0]
        assert rule in doc, f"{rule} is acknowledged in code but not documented in docs/infrastructure.md"


def test_cfn_lint_passes(synthesized: Synthesized) -> None:
    # Run from the repo root so .cfnlintrc (with its justified ignores) applies.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), str(synthesized.template_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
