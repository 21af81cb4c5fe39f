"""The circuits, for admins: each one's state as the scheduler core reads it (``CircuitBoard`` over
the same records a pass reads, under the stored policy's ``circuit`` rule), and a reset that closes
one circuit or every circuit of a region (docs/operations.md, "Circuits")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from berth.domain.errors import Forbidden, NotFound, ValidationFailed
from berth.domain.tenancy import Caller
from berth.logic.snapshot import SnapshotSource
from berth.scheduler.circuit import REGION_WIDE, CircuitBoard, circuit_state

REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$")
INSTANCE_TYPE_RE = re.compile(r"^(\*|[a-z0-9-]{1,32}\.[a-z0-9-]{1,32})$")


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


@dataclass(frozen=True)
class CircuitService:
    source: SnapshotSource

    def _require_admin(self, caller: Caller, what: str) -> None:
        if not caller.is_admin:
            raise Forbidden(f"only admins may {what} the circuits")

    def show(self, caller: Caller) -> dict[str, Any]:
        """Every circuit with a record: its state now, its failures since its last success within
        the rule's window, and when it opened and when it half-opens (admins)."""
        self._require_admin(caller, "read")
        now = self.source.clock().timestamp()
        rule = self.source.policy()[0].circuit
        records = self.source.circuit_records()
        board = CircuitBoard(records, now, rule)
        rows = []
        for rec in records:
            recent = [f for f in rec.failures if rec.last_success_at is None or f > rec.last_success_at]
            own = circuit_state(rec, now, rule)
            rows.append(
                {
                    "region": rec.region,
                    "instance_type": rec.instance_type,
                    "state": str(own),
                    "effective_state": str(board.state(rec.region, rec.instance_type)),
                    "recent_failures": len([f for f in recent if now - f <= rule.window_s]),
                    "last_failure_at": _iso(max(rec.failures) if rec.failures else None),
                    "last_success_at": _iso(rec.last_success_at),
                }
            )
        return {
            "as_of": _iso(now),
            "enabled": self.source.cloud_enabled,
            "rule": rule.model_dump(mode="json"),
            "circuits": rows,
        }

    def reset(self, caller: Caller, region: str, instance_type: str | None) -> dict[str, Any]:
        """Close one circuit (``instance_type``, ``'*'`` for the region's API) or every circuit of the
        region (None) by forgetting its failures (admins). NotFound when there was none to reset."""
        self._require_admin(caller, "reset")
        if not REGION_RE.fullmatch(region or ""):
            raise ValidationFailed(f"{region!r} is not a region (e.g. us-east-1)")
        if instance_type is not None and not INSTANCE_TYPE_RE.fullmatch(instance_type):
            raise ValidationFailed(
                f"{instance_type!r} is not an instance type (e.g. p5.48xlarge, or {REGION_WIDE!r})"
            )
        if self.source.circuits is None:
            raise NotFound("this deployment keeps no circuits")
        gone = self.source.circuits.reset(region, instance_type)
        if not gone:
            which = region if instance_type is None else f"{region}/{instance_type}"
            raise NotFound(f"no circuit of {which} has a record to reset")
        return {"reset": [{"region": r, "instance_type": t} for r, t in gone]}


__all__ = ["INSTANCE_TYPE_RE", "REGION_RE", "CircuitService"]
