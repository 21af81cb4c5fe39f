"""moto 5.2.5 parses a DynamoDB condition expression's text once, not three times per written item.

moto lexes and parses every ``ConditionExpression`` (and every Query and Scan ``FilterExpression``)
from its text with a regex lexer that compiles its patterns per token, then rewrites the token list
in seven passes. It does so three times for each item a ``TransactWriteItems`` writes (the response
layer's check of the names used, the transaction's condition check, the table's put), and twice for
a conditional ``PutItem`` or ``UpdateItem``. Berth's placements are transactions of conditional
writes with long conditions (about 24 tokens each), so at 10,000 queued jobs this parse was a fifth
of the CPU of a scheduling pass's apply phase (``berth bench pass``, under cProfile).

The syntax tree depends only on the expression's text, its attribute names and which attribute
values it is given; the values themselves enter only when the tree is turned into an operation
(``_make_operand``). So the patch (declared in ``moto_compat.SURFACES``) parses an expression once
with a parser whose value lookup checks the value is there, as moto's does, and leaves a reference
to its name in the tree instead (``_Template``: moto's own ``parse``, stopped before it builds the
operation), keeps that tree by (text, names, value names), and for every parse binds the request's
values into a copy of the tree's value nodes and builds the operation with moto's own
``_make_op_condition``. The names and values the expression uses (``expr_attr_names_found``,
``expr_attr_values_found``, which moto's response layer checks against what the request declared)
are filled as moto fills them. An expression that does not parse is never kept: the parse is done
again, by moto as shipped, and raises what it raised.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from berth_tools.localcloud import moto_compat

_PARSER = "moto.dynamodb.comparisons:ConditionExpressionParser"
#: Distinct (expression, names, value names) kept; least recently used go first. Berth's code has a
#: few dozen; a client building expressions from data would only miss more often.
CACHE_SIZE = 4096

_cache: OrderedDict[Hashable, tuple[Any, tuple[str, ...], tuple[str, ...]]] = OrderedDict()
_lock = threading.Lock()
stats = {"parsed": 0, "reused": 0, "uncached": 0}


class _Ref(str):
    """An expression attribute value's name, standing in the cached tree for its value."""


@functools.cache
def _template_class(parser: Any) -> type[Any]:
    """moto's parser, parsing to the syntax tree with value references in it."""

    class Template(parser):
        def _lookup_expression_attribute_value(self, name: str) -> Any:
            super()._lookup_expression_attribute_value(name)  # raises for a value not given, as moto does
            return _Ref(name)

        def _make_op_condition(self, node: Any) -> Any:
            return node  # the tree itself: the operation is built per request, with its values

    return Template


def _key(parser: Any) -> Hashable | None:
    names, values = parser.expression_attribute_names, parser.expression_attribute_values
    try:
        named = None if names is None else tuple(sorted(names.items()))
        given = None if values is None else frozenset(values)
        key = (parser.condition_expression, named, given)
        hash(key)
    except (AttributeError, TypeError):
        return None  # not the shapes a request parses to: moto as shipped decides
    return key


def _bind(node: Any, values: dict[str, Any], kind: str) -> Any:
    """``node`` with each value reference replaced by the request's value (new nodes on those paths)."""
    if node.kind == kind and isinstance(node.value, _Ref):
        return node._replace(value=values[node.value])
    if not node.children:
        return node
    children = [_bind(child, values, kind) for child in node.children]
    if all(new is old for new, old in zip(children, node.children, strict=True)):
        return node
    return node._replace(children=children)


def _cached_parse(original: Callable[[Any], Any], parser: Any) -> Callable[[Any], Any]:
    template_class = _template_class(parser)
    value_kind = parser.Kind.EXPRESSION_ATTRIBUTE_VALUE

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
        return self._make_op_condition(_bind(tree, self.expression_attribute_values, value_kind))

    parse._berth_cached = True  # type: ignore[attr-defined]
    return parse


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo (which also empties the cache)."""
    current = moto_compat.surface(f"{_PARSER}.parse")
    if getattr(current, "_berth_cached", False):
        return lambda: None
    patch = moto_compat.replace(f"{_PARSER}.parse", _cached_parse(current, moto_compat.surface(_PARSER)))

    def undo() -> None:
        patch.undo()
        with _lock:
            _cache.clear()

    return undo
