"""Translate pynamodb/botocore failures into domain errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError
from pynamodb.exceptions import PynamoDBException, TransactWriteError

from berth.domain.errors import Conflict, StoreUnavailable

_CONDITION_CODES = {"ConditionalCheckFailedException", "TransactionConflictException"}
# Per-item reasons inside a TransactionCanceledException.
_REASON_CODES = {"ConditionalCheckFailed", "TransactionConflict"}


def _code(exc: PynamoDBException) -> str | None:
    return exc.cause_response_code if hasattr(exc, "cause_response_code") else None


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run a store operation; lost conditional writes become Conflict, the rest StoreUnavailable."""
    try:
        yield
    except TransactWriteError as exc:
        reasons = [r.code for r in (exc.cancellation_reasons or []) if r is not None]
        if _code(exc) in _CONDITION_CODES or any(r in _REASON_CODES for r in reasons):
            raise Conflict(f"{what}: the record changed concurrently; re-read and retry") from exc
        raise StoreUnavailable(f"{what}: state store unavailable ({_code(exc)})") from exc
    except PynamoDBException as exc:
        if _code(exc) in _CONDITION_CODES:
            raise Conflict(f"{what}: the record changed concurrently; re-read and retry") from exc
        raise StoreUnavailable(f"{what}: state store unavailable ({_code(exc)})") from exc
    except (BotoCoreError, ClientError) as exc:
        raise StoreUnavailable(f"{what}: state store unavailable ({exc.__class__.__name__})") from exc


def failed_conditions(exc: Exception) -> set[int]:
    """Which items of a canceled transaction (a ``Conflict`` raised by ``translated``) failed their
    condition, by index, if known."""
    cause = exc.__cause__
    reasons = getattr(cause, "cancellation_reasons", None) or []
    return {i for i, r in enumerate(reasons) if r is not None and r.code == "ConditionalCheckFailed"}
