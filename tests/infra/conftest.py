"""One in-process synth of the Berth app per test session (synth with cdk-nag takes several seconds)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

from aws_cdk.assertions import Template

from berth_infra.app import batch_region_stacks, build_app, cdk_json_context
from berth_infra.batch import BatchRegionStack
from berth_infra.stack import BerthStack


@dataclass
class Synthesized:
    stack: BerthStack
    template: Template
    template_path: Path
    outdir: Path
    #: region -> the Berth-batch-<region> stack and its template (path: outdir/<stack>.template.json)
    batch: dict[str, tuple[BatchRegionStack, Template]] = field(default_factory=dict)

    @cached_property
    def json(self) -> dict[str, Any]:
        """The template as JSON, read once: ``Template.to_json`` is a round trip through jsii (the
        whole template serialised each call), and the permission tests read it per statement."""
        data: dict[str, Any] = dict(self.template.to_json())
        return data

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.json["Resources"].items() if v["Type"] == type_}


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesized]:
    outdir = tmp_path_factory.mktemp("cdk.out")
    # The same context the CLI passes from cdk.json (feature flags matter), offline (no bundling).
    app, stack = build_app(context=cdk_json_context(), outdir=str(outdir))
    # Raises if the cdk-nag plugin (a policy validation plugin) reports any unacknowledged finding.
    assembly = app.synth()
    template_path = Path(assembly.get_stack_by_name("Berth").template_full_path)
    # From the assembly just written: Template.from_stack would synthesise the app (and cdk-nag) again.
    batch = {
        b.cloud_region.region: (
            b,
            Template.from_json(load_json(Path(assembly.get_stack_by_name(b.stack_name).template_full_path))),
        )
        for b in batch_region_stacks(app)
    }
    yield Synthesized(stack, Template.from_stack(stack), template_path, outdir, batch)


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())
