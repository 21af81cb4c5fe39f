"""CDK entry point: ``npx cdk synth`` (see cdk.json) runs ``python -m berth_infra.app``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from berth_infra.batch import BatchRegionStack
from berth_infra.cloud_config import cloud_regions, home_region
from berth_infra.stack import STACK_NAME, BerthStack

CDK_JSON = Path(__file__).resolve().parents[2] / "cdk.json"


def cdk_json_context() -> dict[str, Any]:
    """The context (feature flags, ``berth:*`` defaults) that the CDK CLI would pass from cdk.json."""
    context: dict[str, Any] = json.loads(CDK_JSON.read_text())["context"]
    return context


def build_app(context: dict[str, object] | None = None, outdir: str | None = None) -> tuple[App, BerthStack]:
    """The app with its one stack and the cdk-nag AwsSolutions pack attached as a validation plugin.

    Synthesis fails on any unacknowledged AwsSolutions finding. No AWS credentials are needed: the
    stack is environment-agnostic unless ``berth:account``/``berth:region`` context (or the CLI's
    ``CDK_DEFAULT_ACCOUNT``/``CDK_DEFAULT_REGION`` with ``berth:useCliEnv``) pins it.
    """
    app = App(context=context, outdir=outdir)
    account = app.node.try_get_context("berth:account")
    region = app.node.try_get_context("berth:region")
    if app.node.try_get_context("berth:useCliEnv"):
        account = account or os.environ.get("CDK_DEFAULT_ACCOUNT")
        region = region or os.environ.get("CDK_DEFAULT_REGION")
    env = Environment(account=account, region=region) if account or region else None
    stack = BerthStack(app, STACK_NAME, env=env)
    # One Batch stack per cloud region (Berth-batch-<region>, deployed in that region); names are
    # deterministic, so they refer to the home stack's bus by name, not by a cross-stack reference.
    home = region or home_region(app)
    for cloud_region in cloud_regions(app):
        BatchRegionStack(
            app,
            cloud_region.stack_name,
            cloud_region=cloud_region,
            home_region=home,
            home_bus_name=f"berth-{stack.stack_name}",
            env=Environment(account=account, region=cloud_region.region),
        )
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))
    return app, stack


def batch_region_stacks(app: App) -> list[BatchRegionStack]:
    """The app's regional Batch stacks, in configuration order."""
    return [child for child in app.node.children if isinstance(child, BatchRegionStack)]


def main() -> None:
    app, _ = build_app()
    app.synth()


if __name__ == "__main__":
    main()
