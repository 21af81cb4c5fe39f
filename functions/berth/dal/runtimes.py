"""DynamoDB run-time history: one ``RUNTIMES#<tenant>`` item per tenant in the Tenants table, read by
each pass (one BatchGetItem for the tenants with jobs) and rewritten under its version when one of
the tenant's jobs completes (a lost race re-reads and applies the change again)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from berth.dal.errors import translated
from berth.dal.models import runtimes_model
from berth.domain.errors import Conflict, StoreUnavailable

PREFIX = "RUNTIMES#"
RETRIES = 8


class DynamoRuntimeHistory:
    def __init__(self, table_name: str) -> None:
        self._Row = runtimes_model(table_name)

    def _read(self, tenant: str) -> tuple[int, dict[str, Any] | None]:
        with translated("read run-time history"):
            try:
                row = self._Row.get(PREFIX + tenant, consistent_read=True)
            except self._Row.DoesNotExist:
                return 0, None
        return int(row.version), dict(row.history or {})

    def update(self, tenant: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> None:
        R = self._Row
        for _ in range(RETRIES):
            version, current = self._read(tenant)
            new = change(current)
            condition = R.pk.does_not_exist() if version == 0 else R.version == version
            try:
                with translated("write run-time history"):
                    R(PREFIX + tenant, version=version + 1, history=new).save(condition=condition)
                return
            except Conflict:
                continue
        raise StoreUnavailable(f"the run-time history of {tenant!r} kept changing; try again")

    def read(self, tenants: Iterable[str]) -> dict[str, dict[str, Any]]:
        keys = sorted({PREFIX + t for t in tenants})
        if not keys:
            return {}
        with translated("read run-time histories"):
            rows = list(self._Row.batch_get(keys))
        return {str(r.pk)[len(PREFIX) :]: dict(r.history or {}) for r in rows}
