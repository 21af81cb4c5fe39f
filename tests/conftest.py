"""Suite-wide settings. Property tests have no per-example deadline: this runs on shared 2-core
machines, where timing is noise; their speed is watched by the suite's total time instead.

Under pytest-xdist (`make test` runs ``-n 2 --dist loadgroup``) every test is grouped so that what
shares an expensive fixture runs in one worker: each end-to-end module starts its own `berth local up`
and they all share a session-scoped one, so `tests/e2e` is one group (one local cloud with agents at a
time); `tests/infra` shares one synthesised app, so it is one group; every other module is a group of
its own (its module-scoped local cloud or moto is built once). The end-to-end tests spend most of their
time waiting on the local cloud, so the other worker runs the rest of the suite beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("berth", deadline=None, print_blob=True)
settings.load_profile("berth")

TESTS = Path(__file__).resolve().parent
WHOLE_DIRECTORY_GROUPS = ("e2e", "infra")


def xdist_group_of(path: Path) -> str:
    """The xdist group of the test module at `path` (tests/e2e and tests/infra are one group each)."""
    relative = path.resolve().relative_to(TESTS)
    if relative.parts[0] in WHOLE_DIRECTORY_GROUPS:
        return relative.parts[0]
    return relative.with_suffix("").as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(Path(str(item.path)))))
