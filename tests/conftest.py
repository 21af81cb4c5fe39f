"""Suite-wide settings. Property tests have no per-example deadline: this runs on shared 2-core
machines, where timing is noise; their speed is watched by the suite's total time instead.

Under pytest-xdist (`make test` runs ``-n 2``) the work is dealt out by `SuiteScheduling`: what
shares an expensive fixture runs in one worker. Each end-to-end module starts its own `berth local up`
and they all share a session-scoped one, so `tests/e2e` is one unit (one local cloud with agents at a
time, in the order the suite lists them), except the short chaos run, a unit of its own (it is long and
brings its own local cloud, so the other worker takes it); `tests/infra` shares one synthesised app, so
it is one unit; every other module is a unit of its own (its module-scoped local cloud or moto is built
once). The
end-to-end tests spend most of their time waiting on their local cloud, so the other worker runs the
rest of the suite beside them. (xdist's own ``loadgroup`` cannot do this on pytest 9: the group it
appends to a node id never reaches the scheduler.)"""

from __future__ import annotations

from typing import Any

from hypothesis import settings

settings.register_profile("berth", deadline=None, print_blob=True)
settings.load_profile("berth")

#: Directories under tests/ whose modules all go to one worker, one after the other.
WHOLE_DIRECTORY_UNITS = ("e2e", "infra")
#: End-to-end modules that are units of their own: each starts and stops its own local cloud (the
#: session's is not theirs to share) and is long, so the other worker takes it while the e2e unit,
#: the suite's longest path, runs the rest. Measured: `docs/local-cloud.md`, "The test suite".
OWN_UNIT_MODULES = ("tests/e2e/test_chaos_short.py",)


def work_unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``e2e`` or ``infra`` for the tests under those
    directories (except the modules of ``OWN_UNIT_MODULES``), else its module
    (``tests/unit/test_cost.py``)."""
    module = nodeid.split("::", 1)[0]
    parts = module.split("/")
    if module in OWN_UNIT_MODULES:
        return module
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in WHOLE_DIRECTORY_UNITS:
        return parts[1]
    return module


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

    return SuiteScheduling(config, log)
