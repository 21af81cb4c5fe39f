"""DynamoDB usage ledger (``UsageLedger``): one item per job attempt in the Usage table.

A write is a conditional put. A running attempt's record (written by the scheduling pass) replaces
only an open record of less run time; the attempt's final record (written when it ends) replaces
any open record and a final one of no more run time. So a write that is retried, or that arrives
after a later one, never counts twice nor lowers the total, and a late running record never
replaces the final one. The final record can also go into the transaction that ends the job
(``add_record``, used by ``DynamoJobRepository.save``): one call for both.
"""

from __future__ import annotations

from pynamodb.expressions.condition import Condition
from pynamodb.transactions import TransactWrite

from berth.dal.errors import translated
from berth.dal.models import UsageRow, usage_model
from berth.domain.cost import AttemptUsage
from berth.domain.errors import Conflict
from berth.domain.placement import Site


def _pk(tenant: str, month: str) -> str:
    return f"{tenant}#{month}"


def _sk(job_id: str, attempt: int) -> str:
    return f"{job_id}#{attempt:04d}"


class DynamoUsageLedger:
    def __init__(self, table_name: str) -> None:
        self._Row = usage_model(table_name)

    def record(self, usage: AttemptUsage) -> bool:
        row, condition = self._put(usage)
        try:
            with translated(f"record usage of {usage.job_id} attempt {usage.attempt}"):
                row.save(condition=condition)
        except Conflict:
            return False
        return True

    def add_record(self, tx: TransactWrite, usage: AttemptUsage) -> None:
        """``record``'s put as one item of the transaction ``tx``: its condition (no record of more
        run time stored) failing cancels the whole transaction."""
        row, condition = self._put(usage)
        tx.save(row, condition=condition)

    def _put(self, usage: AttemptUsage) -> tuple[UsageRow, Condition]:
        R = self._Row
        row = R(
            _pk(usage.tenant, usage.month),
            _sk(usage.job_id, usage.attempt),
            tenant=usage.tenant,
            month=usage.month,
            job_id=usage.job_id,
            attempt=usage.attempt,
            site=str(usage.site),
            location=usage.location,
            gpus=usage.gpus,
            seconds=usage.seconds,
            hourly_usd=usage.hourly_usd,
            final=usage.final,
        )
        # pynamodb builds conditions from comparisons: ``R.final == False`` is one, not a bool.
        open_ = R.final == False  # noqa: E712
        if usage.final:
            condition = R.pk.does_not_exist() | open_ | (R.seconds <= usage.seconds)
        else:
            condition = R.pk.does_not_exist() | (open_ & (R.seconds < usage.seconds))
        return row, condition

    def month(self, tenant: str, month: str) -> list[AttemptUsage]:
        with translated(f"read usage of {tenant} in {month}"):
            rows = list(self._Row.query(_pk(tenant, month), consistent_read=True))
        return [_usage(r) for r in rows]


def _usage(row: UsageRow) -> AttemptUsage:
    return AttemptUsage(
        tenant=row.tenant,
        month=row.month,
        job_id=row.job_id,
        attempt=int(row.attempt),
        site=Site(row.site),
        location=row.location,
        gpus=int(row.gpus),
        seconds=float(row.seconds),
        hourly_usd=float(row.hourly_usd),
        final=bool(row.final),
    )
