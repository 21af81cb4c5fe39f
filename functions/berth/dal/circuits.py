"""DynamoDB circuit repository: the cloud's health signal as one ``CIRCUITS`` item in the Tenants
table, read whole by each pass (one GetItem) and rewritten under its version (a lost race re-reads;
writers are few: the submit and Batch-events functions and the pass)."""

from __future__ import annotations

import time
from typing import Any

from berth.dal.errors import translated
from berth.dal.models import circuits_model
from berth.domain.cloud import circuit_key, record_circuit_event, reset_circuit_records
from berth.domain.errors import Conflict, StoreUnavailable
from berth.domain.ports import CircuitEntry

PK = "CIRCUITS"
RETRIES = 8
#: A success on a circuit this sandbox saw clean (no failure since its last success) less than this
#: long ago reads and writes nothing: in a burst, one read per circuit per window, not one per job.
CLEAN_MEMO_S = 5.0


class DynamoCircuitRepository:
    """The CIRCUITS item. A success is recorded only where a failure awaits it, which needs a read;
    a success on a circuit seen clean within ``CLEAN_MEMO_S`` skips that read (a failure another
    function records meanwhile is cleared by the first success after the memo lapses, at most
    ``CLEAN_MEMO_S`` later). Failures always read and write."""

    def __init__(self, table_name: str, clean_memo_s: float = CLEAN_MEMO_S) -> None:
        self._Row = circuits_model(table_name)
        self._clean_memo_s = clean_memo_s
        self._clean: dict[str, float] = {}  # circuit key -> monotonic time it was seen clean

    def _read(self) -> tuple[int, dict[str, dict[str, Any]]]:
        with translated("read circuits"):
            try:
                row = self._Row.get(PK, consistent_read=True)
            except self._Row.DoesNotExist:
                return 0, {}
        return int(row.version), dict(row.circuits or {})

    def _record(self, region: str, instance_type: str, at: float, failed: bool) -> None:
        R = self._Row
        key = circuit_key(region, instance_type)
        if failed:
            self._clean.pop(key, None)
        elif time.monotonic() - self._clean.get(key, -self._clean_memo_s) < self._clean_memo_s:
            return
        for _ in range(RETRIES):
            version, circuits = self._read()
            new = record_circuit_event(circuits, region, instance_type, at, failed)
            if new is None:
                self._clean[key] = time.monotonic()
                return
            condition = R.pk.does_not_exist() if version == 0 else R.version == version
            try:
                with translated("write circuits"):
                    R(PK, version=version + 1, circuits=new).save(condition=condition)
                if not failed:
                    self._clean[key] = time.monotonic()
                return
            except Conflict:
                continue
        raise StoreUnavailable("the circuits kept changing; try again")

    def record_failure(self, region: str, instance_type: str, at: float) -> None:
        self._record(region, instance_type, at, True)

    def record_success(self, region: str, instance_type: str, at: float) -> None:
        self._record(region, instance_type, at, False)

    def reset(self, region: str, instance_type: str | None) -> list[tuple[str, str]]:
        R = self._Row
        for _ in range(RETRIES):
            version, circuits = self._read()
            kept, gone = reset_circuit_records(circuits, region, instance_type)
            if not gone:
                return []
            try:
                with translated("reset circuits"):
                    R(PK, version=version + 1, circuits=kept).save(condition=R.version == version)
            except Conflict:
                continue
            for key in gone:
                self._clean.pop(key, None)
            return [(str(circuits[k]["region"]), str(circuits[k]["instance_type"])) for k in gone]
        raise StoreUnavailable("the circuits kept changing; try again")

    def list(self) -> list[CircuitEntry]:
        _, circuits = self._read()
        return [
            CircuitEntry(
                region=str(v["region"]),
                instance_type=str(v["instance_type"]),
                failures=tuple(float(f) for f in v.get("failures", [])),
                last_success_at=None if v.get("last_success_at") is None else float(v["last_success_at"]),
            )
            for _, v in sorted(circuits.items())
        ]
