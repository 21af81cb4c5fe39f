"""Give moto's DynamoDB the isolation the real service has.

DynamoDB applies each write (and each TransactWriteItems) atomically: a conditional write sees the
state left by the writes before it. moto's backend runs concurrent requests interleaved, so two
racing conditional writes can both pass their condition. Serialising the write operations restores
the guarantee Berth's optimistic concurrency relies on; reads still run concurrently.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.dynamodb.models import DynamoDBBackend

WRITE_OPERATIONS = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
_MARK = "_berth_isolated"


def install() -> Callable[[], None]:
    """Serialise DynamoDB writes in this process; returns a function that undoes it."""
    lock = threading.RLock()
    originals: dict[str, Any] = {}
    for name in WRITE_OPERATIONS:
        original = getattr(DynamoDBBackend, name, None)
        if original is None or getattr(original, _MARK, False):
            continue

        def isolated(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            with lock:
                return __original(*args, **kwargs)

        functools.update_wrapper(isolated, original)
        setattr(isolated, _MARK, True)
        originals[name] = original
        setattr(DynamoDBBackend, name, isolated)

    def undo() -> None:
        for name, original in originals.items():
            setattr(DynamoDBBackend, name, original)

    return undo
