"""Text the CLI did not write (job output, reasons, error messages) shown on a terminal, safely.

A job's output can hold terminal escape sequences: ESC/CSI (clear the screen, move the cursor,
recolour), OSC (set the window title, write the clipboard with OSC 52, hyperlinks), C1 controls that
some terminals take as ESC + letter, BEL, a carriage return that overwrites what was printed before
it, and bidirectional overrides that make text read other than it is. Printed raw, they act on the
terminal of whoever reads the logs, also an admin reading another team's job. ``visible`` turns each
such character into an escape one can read (``\\x1b``, ``\\x9b``, ``\\u202e``); newline and tab
stay. ``literal`` is the same as a rich ``Text``, which rich prints as it is: ``[bold]`` and
``:smile:`` in job output come out literally, never as markup or emoji.

``berth logs --raw`` prints job output byte for byte (for piping into a file or a tool that wants
the escapes); everything else goes through here.
"""

from __future__ import annotations

from rich.text import Text

#: C0 controls but newline and tab, DEL, and the C1 controls (U+0080..U+009F).
_CONTROLS = [c for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"]
#: The bidirectional embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069).
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_TABLE: dict[int, str] = {c: f"\\x{c:02x}" for c in _CONTROLS} | {c: f"\\u{c:04x}" for c in _BIDI}


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written as a visible escape."""
    return text.translate(_TABLE)


def literal(text: str) -> Text:
    """``visible(text)`` as a rich ``Text``: printed as it is, no markup, no emoji, no highlighting."""
    return Text(visible(text))
