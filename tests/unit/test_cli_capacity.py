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


def test_degraded_gpus_are_listed_with_their_fault() -> None:
    fault = {
        "gpu_id": "GPU-h1-1",
        "index": 1,
        "severity": "fatal",
        "kind": "xid",
        "xid": 79,
        "reason": "XID 79 (GPU has fallen off the bus)",
        "fault_id": "f1",
        "at": "2026-12-03T17:00:00+00:00",
    }
    with fleet_cmd.console.capture() as out:
        fleet_cmd._capacity_table(_capacity(degraded=True, gpu_faults=[fault]))
    text = out.get()
    assert "GPU faults" in text
    row = next(line for line in text.splitlines() if "GPU-h1-1" in line)
    assert "1 (GPU-h1-1)" in row and "out of placement" in row and "XID 79" in row
    with fleet_cmd.console.capture() as out:
        fleet_cmd._capacity_table(_capacity())
    assert "GPU faults" not in out.get()  # a healthy fleet: no such table


def test_gpu_clear_calls_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from berth_tools.cli.main import app

    calls: list[tuple[str, str]] = []

    class Client:
        def clear_gpu_fault(self, host: str, gpu: str) -> dict[str, Any]:
            calls.append((host, gpu))
            return {"host_id": host, "gpu_id": "GPU-h1-1", "cleared": "XID 79 (x)", "fault_id": "f1"}

    monkeypatch.setattr(fleet_cmd, "client_for", lambda url, profile: Client())
    result = CliRunner().invoke(app, ["gpu-clear", "h1", "1"])
    assert result.exit_code == 0, result.output
    assert calls == [("h1", "1")] and "cleared XID 79" in result.output
