"""Shared CLI plumbing: output format, exit codes, error printing."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum, StrEnum
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from berth_tools.cli.safe_text import literal, visible
from berth_tools.client import ClientError

console = Console()
err_console = Console(stderr=True)


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


OutputOpt = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="table (for people) or json (for scripts)")
]


class Exit(IntEnum):
    """Exit codes scripts can rely on (documented in docs/api.md)."""

    OK = 0
    ERROR = 1  # any other API refusal (409, 429, ...)
    USAGE = 2  # bad flags, unreadable or invalid spec file, bad input (400, 422)
    NOT_FOUND = 3
    DENIED = 4  # 401/403: unsigned, unknown principal, not allowed
    UNAVAILABLE = 5  # API unreachable or failing (5xx) after retries


#: Client-side failures (status 0) by their code.
_LOCAL_EXIT = {"NoApiUrl": 2, "BadConfig": 2, "BadSpecFile": 2, "BadBundle": 2, "NoCredentials": 4}


def exit_code(status: int, code: str | None = None) -> Exit:
    if status == 0 and code in _LOCAL_EXIT:
        return Exit(_LOCAL_EXIT[code])
    if status in (400, 413, 422):
        return Exit.USAGE
    if status == 404:
        return Exit.NOT_FOUND
    if status in (401, 403):
        return Exit.DENIED
    if status == 0 or status >= 500:
        return Exit.UNAVAILABLE
    return Exit.ERROR


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextmanager
def api_errors(output: OutputFormat) -> Iterator[None]:
    """Turn client errors into a clear message and a meaningful exit code."""
    try:
        yield
    except ClientError as exc:
        fail(output, exc)


def fail(output: OutputFormat, exc: ClientError) -> NoReturn:
    """Print an error the way the output format asks (JSON: the API's error body) and exit."""
    if output is OutputFormat.JSON:
        emit_json({"error": {"code": exc.code, "message": exc.message, "details": exc.details}})
    else:
        err_console.print(
            Text.assemble(("error", "bold red"), f" ({visible(str(exc.code))}): ", literal(exc.message))
        )
        lines = (
            [str(d["message"]) for d in exc.details if isinstance(d, dict) and "message" in d]
            if isinstance(exc.details, list)
            else []
        )
        if lines != [exc.message]:  # one problem is already the message: not twice
            for line in lines:
                err_console.print(Text.assemble("  - ", literal(line)))
    raise typer.Exit(int(exit_code(exc.status, exc.code)))


def render(output: OutputFormat, data: Any, table: Callable[[Any], None]) -> None:
    if output is OutputFormat.JSON:
        emit_json(data)
    else:
        table(data)
