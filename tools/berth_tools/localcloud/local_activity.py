"""Whether the local cloud has work in flight, read from moto in-process (for its idle back-off).

The local cloud fires the scheduler's timer every ``LOCAL_TIMER_S`` (2 s) so that leases are reaped
and placements retried quickly; with no job in flight a pass has nothing to reap, place or retry, so
the timer backs off to ``LOCAL_IDLE_TIMER_S`` (a host that stops heartbeating is still marked lost,
within its lease plus that interval). A new job triggers a pass through the scheduler's queue anyway.
Reading the jobs table through moto's API every 2 s would itself cost what the back-off saves; this
reads the table's items in-process (a declared surface), one attribute per job.
"""

from __future__ import annotations

from berth.domain.status import TERMINAL
from berth_tools.localcloud import moto_compat

_TERMINAL = frozenset(str(s) for s in TERMINAL)


def jobs_in_flight(account_id: str, region: str, table_name: str) -> bool:
    """True when the jobs table holds a job whose ``status`` is not terminal (or the table cannot be read)."""
    backends = moto_compat.surface("moto.dynamodb.models:dynamodb_backends")
    try:
        table = backends[account_id][region].tables[table_name]
    except KeyError:
        return True  # not knowing is not idle
    for entry in list(table.items.values()):
        items = list(entry.values()) if isinstance(entry, dict) else [entry]
        for item in items:
            status = item.attrs.get("status")
            if status is None:
                # An array's parent, counter or parameter chunk (dal/arrays.py): not a job; an array
                # with tasks left to create asks for its own passes (the expander's trigger).
                continue
            if str(status.value) not in _TERMINAL:
                return True
    return False
