"""How much job output one ``GET /v1/jobs/{id}/logs`` page may carry. Pure.

A Lambda proxy response may not exceed 6 MB, and the body is a JSON string inside that response,
so it is escaped twice: once as the page's JSON (a control character becomes ``\\u001b``, six
bytes; with non-ASCII characters escaped, a character takes at most twelve) and once more as the
``body`` string of the proxy result (``\\`` and ``"`` double). A page therefore keeps its events'
JSON, counted with every non-ASCII character escaped, within ``LOG_PAGE_BUDGET_BYTES`` (2 MiB):
doubled, with the page's other fields, it stays well under 6 MB whatever the job printed.

The first event of a page is always taken: a line longer than the whole budget is cut, with a
marker saying how much of it is not shown, rather than failing the page (``fit_page``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from berth.domain.observability import LogEvent

LOG_PAGE_BUDGET_BYTES = 2 * 1024 * 1024
#: What one event's JSON takes besides its message (``{"at": "...Z", "message": , "attempt": N}, ``).
EVENT_OVERHEAD_BYTES = 100
TRUNCATED_MARKER = " [... {n} more characters of this line not shown: longer than one page of logs]"


def json_size(text: str) -> int:
    """The bytes ``text`` takes as a JSON string with every non-ASCII character escaped (the most
    it can take in any JSON encoding of it)."""
    return len(json.dumps(text))


def event_size(event: LogEvent) -> int:
    return json_size(event.message) + EVENT_OVERHEAD_BYTES


def truncate_to(text: str, budget: int) -> str:
    """The longest prefix of ``text`` that, with the marker saying how many characters were cut,
    fits ``budget`` bytes of JSON (``json_size``); ``text`` itself when it fits."""
    if json_size(text) <= budget:
        return text
    lo, hi = 0, len(text)  # the longest prefix that fits lies in [lo, hi)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        candidate = text[:mid] + TRUNCATED_MARKER.format(n=len(text) - mid)
        if json_size(candidate) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + TRUNCATED_MARKER.format(n=len(text) - lo)


def fit_page(events: Sequence[LogEvent], budget: int = LOG_PAGE_BUDGET_BYTES) -> list[LogEvent]:
    """The leading events of ``events`` whose JSON fits ``budget`` bytes, in order; the next page
    starts after the last of them. The first is always kept: cut to fit (``truncate_to``) when it
    alone is over the budget."""
    kept: list[LogEvent] = []
    used = 0
    for event in events:
        size = event_size(event)
        if used + size > budget:
            if not kept:
                message = truncate_to(event.message, max(0, budget - EVENT_OVERHEAD_BYTES))
                kept.append(event.model_copy(update={"message": message}))
            break
        kept.append(event)
        used += size
    return kept
