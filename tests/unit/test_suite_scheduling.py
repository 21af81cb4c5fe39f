"""How `make test` deals the suite out to its two xdist workers (tests/conftest.py)."""

from __future__ import annotations

from tests.conftest import work_unit_of


def test_end_to_end_and_infra_tests_are_one_unit_each_and_other_modules_their_own() -> None:
    assert work_unit_of("tests/e2e/test_jobs_api.py::test_cli_submit") == "e2e"
    assert work_unit_of("tests/e2e/test_first_hour.py::test_readme[relative]") == "e2e"
    assert work_unit_of("tests/infra/test_infra_stack.py::test_x") == "infra"
    assert work_unit_of("tests/unit/test_cost.py::test_a[p::q]") == "tests/unit/test_cost.py"
    assert work_unit_of("tests/functional/localcloud/test_load.py::test_y") == (
        "tests/functional/localcloud/test_load.py"
    )


def test_the_short_chaos_run_is_a_unit_of_its_own() -> None:
    # it brings its own local cloud and is long: the other worker takes it beside the e2e unit
    node = "tests/e2e/test_chaos_short.py::test_a_short_chaos_run_loses_nothing_and_runs_nothing_twice"
    assert work_unit_of(node) == "tests/e2e/test_chaos_short.py"
    assert work_unit_of("tests/e2e/test_console_e2e.py::test_the_console_in_a_browser") == "e2e"
