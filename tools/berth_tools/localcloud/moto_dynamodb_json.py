"""moto 5.2.5 writes each DynamoDB attribute value of an answer through its generic shape walker.

moto answers DynamoDB with ``DynamoResult``, serialised by the generic ``ResponseSerializer``: for every
node of every item (each attribute, each member of a map or list) it looks the member up in the
botocore shape model, tries the key's aliases (``XFormedAttributePicker``) and dispatches on the
shape's type. A Query page of 1,000 queue entries is tens of thousands of such nodes, and at 10,000
queued jobs that walk cost a scheduling pass more CPU than moto's query itself.

The patch (declared in ``moto_compat.SURFACES``) serialises a DynamoDB result with a subclass of the
serializer moto picks, whose ``_serialize`` writes an ``AttributeValue`` (the shape of every item
attribute, and of the members of its maps and lists) directly, as the generic walk would write it:
strings and numbers as strings (``S``, ``N``, ``SS``, ``NS``), binary base64-encoded (``B``, ``BS``),
``BOOL`` and ``NULL`` as they are, maps and lists recursively. Anything else in an attribute value (a
type it does not know, a value of an unexpected Python type) is left to the generic walk, as is every
other shape (the answer's envelope, capacity, keys of unprocessed items, errors).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_RESULT = "moto.dynamodb.responses:DynamoResult"
_STRINGS = ("S", "N")
_STRING_SETS = ("SS", "NS")
stats = {"direct": 0, "generic": 0}


class _Unknown(Exception):
    """An attribute value the direct path does not write: the generic walk writes it."""


def _blob(value: Any) -> str:
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes):
        raise _Unknown
    return base64.b64encode(value).strip().decode("utf-8")


def _string(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise _Unknown
    return str(value)


def attribute_value(value: Any) -> dict[str, Any]:
    """An ``AttributeValue`` (as ``dynamo_to_dict`` leaves it: ``{type: value}``, bytes for binary) as
    moto's JSON serializer writes it; ``_Unknown`` for anything it does not know."""
    if not isinstance(value, dict) or len(value) != 1:
        raise _Unknown
    ((kind, inner),) = value.items()
    if kind in _STRINGS:
        return {kind: _string(inner)}
    if kind in _STRING_SETS:
        if not isinstance(inner, list):
            raise _Unknown
        return {kind: [_string(v) for v in inner]}
    if kind == "B":
        return {kind: _blob(inner)}
    if kind == "BS":
        if not isinstance(inner, list):
            raise _Unknown
        return {kind: [_blob(v) for v in inner]}
    if kind == "M":
        if not isinstance(inner, dict):
            raise _Unknown
        return {kind: {str(k): attribute_value(v) for k, v in inner.items()}}
    if kind == "L":
        if not isinstance(inner, list):
            raise _Unknown
        return {kind: [attribute_value(v) for v in inner]}
    if kind in ("BOOL", "NULL") and isinstance(inner, bool):
        return {kind: inner}
    raise _Unknown


@functools.cache
def _direct(serializer: type[Any]) -> type[Any]:
    """``serializer`` writing each ``AttributeValue`` directly (one subclass per serializer class)."""

    class Direct(serializer):
        def _serialize(self, serialized: Any, value: Any, shape: Any, key: str) -> None:
            if key and shape.name == "AttributeValue":
                try:
                    written = attribute_value(value)
                except _Unknown:
                    stats["generic"] += 1
                else:
                    stats["direct"] += 1
                    self._default_serialize(serialized, written, shape, key)
                    return
            super()._serialize(serialized, value, shape, key)

    Direct.__name__ = Direct.__qualname__ = f"Direct{serializer.__name__}"
    return Direct


def _execute_result(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(original)
    def execute_result(self: Any, context: Any) -> Any:
        return original(
            self, dataclasses.replace(context, serializer_class=_direct(context.serializer_class))
        )

    execute_result._berth_direct = True  # type: ignore[attr-defined]
    return execute_result


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo."""
    current = moto_compat.surface(f"{_RESULT}.execute_result")
    if getattr(current, "_berth_direct", False):
        return lambda: None
    patch = moto_compat.replace(f"{_RESULT}.execute_result", _execute_result(current))
    return patch.undo
