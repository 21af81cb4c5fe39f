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

An index's projection (``SecondaryIndex.project``, KEYS_ONLY or INCLUDE) keeps the projected attributes
of the item it is given as they are. moto's rebuilt the item once per projected attribute (the whole
item converted to plain JSON, then the kept attributes converted back): at 10,000 queued jobs that was
most of a pass's read time. moto always hands ``project`` a deep copy of the stored item, so keeping
its attribute objects shares nothing with the table. For the same reason a query of such an index is
given its candidates already projected (the index's entries, as DynamoDB stores them, sharing the
stored attribute objects, which moto's query deep-copies before answering): moto no longer deep-copies
whole items to drop most of their attributes, and the 1 MB page limit counts the entries' size, as
DynamoDB counts it for an index. A query with a legacy ``QueryFilter`` keeps whole candidates.

A ``ProjectionExpression`` of top-level names (``Item.project``, for Query, Scan and GetItem alike)
copies those attributes as they are; moto converted the whole item to plain JSON once per name and
the kept attributes back, checking the item's size again at each one. Nested paths go moto's way.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_TABLE = "moto.dynamodb.models.table:Table"
_INDEX = "moto.dynamodb.models.table:SecondaryIndex"
_ITEM = "moto.dynamodb.models.dynamo_type:Item"
_scope = threading.local()
stats = {"narrowed": 0, "whole": 0, "projected": 0}


def projected_names(index: Any) -> list[str] | None:
    """The attributes an index entry holds (None: the whole item, ``ALL`` or no projection)."""
    projection = index.projection or {}
    kind = projection.get("ProjectionType")
    if kind not in ("KEYS_ONLY", "INCLUDE"):
        return None
    names = list(index.table_key_attrs) + [key["AttributeName"] for key in index.schema]
    if kind == "INCLUDE":
        names.extend(projection.get("NonKeyAttributes", []))
    return names


def _entry(item: Any, names: list[str]) -> Any:
    """``item`` with only ``names`` among its attributes (the same attribute objects; no copy)."""
    entry = object.__new__(type(item))
    entry.__dict__.update(vars(item))
    kind: Any = type(item.attrs)  # moto's LimitedSizeDict, built without its per-key size check
    attrs = kind.__new__(kind)
    dict.update(attrs, {n: item.attrs[n] for n in names if n in item.attrs})
    entry.attrs = attrs
    return entry


def _item_project(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``Item.project`` of top-level attribute names: a copy of those attributes as they are (moto's
    converted the whole item to plain JSON once per name, then the kept ones back, validating the
    item's size again at every attribute). Nested paths and list indexes go moto's way."""

    @functools.wraps(original)
    def project(self: Any, projection_expressions: Any) -> Any:
        if not projection_expressions or any(
            not isinstance(path, list) or len(path) != 1 or not isinstance(path[0], str)
            for path in projection_expressions
        ):
            return original(self, projection_expressions)
        names = [path[0] for path in projection_expressions]
        entry = _entry(self, names)
        for name in list(entry.attrs):
            dict.__setitem__(entry.attrs, name, copy.deepcopy(entry.attrs[name]))
        return entry

    project._berth_projection = True  # type: ignore[attr-defined]
    return project


def _project(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(original)
    def project(self: Any, item: Any) -> Any:
        names = projected_names(self)
        if names is None:
            return original(self, item)
        return _entry(item, names)

    project._berth_projection = True  # type: ignore[attr-defined]
    return project


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


def _index_names(table: Any, index_name: str) -> list[str] | None:
    index = next((i for i in table.all_indexes() if i.name == index_name), None)
    return None if index is None else projected_names(index)


def _legacy_filter(kwargs: dict[str, Any]) -> bool:
    """Whether moto's query got a ``QueryFilter`` (its conditions arrive as extra keyword arguments)."""
    return any(k not in _QUERY_KEYWORDS for k in kwargs)


_QUERY_KEYWORDS = frozenset(
    {
        "index_name",
        "consistent_read",
        "filter_expression",
        "hash_key_conditions",
        "range_key_conditions",
        "expr_names",
        "expr_values",
    }
)


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
            names = _index_names(self, index_name)
            if names is not None and not _legacy_filter(kwargs):
                candidates = [_entry(item, names) for item in candidates]
                stats["projected"] += 1
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
        moto_compat.replace(f"{_INDEX}.project", _project(moto_compat.surface(f"{_INDEX}.project"))),
        moto_compat.replace(f"{_ITEM}.project", _item_project(moto_compat.surface(f"{_ITEM}.project"))),
    ]

    def undo() -> None:
        for patch in reversed(patches):
            patch.undo()

    return undo
