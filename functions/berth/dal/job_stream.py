"""The job-events table's stream (NEW_IMAGE) as its consumer reads it: the rows inserted, the state
change each records (``events``), the notification each carries (``detail``) and the run a COMPLETED
row carries (``run_observation``). Pure: it decodes records Lambda passes, it calls nothing."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from boto3.dynamodb.types import TypeDeserializer
from pydantic import ValidationError
from pynamodb.attributes import UTCDateTimeAttribute

from berth.domain.job import JobEvent
from berth.domain.run_observation import RunObservation

_deserialize = TypeDeserializer().deserialize
_datetime = UTCDateTimeAttribute().deserialize


def inserted(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The new images of the INSERT records, in order, as plain values (modifications and removals
    are not job state changes: event rows are only ever inserted)."""
    out: list[dict[str, Any]] = []
    for record in records:
        if record.get("eventName") != "INSERT":
            continue
        image = (record.get("dynamodb") or {}).get("NewImage") or {}
        out.append({name: _deserialize(value) for name, value in image.items()})
    return out


def _json(value: Any) -> Any:
    """A JSONAttribute's value: pynamodb stores a JSON string."""
    return json.loads(value) if isinstance(value, str) else value


def events(images: Iterable[Mapping[str, Any]]) -> list[JobEvent]:
    """The state changes the rows record (``JobEventRow``: job, seq, at, from, to, reason), in
    order; a row that does not parse is skipped."""
    out: list[JobEvent] = []
    for image in images:
        try:
            out.append(
                JobEvent(
                    job_id=image["job_id"],
                    seq=int(image["seq"]),
                    at=_datetime(image["at"]),
                    from_=image.get("from_status"),
                    to=image["to_status"],
                    reason=image.get("reason") or "",
                )
            )
        except (KeyError, TypeError, ValueError, ValidationError):
            continue
    return out


def details(images: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The notifications (``Job.notification``) to publish, in order."""
    return [_json(image["detail"]) for image in images if image.get("detail") is not None]


def observations(images: Iterable[Mapping[str, Any]]) -> list[RunObservation]:
    """The completed runs the rows carry, in order. Rows without one (every other transition, and
    COMPLETED rows written before the attribute existed) are skipped, as is one that does not parse
    (the history is advisory)."""
    out: list[RunObservation] = []
    for image in images:
        raw = image.get("run_observation")
        if raw is None:
            continue
        try:
            out.append(RunObservation.from_dict(_json(raw)))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out
