"""Fixtures for the local cloud's functional tests: one LocalCloud per module, on a small CDK template.

`fixtures/berth_mini.template.json` is a real `cdk synth` output of the same shape as the Berth stack
(tables with GSIs, one Lambda, a REST API with AWS_IAM methods on the Berth routes, stage, access log
group, bootstrap parameter and rule) whose function runs `localcloud_fake_handler`, an echo handler.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth_tools.localcloud.cloud import LocalCloud, load_template

HERE = Path(__file__).parent
REPO = HERE.parents[2]
MINI_TEMPLATE = HERE / "fixtures" / "berth_mini.template.json"
REAL_TEMPLATE = REPO / "cdk.out" / "Berth.template.json"

if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # makes `localcloud_fake_handler` importable as the Lambda handler


@pytest.fixture(scope="session")
def real_template() -> Path:
    """The synthesised template (and its Berth-batch-<region> stacks): a clear error, never a skip,
    when `cdk synth` has not run (`make test-functional`, `make test-e2e` and `make test` run it)."""
    missing = [] if REAL_TEMPLATE.exists() else [REAL_TEMPLATE.name]
    if not list(REAL_TEMPLATE.parent.glob("Berth-batch-*.template.json")):
        missing.append("Berth-batch-<region>.template.json")
    if missing:
        pytest.fail(
            f"{REAL_TEMPLATE.parent} has no {' and no '.join(missing)}: run `make synth` "
            "(or `make test-functional`, which synthesises first)",
            pytrace=False,
        )
    return REAL_TEMPLATE


@pytest.fixture(scope="module")
def seeded_members() -> list[tuple[str, str, str]]:
    return []


@pytest.fixture(scope="module")
def cloud(
    tmp_path_factory: pytest.TempPathFactory, seeded_members: list[tuple[str, str, str]]
) -> Iterator[LocalCloud]:
    state = tmp_path_factory.mktemp("state")
    with LocalCloud(
        template=load_template(MINI_TEMPLATE),
        state_dir=state,
        seed_writer=lambda arn, tenant, role, _unique_id: seeded_members.append((arn, tenant, role)),
    ) as local:
        yield local
