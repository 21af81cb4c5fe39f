"""moto 5.2.5's EventBridge without building a JSONPath parser per event, target and input path.

For every event a rule matches, moto's ``EventTemplateParser.parse`` compiles each of the target's
input paths with ``jsonpath_ng.ext.parse`` (a PLY parser built from its grammar: milliseconds
each), ten of them for a target without an ``InputTransformer``. The compiled expression depends
only on the path's text and finding matches does not change it, so the patch (declared in
``moto_compat.SURFACES``) keeps moto's function and compiles each distinct path once per process.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_PARSE = "moto.events.utils:EventTemplateParser.parse"


@functools.lru_cache(maxsize=1024)
def compiled(path: str) -> Any:
    """The JSONPath expression of `path`, compiled once (jsonpath_ng.ext, as moto compiles it)."""
    from jsonpath_ng.ext import parse

    return parse(path)


def _parse(input_template: str, input_paths_map: dict[str, Any], event: Any) -> dict[str, Any]:
    """moto's EventTemplateParser.parse, with the input paths compiled once."""
    parser = moto_compat.surface("moto.events.utils:EventTemplateParser")
    stringify = parser._stringify
    template = input_template or parser.DEFAULT_EVENT_INPUT_TEMPLATE
    paths = input_paths_map or parser.DEFAULT_EVENT_INPUT_PATHS_MAP
    for name in paths:
        matches = compiled(paths[name]).find(event)
        result = stringify(matches[0].value) if matches else None
        if result:
            template = template.replace(f"<{name}>", result)
    defaults = {"aws.events.event.json": event, "aws.events.event.ingestion-time": event["ingestion-time"]}
    for name, value in defaults.items():
        template = template.replace(f"<{name}>", stringify(value))
    return dict(json.loads(template))


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo."""
    current = moto_compat.surface(_PARSE)
    if current is _parse:
        return lambda: None
    return moto_compat.replace(_PARSE, staticmethod(_parse)).undo
