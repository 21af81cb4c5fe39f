"""``berth circuits [--reset REGION[/INSTANCE_TYPE]]`` and ``berth admit`` over a fake client: what
they ask the API and what they print."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from berth_tools.cli import fleet_cmd
from berth_tools.cli.main import app

SHOWN = {
    "as_of": "2026-12-03T12:00:00+00:00",
    "enabled": True,
    "rule": {"failure_threshold": 3, "window_s": 600.0, "open_s": 900.0, "half_open_probes": 1},
    "circuits": [
        {
            "region": "us-east-1",
            "instance_type": "p5.48xlarge",
            "state": "open",
            "effective_state": "open",
            "recent_failures": 3,
            "last_failure_at": "2026-12-03T11:59:00+00:00",
            "last_success_at": None,
        }
    ],
}


class Client:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def admit_host(self, host_id: str, gpu_type: str, gpus: int) -> Any:
        self.calls.append(("admit", host_id, gpu_type, gpus))
        return {"host_id": host_id, "admitted": {"gpu_type": gpu_type, "gpus": gpus}}

    def circuits(self) -> Any:
        self.calls.append(("show",))
        return SHOWN

    def reset_circuits(self, region: str, instance_type: str | None = None) -> Any:
        self.calls.append(("reset", region, instance_type))
        return {"reset": [{"region": region, "instance_type": instance_type or "*"}]}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Client:
    fake = Client()
    monkeypatch.setattr(fleet_cmd, "client_for", lambda _url, _profile: fake)
    return fake


def test_circuits_shows_each_circuit_and_its_state(client: Client) -> None:
    out = CliRunner().invoke(app, ["circuits"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    assert "us-east-1" in out.output and "p5.48xlarge" in out.output and "open" in out.output
    as_json = CliRunner().invoke(app, ["circuits", "-o", "json"])
    assert json.loads(as_json.output) == SHOWN
    assert client.calls == [("show",), ("show",)]


@pytest.mark.parametrize(
    ("arg", "call"),
    [
        ("us-east-1", ("reset", "us-east-1", None)),
        ("us-east-1/p5.48xlarge", ("reset", "us-east-1", "p5.48xlarge")),
        ("us-west-2/*", ("reset", "us-west-2", "*")),
    ],
)
def test_reset_names_a_region_or_one_of_its_circuits(client: Client, arg: str, call: tuple[Any, ...]) -> None:
    out = CliRunner().invoke(app, ["circuits", "--reset", arg])
    assert out.exit_code == 0, out.output
    assert client.calls == [call] and "reset (closed)" in out.output


def test_a_malformed_reset_is_refused_before_any_call(client: Client) -> None:
    out = CliRunner().invoke(app, ["circuits", "--reset", "us-east-1/"])
    assert out.exit_code != 0 and client.calls == []


def test_admit_sends_the_hosts_bound(client: Client) -> None:
    out = CliRunner().invoke(app, ["admit", "h-1", "--gpu-type", "H200", "--gpus", "8"])
    assert out.exit_code == 0, out.output
    assert client.calls == [("admit", "h-1", "H200", 8)] and "up to 8 H200" in out.output
