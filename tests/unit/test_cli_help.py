"""``berth --version``, and help that reads as plain text: no reST or Markdown markup left in it."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from berth_tools.cli.main import app

MARKUP = ("``", "`", "::", "\\b", ":class:", ":func:")


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if isinstance(getattr(command, "commands", None), dict):  # a group (typer's own click core)
        for name, sub in sorted(command.commands.items()):
            out += _paths(sub, (*prefix, name))
    return out


COMMANDS = _paths(typer.main.get_command(app))


def test_every_command_is_covered() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {"ls", "explain", "local up", "bench scheduler", "prices refresh"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "berth")
def test_help_has_no_markup(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    leftovers = [m for m in MARKUP if m in result.output]
    assert not leftovers, (leftovers, result.output)


def test_version_is_the_installed_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"berth {version('berth')}"
