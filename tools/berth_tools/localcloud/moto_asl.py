"""moto 5.2.5's Step Functions parse a state machine's definition once, not once per execution.

moto (LocalStack's interpreter) lexes and parses the ASL definition with ANTLR and preprocesses it
into an evaluation program when the state machine is created and again for every execution, which
for Berth's job workflow is most of an execution's start. The program is evaluated against a
per-execution ``Environment`` and its components keep no execution state; the one thing they set
lazily is their ``heap_key`` (a random id naming the component's slot in the environment), which
two executions would race to set, so the patch assigns every component's key before the program is
shared. ``AmazonStateLanguageParser.parse`` (declared in ``moto_compat.SURFACES``) then answers
from a cache keyed by the definition's text; a definition that does not parse raises, as before,
every time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_PARSE = "moto.stepfunctions.parser.asl.parse.asl_parser:AmazonStateLanguageParser.parse"
#: Distinct definitions kept (each a few hundred KiB of components); least recently used go first.
CACHE_SIZE = 64

_cache: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
_lock = threading.Lock()
stats = {"parsed": 0, "reused": 0}


def _fix_heap_keys(program: Any) -> int:
    """Assign `heap_key` on every evaluation component reachable from `program`; how many."""
    component = moto_compat.surface("moto.stepfunctions.parser.asl.component.eval_component:EvalComponent")
    seen: set[int] = set()
    todo = [program]
    count = 0
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, component):
            _ = node.heap_key
            count += 1
        if isinstance(node, dict):
            todo.extend(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            todo.extend(node)
        elif hasattr(node, "__dict__") and type(node).__module__.startswith("moto.stepfunctions"):
            todo.extend(vars(node).values())
    return count


def _cached_parse(original: Callable[[str], tuple[Any, Any]]) -> Callable[[str], tuple[Any, Any]]:
    def parse(definition: str) -> tuple[Any, Any]:
        with _lock:
            hit = _cache.get(definition)
            if hit is not None:
                _cache.move_to_end(definition)
                stats["reused"] += 1
                return hit
            parsed = original(definition)  # raises ASLParserException on a bad definition
            _fix_heap_keys(parsed[0])
            _cache[definition] = parsed
            stats["parsed"] += 1
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
            return parsed

    parse._berth_cached = True  # type: ignore[attr-defined]
    return parse


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo (which also empties the cache)."""
    current = moto_compat.surface(_PARSE)
    if getattr(current, "_berth_cached", False):
        return lambda: None
    patch = moto_compat.replace(_PARSE, staticmethod(_cached_parse(current)))

    def undo() -> None:
        patch.undo()
        with _lock:
            _cache.clear()

    return undo
