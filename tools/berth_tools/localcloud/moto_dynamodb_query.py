"""moto 5.2.5's DynamoDB Query reads the partition it asks for, not the whole table sorted.

For every page of every Query, moto's ``Table.query`` takes ``Table.all_items()`` (every item of the
table, sorted by hash and range key with DynamoDB's comparison in Python) and then keeps the items of
the queried partition; a query of a GSI walks the same sorted list comparing the index's key
attributes. The patch (declared in ``moto_compat.SURFACES``) keeps moto's query as it is (key
conditions, range conditions, ScanIndexForward, Limit and ExclusiveStartKey, filters, projections)
and only narrows what ``all_items()`` gives it while it runs:

- a query of the table: the items stored under the hash key (moto keys its item dict by it);
- a query of an index: one unsorted pass keeping the items whose index hash key attributes equal
  the query's (moto sorts the candidates itself, by the index's keys and then the table's).

The narrowing is per thread (a query in one thread never changes what a scan in another sees), and
the walks copy the item dict first (``list()``, atomic under the GIL), so a write in another thread
cannot break them; ``dynamodb_isolation`` still serialises iterating reads with writes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_TABLE = "moto.dynamodb.models.table:Table"
_scope = threading.local()
stats = {"narrowed": 0, "whole": 0}


def _partition(table: Any, hash_key: Any) -> list[Any]:
    entry = table.items.get(hash_key)
    if entry is None:
        return []
    return list(entry.values()) if table.range_key_attr else [entry]


def _equal(value: Any, expected: Any) -> bool:
    """DynamoType equality (type, then cast value) without casting when the raw values are equal."""
    if value.type != expected.type:
        return False
    return bool(value.value == expected.value or (value.type == "N" and value == expected))


def _matching(table: Any, conditions: list[tuple[str, Any]]) -> list[Any]:
    found = []
    ranged = bool(table.range_key_attr)
    for entry in list(table.items.values()):
        for item in list(entry.values()) if ranged else (entry,):
            attrs = item.attrs
            for name, expected in conditions:
                value = attrs.get(name)
                if value is None or not _equal(value, expected):
                    break
            else:
                found.append(item)
    return found


def _all_items(original: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
    def all_items(self: Any) -> list[Any]:
        narrowed = getattr(_scope, "tables", {}).get(id(self))
        if narrowed is not None:
            return list(narrowed)
        return original(self)

    all_items._berth_narrowing = True  # type: ignore[attr-defined]
    return all_items


def _query(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)  # the surface check reads the original's signature
    def query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        # moto's backend passes index_name positionally (the 8th parameter, after the projection)
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        conditions = kwargs.get("hash_key_conditions")
        if index_name is None and hash_key is not None:
            candidates: list[Any] | None = _partition(self, hash_key)
        elif index_name is not None and conditions:
            candidates = _matching(self, list(conditions))
        else:
            candidates = None  # a shape this patch does not know: moto's own walk
        if candidates is None:
            stats["whole"] += 1
            return original(self, hash_key, *args, **kwargs)
        stats["narrowed"] += 1
        tables = getattr(_scope, "tables", None)
        if tables is None:
            tables = _scope.tables = {}
        previous = tables.get(id(self))
        tables[id(self)] = candidates
        try:
            return original(self, hash_key, *args, **kwargs)
        finally:
            if previous is None:
                tables.pop(id(self), None)
            else:
                tables[id(self)] = previous

    query._berth_narrowing = True  # type: ignore[attr-defined]
    return query


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo."""
    current = moto_compat.surface(f"{_TABLE}.query")
    if getattr(current, "_berth_narrowing", False):
        return lambda: None
    patches = [
        moto_compat.replace(f"{_TABLE}.all_items", _all_items(moto_compat.surface(f"{_TABLE}.all_items"))),
        moto_compat.replace(f"{_TABLE}.query", _query(current)),
    ]

    def undo() -> None:
        for patch in reversed(patches):
            patch.undo()

    return undo
