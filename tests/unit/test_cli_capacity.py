"""``berth capacity``'s table: one row per host, with how its agent contains jobs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from berth_tools.cli import fleet_cmd


@pytest.fixture(autouse=True)
def wide_console() -> Iterator[None]:
    """A terminal wide enough that no header wraps (what is shown, not how it folds)."""
    before = fleet_cmd.console.width
    fleet_cmd.console.width = 200
    yield
    fleet_cmd.console.width = before


def _capacity(**host: Any) -> dict[str, Any]:
    row = {
        "host_id": "h1",
        "pool": "lab",
        "gpu_type": "A100",
        "gpus": 2,
        "free_gpus": 1,
        "alive": True,
        "attempts": ["j-1#1"],
        **host,
    }
    return {
        "totals": {"hosts": 1, "gpus": 2, "free_gpus": 1, "used_gpus": 1, "unavailable_gpus": 0},
        "as_of": "now",
        "pools": [],
        "hosts": [row],
        "cloud": {"regions": []},
    }


def test_the_hosts_table_shows_the_containment_mode() -> None:
    with fleet_cmd.console.capture() as out:
        fleet_cmd._capacity_table(_capacity(containment="process-group"))
    text = out.get()
    assert "CONTAINMENT" in text and "process-group" in text


def test_a_host_whose_agent_does_not_say_shows_a_dash() -> None:
    with fleet_cmd.console.capture() as out:
        fleet_cmd._capacity_table(_capacity(containment=None))
    row = next(line for line in out.get().splitlines() if "h1" in line)
    assert "process-group" not in row and "cgroup-v2" not in row and " - " in row


def test_the_hosts_table_shows_whether_gpus_are_isolated() -> None:
    with fleet_cmd.console.capture() as out:
        fleet_cmd._capacity_table(_capacity(labels={"berth/gpu-isolation": "none"}))
    row = next(line for line in out.get().splitlines() if "h1" in line)
    assert "GPU ISOLATION" in out.get() and " none " in row
