"""Give moto's DynamoDB the isolation the real service has, at a cost that does not grow with the tables.

Isolation. DynamoDB applies each write (and each TransactWriteItems) atomically: a conditional write sees
the state left by the writes before it. moto's backend runs concurrent requests interleaved, so two racing
conditional writes can both pass their condition. Serialising the write operations restores the
guarantee Berth's optimistic concurrency relies on. Reads that iterate a table (query, scan) take the
same lock, since moto walks the live item dicts, and so does every single-item request as a whole, since
moto builds its answer from the live item after the backend returns.

Transactions. moto 5.2.5's `transact_write_items` deep-copies every table the transaction touches before
it starts, to roll back by swapping the copies in: each submit copied the whole jobs, events and tenants
tables, so its cost grew with the number of jobs ever stored (and the copies' items were kept alive by
moto's instance registry, see `moto_compat.untrack_instances`). It is replaced by the same algorithm with
an item-level undo journal: before an operation writes an item, a copy of that one item (or its absence)
is recorded; on failure the recorded items are put back in reverse order and the stream records the
transaction appended are dropped. With writes serialised, that restores exactly the state the table
copies did, without reverting other writers' items as swapping whole tables would.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from berth_tools.localcloud import moto_compat

#: Backend methods that write, serialised in this process.
WRITE_OPERATIONS = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
#: Reads that iterate a table's items: moto walks the live dicts, so a write landing meanwhile raised
#: "dictionary changed size during iteration" (a 500) under load. DynamoDB never fails a read for
#: that; they take the same lock (single-item requests take it around the whole request, below).
ITERATING_READS = ("query", "scan")
#: Request handlers that read or write single items: moto hands them the live item (UpdateItem's answer
#: is built from it with ``to_json()`` after the backend returns, GetItem's with ``describe_attrs``), so
#: an update of the same item landing meanwhile made them fail with "dictionary changed size during
#: iteration" (a 500 although the write happened). The whole request runs under the lock, as the local
#: cloud's meter already holds it around every write request.
ITEM_HANDLERS = moto_compat.DYNAMODB_ITEM_HANDLERS
_BACKEND = "moto.dynamodb.models:DynamoDBBackend"
_HANDLER = "moto.dynamodb.responses:DynamoHandler"
#: Held by every serialised write (reentrant: a write may trigger another, e.g. through a stream). The meter
#: holds it around a whole write request to read the item before and after it (`metering`).
WRITE_LOCK = threading.RLock()
_EXC = "moto.dynamodb.exceptions:"
#: Counts the serialised write operations that have ended (each one, whether it wrote or failed),
#: under ``WRITE_LOCK``: a reader holding the lock that sees the same count twice knows that no
#: write ran in between (``moto_dynamodb_query`` keeps an index's candidates on that basis).
_writes = [0]


def generation() -> int | None:
    """How many serialised writes have ended in this process; None when this module's isolation is
    not installed (then writes are not counted, and nothing may be cached on the count)."""
    if not getattr(_backend_class().put_item, "_berth_isolated", False):
        return None
    return _writes[0]


@functools.cache
def _backend_class() -> Any:
    return moto_compat.resolve(_BACKEND)


@dataclass
class _Undo:
    table: Any
    hash_key: Any
    range_key: Any
    previous: Any  # a copy of the item before the transaction wrote it, or None if there was none

    def apply(self) -> None:
        if self.range_key is not None:
            bucket = self.table.items[self.hash_key]
            if self.previous is None:
                bucket.pop(self.range_key, None)
                if not bucket:
                    self.table.items.pop(self.hash_key, None)
            else:
                bucket[self.range_key] = self.previous
        elif self.previous is None:
            self.table.items.pop(self.hash_key, None)
        else:
            self.table.items[self.hash_key] = self.previous


def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
    """moto 5.2.5's `DynamoDBBackend.transact_write_items`, rolled back by an item-level undo journal."""
    exc = {
        name: moto_compat.surface(_EXC + name)
        for name in (
            "ConditionalCheckFailed",
            "MockValidationException",
            "MultipleTransactionsException",
            "TooManyTransactionsException",
            "TransactionCanceledException",
            "TransactWriteSingleOpException",
        )
    }
    get_filter_expression = moto_compat.surface("moto.dynamodb.models:get_filter_expression")
    if len(transact_items) > 100:
        raise exc["TooManyTransactionsException"]()

    journal: list[_Undo] = []
    stream_marks: dict[int, tuple[Any, int]] = {}

    def remember(table_name: str, key: dict[str, Any]) -> None:
        table = self.get_table(table_name)
        hash_key, range_key = self.get_keys_value(table, key)
        current = table.get_item(hash_key, range_key)
        journal.append(_Undo(table, hash_key, range_key, copy.deepcopy(current)))
        shard = table.stream_shard
        if shard is not None and id(shard) not in stream_marks:
            stream_marks[id(shard)] = (shard, len(shard.items))

    def rollback() -> None:
        for undo in reversed(journal):
            undo.apply()
        for shard, mark in stream_marks.values():
            del shard.items[mark:]

    target_items: set[tuple[str, str]] = set()

    def check_unicity(table_name: str, key: dict[str, Any]) -> None:
        item = (str(table_name), str(dict(sorted(key.items()))))
        if item in target_items:
            raise exc["MultipleTransactionsException"]()
        target_items.add(item)

    errors: list[tuple[str, str, dict[str, Any]] | tuple[None, None, None]] = []
    for item in transact_items:
        original_item: dict[str, Any] | None = None
        if len(list(item.keys())) > 1:
            raise exc["TransactWriteSingleOpException"]
        try:
            op_type, op = next(iter(item.items()))
            if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
                raise ValueError("Unsupported transaction operation")
            table_name = op["TableName"]
            condition_expression = op.get("ConditionExpression")
            names = op.get("ExpressionAttributeNames")
            values = op.get("ExpressionAttributeValues")
            return_values = op.get("ReturnValuesOnConditionCheckFailure")
            if op_type == "Put":
                attrs = op["Item"]
                table = self.get_table(table_name)
                key = {table.hash_key_attr: attrs[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs[table.range_key_attr]
            else:
                key = op["Key"]
            check_unicity(table_name, key)

            current = self.get_item(table_name, key)
            if condition_expression is not None:
                condition_op = get_filter_expression(condition_expression, names, values)
                if not condition_op.expr(current):
                    if return_values == "ALL_OLD" and current:
                        original_item = current.to_json()["Attributes"]
                    raise exc["ConditionalCheckFailed"](item=original_item)

            if op_type == "Put":
                remember(table_name, key)
                self.put_item(
                    table_name,
                    op["Item"],
                    condition_expression=condition_expression,
                    expression_attribute_names=names,
                    expression_attribute_values=values,
                )
            elif op_type == "Delete":
                remember(table_name, key)
                self.delete_item(
                    table_name,
                    key,
                    condition_expression=condition_expression,
                    expression_attribute_names=names,
                    expression_attribute_values=values,
                )
            elif op_type == "Update":
                remember(table_name, key)
                self.update_item(
                    table_name,
                    key,
                    update_expression=op["UpdateExpression"],
                    condition_expression=condition_expression,
                    expression_attribute_names=names,
                    expression_attribute_values=values,
                )
            errors.append((None, None, None))
        except (exc["MultipleTransactionsException"], exc["MockValidationException"]):
            rollback()
            raise
        except exc["ConditionalCheckFailed"] as e:
            errors.append(("ConditionalCheckFailed", str(e.message), original_item))  # type: ignore[arg-type]
        except Exception as e:  # moto records any other failure per item, as DynamoDB does
            errors.append((type(e).__name__, str(e), original_item))  # type: ignore[arg-type]

    if any(code is not None for code, _, _ in errors):
        rollback()
        raise exc["TransactionCanceledException"](errors)


def install() -> Callable[[], None]:
    """Serialise DynamoDB writes in this process and journal transactions; returns a function that
    undoes it. Raises `moto_compat.MotoCompatError` if a write method is missing or has changed."""
    moto_compat.check()
    backend = moto_compat.resolve(_BACKEND)
    if getattr(backend.put_item, "_berth_isolated", False):
        return lambda: None  # already installed (by the local cloud, or an enclosing test fixture)
    lock = WRITE_LOCK
    patches: list[moto_compat.Patch] = []
    for name in (*WRITE_OPERATIONS, *ITERATING_READS):
        path = f"{_BACKEND}.{name}"
        original = moto_compat.surface(path)
        implementation = transact_write_items if name == "transact_write_items" else original

        def isolated(
            *args: Any,
            __implementation: Any = implementation,
            __writes: bool = name in WRITE_OPERATIONS,
            **kwargs: Any,
        ) -> Any:
            with lock:
                try:
                    return __implementation(*args, **kwargs)
                finally:
                    if __writes:
                        _writes[0] += 1

        # name, docs and signature of moto's method (`__wrapped__`), so that `moto_compat.check()` still
        # checks moto's own surface once this wrapper is in place
        functools.update_wrapper(isolated, original)
        isolated._berth_isolated = True  # type: ignore[attr-defined]
        patches.append(moto_compat.replace(path, isolated))
    for name in ITEM_HANDLERS:
        path = f"{_HANDLER}.{name}"
        original = moto_compat.surface(path)

        def whole_request(*args: Any, __handler: Any = original, **kwargs: Any) -> Any:
            with lock:
                return __handler(*args, **kwargs)

        functools.update_wrapper(whole_request, original)
        patches.append(moto_compat.replace(path, whole_request))

    def undo() -> None:
        for patch in reversed(patches):
            patch.undo()

    return undo
