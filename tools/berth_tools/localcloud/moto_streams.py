"""Wake the local cloud's DynamoDB stream pollers when a stream gets a record, instead of polling at 20 Hz.

AWS's stream pollers are AWS's cost; the local cloud's ran ``GetRecords`` every 50 ms per mapping
through moto's HTTP server even when nothing happened (the largest part of an idle local cloud). moto
appends a table's stream records in ``StreamShard.add``; the patch (declared in
``moto_compat.SURFACES``) wraps it to bump a process-wide generation and wake whoever waits on
``SIGNAL`` (``event_sources.StreamPoller``), which then reads the stream as before. A poller still
reads at least every ``StreamSignal.wait``'s timeout, so a record written some other way is not lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_ADD = "moto.dynamodb.models.table:StreamShard.add"


class StreamSignal:
    """A generation counter that stream writes bump; waiters block until it moves (or a timeout)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.generation = 0

    def bump(self) -> None:
        with self._changed:
            self.generation += 1
            self._changed.notify_all()

    def wait(self, seen: int, timeout_s: float) -> int:
        """Block until the generation is not `seen` or `timeout_s` passed; the generation now."""
        with self._changed:
            self._changed.wait_for(lambda: self.generation != seen, timeout=timeout_s)
            return self.generation


SIGNAL = StreamSignal()


def _add(original: Callable[..., None]) -> Callable[..., None]:
    def add(self: Any, old: Any, new: Any) -> None:
        try:
            original(self, old, new)
        finally:
            SIGNAL.bump()

    add._berth_stream_signal = True  # type: ignore[attr-defined]
    return add


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo."""
    current = moto_compat.surface(_ADD)
    if getattr(current, "_berth_stream_signal", False):
        return lambda: None
    patch = moto_compat.replace(_ADD, _add(current))
    return patch.undo
