"""moto 5.2.5 parses a DynamoDB condition expression's shape once, not three times per written item, and
an update expression's text once.

moto lexes and parses every ``ConditionExpression`` (and every Query and Scan ``FilterExpression``)
from its text with a regex lexer that compiles its patterns per token, then rewrites the token list
in seven passes. It does so three times for each item a ``TransactWriteItems`` writes (the response
layer's check of the names used, the transaction's condition check, the table's put), and twice for
a conditional ``PutItem`` or ``UpdateItem``. Berth's placements are transactions of conditional
writes with long conditions (about 24 tokens each), so at 10,000 queued jobs this parse was a fifth
of the CPU of a scheduling pass's apply phase (``berth bench pass``, under cProfile).

The syntax tree depends only on the expression's text and which attribute names and values it is
given; what a name stands for and the values themselves enter only as the leaves' ``value``, read when
the tree is turned into an operation (``_make_operand``). So the patch (declared in
``moto_compat.SURFACES``) parses an expression once with a parser whose name and value lookups check
the placeholder is there, as moto's do, and leave a reference to it in the tree instead (``Template``:
moto's own ``parse``, stopped before it builds the operation), keeps that tree by (text, name
placeholders, value placeholders), and for every parse binds the request's names and values into a
copy of the tree's leaves and builds the operation with moto's own ``_make_op_condition``. Keying on
the placeholders, not on what they stand for, matters: Berth's placement conditions name each job's
attempt and each GPU through ``ExpressionAttributeNames`` (``holds.#attempt``), so a key holding the
names' values missed on every placement. The names and values the expression uses (``expr_attr_names_found``,
``expr_attr_values_found``, which moto's response layer checks against what the request declared)
are filled as moto fills them. An expression that does not parse is never kept: the parse is done
again, by moto as shipped, and raises what it raised.

Update expressions (``UpdateExpressionParser.make``, called up to three times per UpdateItem and per
transaction item) are parsed into a tree that holds placeholders only, so it is kept by its text. Every
user of that tree reads it (``find_clauses``) or deep-copies it first (moto's ``Validator``), so one
tree serves every request; an expression that does not parse is never kept.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from berth_tools.localcloud import moto_compat

_PARSER = "moto.dynamodb.comparisons:ConditionExpressionParser"
_UPDATE_PARSER = "moto.dynamodb.parsing.expressions:UpdateExpressionParser"
#: Distinct (expression, names, value names) kept; least recently used go first. Berth's code has a
#: few dozen; a client building expressions from data would only miss more often.
CACHE_SIZE = 4096

_cache: OrderedDict[Hashable, tuple[Any, tuple[str, ...], tuple[str, ...]]] = OrderedDict()
_lock = threading.Lock()
stats = {"parsed": 0, "reused": 0, "uncached": 0}
#: The installed update-expression cache (``functools.lru_cache``), None before the first install.
_updates: Any = None


class _Ref(str):
    """An expression attribute value's placeholder, standing in the cached tree for its value."""


class _NameRef(str):
    """An expression attribute name's placeholder, standing in the cached tree for the name."""


@functools.cache
def _template_class(parser: Any) -> type[Any]:
    """moto's parser, parsing to the syntax tree with value references in it."""

    class Template(parser):
        def _lookup_expression_attribute_value(self, name: str) -> Any:
            super()._lookup_expression_attribute_value(name)  # raises for a value not given, as moto does
            return _Ref(name)

        def _lookup_expression_attribute_name(self, name: str) -> Any:
            super()._lookup_expression_attribute_name(name)  # raises for a name not given, as moto does
            return _NameRef(name)

        def _make_op_condition(self, node: Any) -> Any:
            return node  # the tree itself: the operation is built per request, with its values

    return Template


def _key(parser: Any) -> Hashable | None:
    names, values = parser.expression_attribute_names, parser.expression_attribute_values
    try:
        named = None if names is None else frozenset(names)
        given = None if values is None else frozenset(values)
        key = (parser.condition_expression, named, given)
        hash(key)
    except (AttributeError, TypeError):
        return None  # not the shapes a request parses to: moto as shipped decides
    return key


def _bind(node: Any, names: dict[str, str], values: dict[str, Any]) -> Any:
    """``node`` with each name and value reference replaced by what the request gives for it (new
    nodes on those paths only)."""
    if isinstance(node.value, _Ref):
        return node._replace(value=values[node.value])
    if isinstance(node.value, _NameRef):
        return node._replace(value=names[node.value])
    if not node.children:
        return node
    children = [_bind(child, names, values) for child in node.children]
    if all(new is old for new, old in zip(children, node.children, strict=True)):
        return node
    return node._replace(children=children)


def _cached_parse(original: Callable[[Any], Any], parser: Any) -> Callable[[Any], Any]:
    template_class = _template_class(parser)

    @functools.wraps(original)
    def parse(self: Any) -> Any:
        key = _key(self) if self.condition_expression and type(self) is parser else None
        if key is None:
            stats["uncached"] += 1
            return original(self)
        with _lock:
            entry = _cache.get(key)
            if entry is not None:
                _cache.move_to_end(key)
        if entry is None:
            template = template_class(
                self.condition_expression, self.expression_attribute_names, self.expression_attribute_values
            )
            try:
                tree = original(template)
            except Exception:
                return original(self)
            entry = (tree, tuple(template.expr_attr_names_found), tuple(template.expr_attr_values_found))
            with _lock:
                _cache[key] = entry
                stats["parsed"] += 1
                while len(_cache) > CACHE_SIZE:
                    _cache.popitem(last=False)
        else:
            stats["reused"] += 1
        tree, names_found, values_found = entry
        self.expr_attr_names_found.extend(names_found)
        self.expr_attr_values_found.extend(values_found)
        names, values = self.expression_attribute_names or {}, self.expression_attribute_values or {}
        return self._make_op_condition(_bind(tree, names, values))

    parse._berth_cached = True  # type: ignore[attr-defined]
    return parse


def _cached_make(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """``UpdateExpressionParser.make`` (a classmethod, given here bound) keeping each text's tree: an
    LRU cache by text (one that raises, for a bad expression, keeps nothing)."""
    global _updates
    _updates = functools.lru_cache(maxsize=CACHE_SIZE)(original)
    cached = _updates

    @functools.wraps(original)
    def make(expression: str) -> Any:
        return cached(expression) if isinstance(expression, str) else original(expression)

    make._berth_cached = True  # type: ignore[attr-defined]
    return make


def update_stats() -> dict[str, int]:
    """Update expressions parsed and reused since the cache was installed (or last emptied)."""
    info = _updates.cache_info() if _updates is not None else None
    return {"updates_parsed": info.misses if info else 0, "updates_reused": info.hits if info else 0}


def install() -> Callable[[], None]:
    """Apply the patches (idempotent); returns the undo (which also empties the caches)."""
    current = moto_compat.surface(f"{_PARSER}.parse")
    if getattr(current, "_berth_cached", False):
        return lambda: None
    patches = [moto_compat.replace(f"{_PARSER}.parse", _cached_parse(current, moto_compat.surface(_PARSER)))]
    update_parser = moto_compat.surface(_UPDATE_PARSER)
    descriptor = vars(update_parser)["make"]  # the classmethod itself, put back as it was by undo
    cached_make = staticmethod(_cached_make(moto_compat.surface(f"{_UPDATE_PARSER}.make")))
    moto_compat.replace(f"{_UPDATE_PARSER}.make", cached_make)

    def undo() -> None:
        if vars(update_parser).get("make") is cached_make:
            update_parser.make = descriptor
        for patch in reversed(patches):
            patch.undo()
        with _lock:
            _cache.clear()
        if _updates is not None:
            _updates.cache_clear()

    return undo
