"""The job record and its state history, as stored and as the API returns them. Pure."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from berth.domain.job_spec import JobSpec
from berth.domain.placement import JobPlacement, Site
from berth.domain.status import JobStatus, check_transition
from berth.domain.workflow import RunState

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def new_job_id(now: datetime, entropy: bytes | None = None) -> str:
    """A sortable, unguessable id: ``j-`` + 10 chars of millisecond time + 16 random chars."""
    ms = int(now.timestamp() * 1000)
    rand = int.from_bytes(entropy if entropy is not None else secrets.token_bytes(10), "big")
    t = "".join(_CROCKFORD[(ms >> (5 * i)) & 31] for i in range(9, -1, -1))
    r = "".join(_CROCKFORD[(rand >> (5 * i)) & 31] for i in range(15, -1, -1))
    return f"j-{t}{r}"


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobEvent(BaseModel):
    """One state change. ``seq`` equals the job's version after the change."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    job_id: str
    seq: int
    at: datetime
    from_: JobStatus | None = Field(default=None, alias="from")
    to: JobStatus
    reason: str

    def public(self) -> dict[str, Any]:
        return {
            "at": iso(self.at),
            "from": None if self.from_ is None else str(self.from_),
            "to": str(self.to),
            "reason": self.reason,
        }


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str
    owner: str
    status: JobStatus
    reason: str
    spec: JobSpec
    created_at: datetime
    updated_at: datetime
    site: Site | None = None
    placement: JobPlacement | None = None
    attempts: int = 0
    cost_usd: float = 0.0
    version: int = 1
    #: Who submitted it (role session name or IAM user name), for audit; ``owner`` is the principal.
    actor: str | None = None
    #: The workflow's run state: the job's own part and its current attempt's; internal, never public.
    run: RunState = RunState()

    @model_validator(mode="after")
    def _site_matches_placement(self) -> Job:
        if self.placement is not None and self.site is not self.placement.site:
            raise ValueError(f"site {self.site} does not match the placement's site {self.placement.site}")
        return self

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "owner": self.owner,
            "actor": self.actor,
            "status": str(self.status),
            "reason": self.reason,
            "spec": self.spec.model_dump(mode="json", exclude_none=True),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "site": None if self.site is None else str(self.site),
            "placement": None if self.placement is None else self.placement.model_dump(mode="json"),
            "attempts": self.attempts,
            "cost_usd": round(self.cost_usd, 4),
            "started_at": None if self.run.attempt.started_at is None else iso(self.run.attempt.started_at),
            "checkpoint": self.checkpoint(),
        }

    def checkpoint(self) -> dict[str, Any] | None:
        """The last synced checkpoint ``{at, size_bytes, attempt}`` (None: none reported yet)."""
        run = self.run
        if run.checkpoint_at is None:
            return None
        return {
            "at": iso(run.checkpoint_at),
            "size_bytes": run.checkpoint_bytes,
            "attempt": run.checkpoint_attempt,
        }

    def transition(self, to: JobStatus, reason: str, now: datetime, **changes: Any) -> tuple[Job, JobEvent]:
        """The next version of this job and the event recording the move. Refuses illegal moves."""
        check_transition(self.status, to)
        now = self._not_before_last_change(now)
        nxt = self.model_copy(
            update={"status": to, "reason": reason, "updated_at": now, "version": self.version + 1, **changes}
        )
        event = JobEvent(job_id=self.id, seq=nxt.version, at=now, from_=self.status, to=to, reason=reason)
        return nxt, event

    def _not_before_last_change(self, now: datetime) -> datetime:
        """``now``, or the job's last change if that is later: a pass's clock is read when it starts,
        and it may place a job submitted after that (or another function's clock may be a little
        behind), so a job's events never go back in time."""
        return max(now, self.updated_at)

    def noted(self, reason: str, now: datetime) -> tuple[Job, JobEvent]:
        """The next version with a new reason and an event for it, the status unchanged (``from`` and
        ``to`` the same): something worth telling about a job that waits, e.g. why Batch has no
        instance for it yet."""
        now = self._not_before_last_change(now)
        nxt = self.model_copy(update={"reason": reason, "updated_at": now, "version": self.version + 1})
        event = JobEvent(
            job_id=self.id, seq=nxt.version, at=now, from_=self.status, to=self.status, reason=reason
        )
        return nxt, event

    def updated(self, now: datetime, **changes: Any) -> Job:
        """The next version of this job without a status change (no event)."""
        return self.model_copy(update={"updated_at": now, "version": self.version + 1, **changes})

    def notification(self, event: JobEvent) -> dict[str, Any]:
        """The detail of the ``Berth Job State Change`` event for ``event`` (ids and states, no spec)."""
        return {
            "tenant": self.tenant,
            "job_id": self.id,
            "seq": event.seq,
            "at": iso(event.at),
            "from": None if event.from_ is None else str(event.from_),
            "to": str(event.to),
            "reason": event.reason,
            "site": None if self.site is None else str(self.site),
            "placement": None if self.placement is None else self.placement.model_dump(mode="json"),
            "attempt": self.attempts,
            "cost_usd": round(self.cost_usd, 4),
        }


def new_job(
    job_id: str, tenant: str, owner: str, spec: JobSpec, now: datetime, actor: str | None = None
) -> tuple[Job, JobEvent]:
    reason = "waiting for placement"
    job = Job(
        id=job_id,
        tenant=tenant,
        owner=owner,
        actor=actor,
        status=JobStatus.QUEUED,
        reason=reason,
        spec=spec,
        created_at=now,
        updated_at=now,
    )
    return job, JobEvent(job_id=job_id, seq=1, at=now, from_=None, to=JobStatus.QUEUED, reason="submitted")
