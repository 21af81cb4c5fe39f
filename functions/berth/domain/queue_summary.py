"""A team's queue as the last scheduling pass saw it: each waiting job's position and estimated start.
Pure.

The pass computes them (``berth.scheduler.forecast``) for every job it read; they move every pass
(jobs ahead start, predicted ends shift), so they are not written on the jobs (that would be a write
per job per pass, which the pass avoids even for reasons). Instead the pass keeps one compact item per
team (``QUEUE#<tenant>`` in the Tenants table) holding its first ``MAX_PLACES`` waiting jobs, and
rewrites it only when what it says changed (estimates are kept to the minute). ``GET /v1/jobs/{id}``
of a queued job reads it (one GetItem) and answers ``queue_position`` and ``estimated_start``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from berth.domain.job import iso

#: Waiting jobs a team's summary holds (its queue's head, in the pass's order): about 60 bytes each.
MAX_PLACES = 200
_BASES = ("onprem", "burst")


@dataclass(frozen=True, slots=True)
class QueuePlace:
    position: int
    """1-based, in the order the pass serves the team's jobs."""
    estimated_start: datetime | None = None
    basis: str | None = None
    """``onprem``: on-prem GPUs of its model are predicted free then; ``burst``: its burst wait ends."""


@dataclass(frozen=True, slots=True)
class QueueSummary:
    tenant: str
    as_of: datetime
    """The pass that last changed it."""
    waiting: int
    """The team's queued jobs: those the pass read plus those behind its read budget."""
    places: Mapping[str, QueuePlace] = field(default_factory=dict)

    def same_as(self, other: QueueSummary | None) -> bool:
        """Says the same (whenever computed)."""
        return other is not None and (self.waiting, dict(self.places)) == (other.waiting, dict(other.places))

    def to_item(self) -> dict[str, Any]:
        rows = [
            [
                job_id,
                p.position,
                None if p.estimated_start is None else int(p.estimated_start.timestamp()),
                p.basis,
            ]
            for job_id, p in self.places.items()
        ]
        return {"as_of": iso(self.as_of), "waiting": self.waiting, "places": rows}

    @classmethod
    def from_item(cls, tenant: str, item: Mapping[str, Any]) -> QueueSummary:
        places = {
            str(job_id): QueuePlace(
                int(pos), None if est is None else datetime.fromtimestamp(int(est), UTC), basis
            )
            for job_id, pos, est, basis in item.get("places") or []
        }
        return cls(tenant, datetime.fromisoformat(str(item["as_of"])), int(item.get("waiting", 0)), places)

    def view(self, job_id: str) -> dict[str, Any]:
        """What the job API adds for a queued job of this team (None values when the pass has not
        ranked it: submitted since, or deeper than the summary's head)."""
        place = self.places.get(job_id)
        start = None if place is None else place.estimated_start
        return {
            "queue_position": None if place is None else place.position,
            "queue_length": self.waiting,
            "estimated_start": None if start is None else iso(start),
            "estimated_start_basis": None if place is None else place.basis,
            "queue_as_of": iso(self.as_of),
        }


def no_queue_view() -> dict[str, Any]:
    """The same fields for a job no summary speaks of (not queued, or no pass has run)."""
    return dict.fromkeys(
        ("queue_position", "queue_length", "estimated_start", "estimated_start_basis", "queue_as_of")
    )


def summarize(
    tenant: str,
    places: list[tuple[str, int, float | None, str | None]],
    unread: int,
    now: datetime,
) -> QueueSummary:
    """A team's summary from the pass's forecasts (``(job id, position, estimated start in epoch
    seconds, basis)`` in the pass's order): the first ``MAX_PLACES``, estimates to the minute (so a
    summary changes when the forecast does, not with every second of the clock)."""
    kept: dict[str, QueuePlace] = {}
    for job_id, position, at, basis in places[:MAX_PLACES]:
        start = None if at is None else datetime.fromtimestamp(round(at / 60) * 60, UTC)
        kept[job_id] = QueuePlace(position, start, basis if basis in _BASES else None)
    return QueueSummary(tenant, now, len(places) + unread, kept)
