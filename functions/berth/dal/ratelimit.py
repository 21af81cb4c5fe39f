"""DynamoDB rate-limit counter: one conditional ADD per request on the tenant's current window."""

from __future__ import annotations

from pynamodb.exceptions import UpdateError

from berth.dal.errors import translated
from berth.dal.models import rate_model

RATE = "RATE#"


class DynamoRateCounter:
    """Fixed windows in the Tenants table (``RATE#<tenant>#<window>``), expired by its TTL."""

    def __init__(self, table_name: str) -> None:
        self._Row = rate_model(table_name)

    def take(self, tenant: str, window: int, limit: int, expires_at: int) -> bool:
        row = self._Row(f"{RATE}{tenant}#{window}")
        hits = self._Row.hits
        with translated(f"count a request of {tenant}"):
            try:
                row.update(
                    actions=[hits.add(1), self._Row.expires_at.set(expires_at)],
                    condition=hits.does_not_exist() | (hits < limit),
                )
            except UpdateError as exc:
                if exc.cause_response_code == "ConditionalCheckFailedException":
                    return False  # the window is full
                raise
        return True
