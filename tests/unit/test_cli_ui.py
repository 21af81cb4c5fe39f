"""``berth ui``'s failure paths: no API URL, a port already taken (clear messages, exit 1)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from berth_tools.cli.main import app


def test_without_an_api_url_it_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BERTH_API_URL", raising=False)
    monkeypatch.setenv("BERTH_CONFIG", "/nonexistent/berth.json")
    result = CliRunner().invoke(app, ["ui", "--port", "0"])
    assert result.exit_code != 0 and "BERTH_API_URL" in result.output


def test_a_port_in_use_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTH_API_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["ui", "--port", str(port)])
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output
