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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from berth_tools.localcloud import dynamodb_isolation, moto_compat

_TABLE = "moto.dynamodb.models.table:Table"
_INDEX = "moto.dynamodb.models.table:SecondaryIndex"
_ITEM = "moto.dynamodb.models.dynamo_type:Item"
_scope = threading.local()
stats = {"narrowed": 0, "whole": 0, "projected": 0, "kept": 0, "sliced": 0, "grouped": 0}


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
        if not getattr(_scope, "copied", False):
            # a Query's page is projected after moto deep-copied it: nothing there to copy again
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


def _stored_items(table: Any) -> Iterator[Any]:
    """Every stored item of the table, unsorted (each bucket copied first, atomic under the GIL)."""
    ranged = bool(table.range_key_attr)
    for entry in list(table.items.values()):
        yield from list(entry.values()) if ranged else (entry,)


def _matching(table: Any, conditions: list[tuple[str, Any]]) -> list[Any]:
    found = []
    for item in _stored_items(table):
        attrs = item.attrs
        for name, expected in conditions:
            value = attrs.get(name)
            if value is None or not _equal(value, expected):
                break
        else:
            found.append(item)
    return found


@dataclass(frozen=True)
class _Grouped:
    """A table's items grouped by the values of some attributes (string or binary), while no write
    has run since: the partitions of an index, from one walk of the table."""

    table: Any
    generation: int
    groups: dict[tuple[tuple[str, Any], ...], list[Any]]


#: Per (table, attribute names): the grouping, or (table, generation) when one query has walked the
#: table for them at that generation (the second query at the same generation groups the table).
_grouped: dict[tuple[int, tuple[str, ...]], _Grouped | tuple[Any, int]] = {}


def _group(table: Any, names: tuple[str, ...], generation: int) -> _Grouped:
    groups: dict[tuple[tuple[str, Any], ...], list[Any]] = {}
    for item in _stored_items(table):
        attrs = item.attrs
        key = []
        for name in names:
            value = attrs.get(name)
            if value is None or value.type not in ("S", "B"):
                break
            key.append((value.type, value.value))
        else:
            groups.setdefault(tuple(key), []).append(item)
    return _Grouped(table, generation, groups)


def _index_partition(table: Any, conditions: list[tuple[str, Any]], generation: int) -> list[Any]:
    """The items whose attributes equal the index query's hash key conditions: ``_matching`` for the
    first query at a generation, and from the second on, the table grouped by those attributes in
    one walk (a pass reads the heads of many tenants' queues, each its own partition)."""
    if any(value.type not in ("S", "B") for _, value in conditions):
        return _matching(table, conditions)  # numbers compare by value, not by their text
    names = tuple(name for name, _ in conditions)
    wanted = tuple((value.type, value.value) for _, value in conditions)
    key = (id(table), names)
    with _kept_lock:
        seen = _grouped.get(key)
    if isinstance(seen, _Grouped) and seen.table is table and seen.generation == generation:
        stats["grouped"] += 1
        return list(seen.groups.get(wanted, ()))
    walked_once = isinstance(seen, tuple) and seen[0] is table and seen[1] == generation
    if not walked_once:
        with _kept_lock:
            _drop_stale(_grouped, generation)
            _grouped[key] = (table, generation)
        return _matching(table, conditions)
    grouped = _group(table, names, generation)
    with _kept_lock:
        _grouped[key] = grouped
    stats["grouped"] += 1
    return list(grouped.groups.get(wanted, ()))


def _drop_stale(cache: dict[Any, Any], generation: int) -> None:
    for k in [k for k, v in cache.items() if (v[1] if isinstance(v, tuple) else v.generation) != generation]:
        del cache[k]


@dataclass(frozen=True)
class _Kept:
    """An index query's candidates, sorted as moto sorts them, while no write has run since."""

    table: Any
    index: Any
    generation: int
    items: list[Any]
    hash_attrs: list[str]
    range_attrs: list[str | None]


#: Candidates kept per (table, index, hash key conditions, projected), at most ``KEPT_ENTRIES`` in all.
_kept: dict[tuple[Any, ...], _Kept] = {}
_kept_lock = threading.Lock()
KEPT_ENTRIES = 250_000


def _sort_attrs(table: Any, index: Any) -> tuple[list[str], list[str | None]] | None:
    """The key attributes moto's ``Table.query`` sorts an index's candidates by (None: a schema it
    would refuse, left to moto)."""
    hash_keys = [k["AttributeName"] for k in index.schema if k["KeyType"] == "HASH"]
    range_keys: list[str | None] = [k["AttributeName"] for k in index.schema if k["KeyType"] == "RANGE"]
    if not hash_keys:
        return None
    if range_keys:
        return [*hash_keys, table.hash_key_attr], [*range_keys, table.range_key_attr]
    is_global = any(i is index for i in (table.global_indexes or []))
    own = table.range_key_attr if is_global and table.range_key_attr else table.hash_key_attr
    return [*hash_keys, table.hash_key_attr], [own, table.range_key_attr]


def _index_candidates(
    table: Any, index_name: str, conditions: list[tuple[str, Any]], legacy: bool
) -> _Kept | list[Any] | None:
    """The items (or, for a KEYS_ONLY or INCLUDE index, the entries) whose index hash key attributes
    equal the query's: sorted and kept until the next write, when writes are counted
    (``dynamodb_isolation.generation``); else unsorted, for moto to sort. None: an index moto refuses."""
    index = next((i for i in table.all_indexes() if i.name == index_name), None)
    if index is None:
        return None
    names = None if legacy else projected_names(index)
    generation = dynamodb_isolation.generation()
    key = (id(table), index_name, tuple((n, v.type, repr(v.value)) for n, v in conditions), names is None)
    if generation is not None:
        with _kept_lock:
            kept = _kept.get(key)
        if kept is not None and kept.table is table and kept.index is index and kept.generation == generation:
            stats["kept"] += 1
            return kept
    found = (
        _matching(table, conditions)
        if generation is None
        else _index_partition(table, conditions, generation)
    )
    if names is not None:
        found = [_entry(item, names) for item in found]
        stats["projected"] += 1
    attrs = _sort_attrs(table, index)
    if generation is None or attrs is None:
        return found
    range_keys = [k["AttributeName"] for k in index.schema if k["KeyType"] == "RANGE"]
    if range_keys:  # an item without every range key of the index is not in it (moto's own test)
        found = [item for item in found if all(item.attrs.get(k) for k in range_keys)]
    kept = _Kept(table, index, generation, table.sorted_items(*attrs, found), *attrs)
    with _kept_lock:
        _drop_stale(_kept, generation)
        if sum(len(v.items) for v in _kept.values()) + len(found) > KEPT_ENTRIES:
            _kept.clear()
        if len(found) <= KEPT_ENTRIES:
            _kept[key] = kept
    return kept


def _page_of(table: Any, kept: _Kept, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """What moto needs of the kept candidates for this page. A forward query with no range condition
    takes the candidates after the page's start key (found by bisection with moto's own comparison)
    and, given a limit, one more than it, so that moto still sees whether another page follows; any
    other query gets them all, for moto to walk as before."""
    range_comparison = args[0] if args else kwargs.get("range_comparison")
    limit = args[2] if len(args) > 2 else kwargs.get("limit")
    start_key = args[3] if len(args) > 3 else kwargs.get("exclusive_start_key")
    forward = args[4] if len(args) > 4 else kwargs.get("scan_index_forward", True)
    if range_comparison or kwargs.get("range_key_conditions") or forward is False:
        return list(kept.items)
    items = kept.items
    lo = 0
    if start_key:
        hi = len(items)
        while lo < hi:
            mid = (lo + hi) // 2
            if table._item_comes_before_dct(items[mid], start_key, kept.hash_attrs, kept.range_attrs, True):
                lo = mid + 1
            else:
                hi = mid
        stats["sliced"] += 1
    return items[lo : lo + limit + 1] if limit else items[lo:]


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
            found = _index_candidates(self, index_name, list(conditions), _legacy_filter(kwargs))
            candidates = _page_of(self, found, args, kwargs) if isinstance(found, _Kept) else found
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
        copied = getattr(_scope, "copied", False)
        _scope.copied = True
        try:
            return original(self, hash_key, *args, **kwargs)
        finally:
            _scope.copied = copied
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
