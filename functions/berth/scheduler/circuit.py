"""Circuit breakers over cloud capacity: recent capacity/API errors in a region or instance type
open the circuit (placement steers elsewhere); after ``open_s`` it half-opens (a few probes per
pass); a success after the failures closes it."""

from __future__ import annotations

from enum import StrEnum

from berth.scheduler.policy import CircuitRule
from berth.scheduler.snapshot import CircuitRecord

REGION_WIDE = "*"


class CircuitState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half-open"
    OPEN = "open"


_SEVERITY = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


def circuit_state(record: CircuitRecord, now: float, rule: CircuitRule) -> CircuitState:
    """State of one circuit at ``now``: open when ``failure_threshold`` failures (since the last
    success) fall within ``window_s``, for ``open_s`` after the last of them; then half-open."""
    recent = sorted(f for f in record.failures if f <= now)
    if record.last_success_at is not None:
        recent = [f for f in recent if f > record.last_success_at]
    k = rule.failure_threshold
    opened_at: float | None = None
    for i in range(k - 1, len(recent)):
        if recent[i] - recent[i - k + 1] <= rule.window_s:
            opened_at = recent[i]
    if opened_at is None:
        return CircuitState.CLOSED
    if now - opened_at < rule.open_s:
        return CircuitState.OPEN
    return CircuitState.HALF_OPEN


class CircuitBoard:
    """All circuits of a snapshot, evaluated once per pass."""

    __slots__ = ("_states",)

    def __init__(self, records: tuple[CircuitRecord, ...], now: float, rule: CircuitRule) -> None:
        self._states: dict[tuple[str, str], CircuitState] = {}
        for rec in records:
            state = circuit_state(rec, now, rule)
            key = (rec.region, rec.instance_type)
            old = self._states.get(key, CircuitState.CLOSED)
            self._states[key] = state if _SEVERITY[state] > _SEVERITY[old] else old

    def state(self, region: str, instance_type: str) -> CircuitState:
        wide = self._states.get((region, REGION_WIDE), CircuitState.CLOSED)
        own = self._states.get((region, instance_type), CircuitState.CLOSED)
        return wide if _SEVERITY[wide] > _SEVERITY[own] else own
