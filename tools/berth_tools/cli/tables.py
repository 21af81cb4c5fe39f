"""Tables that fit the terminal.

Each column says how much it matters (``priority``: 0 is always shown, higher numbers are dropped
first) and what may happen to it when the terminal is narrow:

* a ``key`` column (a job id, a host id) is never cut and never dropped: a cut id cannot be pasted
  into the next command;
* a ``flexible`` column (names, reasons, free text) may be ellipsised down to ``min_width``;
* every other column keeps its full width or is dropped whole.

``fit`` chooses: it drops the lowest-priority columns until the table fits ``width`` with its
flexible columns at their minimum, then shares the room left evenly among the flexible columns.
``wide`` (``--wide``) keeps every column at its full width; ``show`` then prints it wider than the
terminal rather than cut anything (also when the key columns alone are wider than the terminal).
Widths are fixed here rather than left to rich, so what is cut is decided by these rules and not by
rich's proportional shrinking.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

WideOpt = Annotated[
    bool, typer.Option("--wide", help="Show every column at full width, however wide the terminal")
]

#: Space between two columns: rich's divider (a space in this box) and one cell of padding each side.
GUTTER = 3


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    priority: int = 0
    key: bool = False
    flexible: bool = False
    min_width: int = 10
    justify: str = "left"


Cell = str | Text


def _text(cell: Cell) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)


@dataclass(frozen=True, slots=True)
class Layout:
    """The columns ``fit`` kept (indices into the given columns) and the width of each."""

    shown: tuple[int, ...]
    widths: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.widths) + GUTTER * max(len(self.widths) - 1, 0)


def fit(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, wide: bool = False) -> Layout:
    """Which columns to show and how wide, for a terminal ``width`` columns wide (see the module)."""
    natural = [max([len(c.header), *(_text(r[i]).cell_len for r in rows)]) for i, c in enumerate(columns)]
    if wide:
        return Layout(tuple(range(len(columns))), tuple(natural))
    floor = [
        min(n, c.min_width) if c.flexible and not c.key else n for n, c in zip(natural, columns, strict=True)
    ]
    shown = list(range(len(columns)))

    def needed(cols: list[int]) -> int:
        return sum(floor[i] for i in cols) + GUTTER * max(len(cols) - 1, 0)

    droppable = sorted(
        (i for i, c in enumerate(columns) if c.priority > 0 and not c.key),
        key=lambda i: (-columns[i].priority, -i),
    )
    for i in droppable:
        if needed(shown) <= width:
            break
        shown.remove(i)
    widths = {i: floor[i] for i in shown}
    spare = width - needed(shown)
    # Water-filling: the room left is shared evenly by the flexible columns still cut, so a long
    # name does not take it all from the reason beside it.
    wanting = [i for i in shown if columns[i].flexible and widths[i] < natural[i]]
    while spare > 0 and wanting:
        share = max(1, spare // len(wanting))
        for i in wanting:
            grow = min(share, natural[i] - widths[i], spare)
            widths[i] += grow
            spare -= grow
        wanting = [i for i in wanting if widths[i] < natural[i]]
    return Layout(tuple(shown), tuple(widths[i] for i in shown))


def table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    width: int,
    wide: bool = False,
    title: str | None = None,
) -> tuple[Table, Layout]:
    """A rich table of ``rows`` laid out by ``fit``."""
    layout = fit(columns, rows, width, wide)
    t = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        title=title,
        title_justify="left",
        header_style="bold",
    )
    for i, w in zip(layout.shown, layout.widths, strict=True):
        c = columns[i]
        t.add_column(
            c.header,
            width=w,
            no_wrap=True,
            overflow="ellipsis",
            justify=c.justify,  # type: ignore[arg-type]
        )
    for r in rows:
        t.add_row(*(_text(r[i]) for i in layout.shown))
    return t, layout


def flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A report's fields as ``(name, value)`` rows: nested objects as ``a.b`` names, lists of
    scalars joined, lists of objects one row per item (``a[0].b``), so no JSON shows in a table."""
    rows: list[tuple[str, str]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(flatten(value, name + ".") if value else [(name, "-")])
        elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                rows.extend(
                    flatten(item, f"{name}[{i}].")
                    if isinstance(item, dict)
                    else [(f"{name}[{i}]", str(item))]
                )
        elif isinstance(value, list):
            rows.append((name, ", ".join(str(v) for v in value) or "-"))
        else:
            rows.append((name, "-" if value is None else str(value)))
    return rows


def metric_table(console: Console, data: dict[str, Any]) -> None:
    """A report (a benchmark's figures) as METRIC / VALUE rows, nested fields flattened."""
    show(
        console,
        [Column("METRIC", key=True), Column("VALUE", justify="right", flexible=True, min_width=12)],
        [list(r) for r in flatten(data)],
    )


def show(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    wide: bool = False,
    title: str | None = None,
    wide_flag: bool = True,
) -> Layout:
    """Print the table fitted to ``console``'s width (``wide``: every column whole, wider if it must be),
    and which columns were left out, if any (``wide_flag``: the command has ``--wide``).
    Output that is not a terminal (a pipe, a file) is wide unless ``COLUMNS`` says otherwise: what
    ``grep`` or a file gets is never cut."""
    wide = wide or (not console.is_terminal and "COLUMNS" not in os.environ)
    t, layout = table(columns, rows, console.width, wide, title)
    if layout.total <= console.width:
        console.print(t)
    else:
        # Wider than the terminal (``--wide``, or keys that alone do not fit): rendered at its own
        # width and printed uncropped, so the terminal wraps lines rather than anything being cut.
        lines = console.render(t, console.options.update_width(layout.total))
        console.print(Segments(lines), soft_wrap=True, crop=False)
    hidden = [columns[i].header for i in range(len(columns)) if i not in layout.shown]
    if hidden and rows:
        how = "--wide or -o json shows" if wide_flag else "-o json shows"
        console.print(Text(f"(not shown at this width: {', '.join(hidden)}; {how} them)", style="dim"))
    return layout
