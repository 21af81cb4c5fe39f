"""DynamoDB queue summaries: one ``QUEUE#<tenant>`` item per tenant in the Tenants table, replaced by
the scheduling pass when the tenant's queue changed, read by the job API (one GetItem)."""

from __future__ import annotations

from berth.dal.errors import translated
from berth.dal.models import queue_summary_model
from berth.domain.queue_summary import QueueSummary

PREFIX = "QUEUE#"


class DynamoQueueSummaries:
    def __init__(self, table_name: str) -> None:
        self._Row = queue_summary_model(table_name)

    def put(self, summary: QueueSummary) -> None:
        with translated("write queue summary"):
            self._Row(PREFIX + summary.tenant, summary=summary.to_item()).save()

    def get(self, tenant: str) -> QueueSummary | None:
        with translated("read queue summary"):
            try:
                row = self._Row.get(PREFIX + tenant)
            except self._Row.DoesNotExist:
                return None
        return QueueSummary.from_item(tenant, dict(row.summary or {}))
