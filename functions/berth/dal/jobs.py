"""DynamoDB job repository (pynamodb). Every write is conditional on the stored version."""

from __future__ import annotations

import re
from typing import Any

from pynamodb.connection import Connection
from pynamodb.transactions import TransactWrite

from berth.dal.errors import translated
from berth.dal.models import JobEventRow, JobRow, claim_model, event_model, job_model, tenant_model
from berth.dal.page_tokens import DynamoSigningKey, PageTokenCodec
from berth.dal.tenants import TENANT
from berth.domain.errors import AlreadySubmitted, Conflict, InvalidRequest, QuotaExceeded, StoreUnavailable
from berth.domain.idempotency import SubmitClaim
from berth.domain.job import Job, JobEvent, iso
from berth.domain.job_spec import JobSpec
from berth.domain.placement import Site
from berth.domain.ports import Page
from berth.domain.status import JobStatus
from berth.domain.workflow import RunState


def _failed_items(exc: Exception) -> set[int]:
    """Which items of a canceled transaction failed their condition (indexes), if known."""
    cause = exc.__cause__
    reasons = getattr(cause, "cancellation_reasons", None) or []
    return {i for i, r in enumerate(reasons) if r is not None and r.code == "ConditionalCheckFailed"}


_CREATED_KEY = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z#j-[0-9a-z]{26}")


def _tenant_status(tenant: str, status: JobStatus) -> str:
    return f"{tenant}#{status}"


def _created_key(job: Job) -> str:
    return f"{iso(job.created_at)}#{job.id}"


class DynamoJobRepository:
    def __init__(
        self,
        jobs_table: str,
        events_table: str,
        tenants_table: str,
        idempotency_table: str | None = None,
        tokens: PageTokenCodec | None = None,
    ) -> None:
        self._Job = job_model(jobs_table)
        self._Event = event_model(events_table)
        self._Tenant = tenant_model(tenants_table)
        self._Claim = None if idempotency_table is None else claim_model(idempotency_table)
        self._tokens = tokens or PageTokenCodec(DynamoSigningKey(tenants_table))
        self._conn = Connection()

    # -- mapping -------------------------------------------------------------------------------
    def _row(self, job: Job) -> JobRow:
        return self._Job(
            job_id=job.id,
            tenant=job.tenant,
            tenant_status=_tenant_status(job.tenant, job.status),
            created_key=_created_key(job),
            owner=job.owner,
            actor=job.actor,
            status=str(job.status),
            reason=job.reason,
            spec=job.spec.model_dump(mode="json", exclude_none=True),
            created_at=job.created_at,
            updated_at=job.updated_at,
            site=None if job.site is None else str(job.site),
            placement=None if job.placement is None else job.placement.model_dump(mode="json"),
            attempts=job.attempts,
            cost_usd=job.cost_usd,
            version=job.version,
            run=job.run.model_dump(mode="json", exclude_defaults=True) or None,
        )

    @staticmethod
    def _job(row: JobRow) -> Job:
        return Job(
            id=row.job_id,
            tenant=row.tenant,
            owner=row.owner,
            actor=row.actor,
            status=JobStatus(row.status),
            reason=row.reason,
            spec=JobSpec.model_validate(row.spec),
            created_at=row.created_at,
            updated_at=row.updated_at,
            site=None if row.site is None else Site(row.site),
            placement=row.placement,  # validated into the typed record by Job
            attempts=int(row.attempts),
            cost_usd=float(row.cost_usd),
            version=int(row.version),
            run=RunState.model_validate(row.run or {}),
        )

    def _event_row(self, event: JobEvent, job: Job) -> JobEventRow:
        return self._Event(
            job_id=event.job_id,
            seq=event.seq,
            at=event.at,
            from_status=None if event.from_ is None else str(event.from_),
            to_status=str(event.to),
            reason=event.reason,
            detail=job.notification(event),
        )

    # -- writes --------------------------------------------------------------------------------
    def create(self, job: Job, event: JobEvent, max_active: int, claim: SubmitClaim | None = None) -> None:
        """The job, its first event, the tenant's active-job counter and the idempotency claim (if
        any) move together; the counter's condition makes the quota hold under concurrent submits,
        the claim's makes a retried keyed submit find its job instead of creating another."""
        counter = self._Tenant.active_jobs
        try:
            with translated(f"create job {job.id}"), TransactWrite(connection=self._conn) as tx:
                tx.save(self._row(job), condition=self._Job.job_id.does_not_exist())
                tx.save(self._event_row(event, job), condition=self._Event.job_id.does_not_exist())
                tx.update(
                    self._Tenant(TENANT + job.tenant),
                    actions=[counter.add(1)],
                    condition=counter.does_not_exist() | (counter < max_active),
                )
                if claim is not None:
                    Claim = self._claim_model()
                    expires = int(claim.expires_at.timestamp())
                    now = int(job.created_at.timestamp())
                    tx.save(
                        Claim(claim.key, job_id=job.id, fingerprint=claim.fingerprint, expiration=expires),
                        # An expired claim (TTL deletion lags) may be taken over.
                        condition=Claim.id.does_not_exist() | (Claim.expiration < now),
                    )
        except Conflict as exc:
            # pynamodb sends puts before updates: job, event, [claim], counter.
            failed = _failed_items(exc)
            if claim is not None and 2 in failed:
                held = self._read_claim(claim.key)
                if held is not None:
                    raise AlreadySubmitted(held[0], held[1]) from exc
            if (3 if claim is not None else 2) in failed:
                raise QuotaExceeded(
                    f"tenant {job.tenant!r} is at its max_active_jobs ({max_active})"
                ) from exc
            raise

    def _claim_model(self) -> Any:
        if self._Claim is None:
            raise StoreUnavailable("no idempotency table configured for keyed submits")
        return self._Claim

    def _read_claim(self, key: str) -> tuple[str, str] | None:
        Claim = self._claim_model()
        with translated("read idempotency claim"):
            try:
                row = Claim.get(key, consistent_read=True)
            except Claim.DoesNotExist:
                return None
        return str(row.job_id), str(row.fingerprint)

    def save(self, job: Job, event: JobEvent) -> None:
        with translated(f"update job {job.id}"), TransactWrite(connection=self._conn) as tx:
            self.add_save(tx, job, event)

    def add_save(self, tx: TransactWrite, job: Job, event: JobEvent) -> None:
        """``save``'s items (the job under its version, its event, the tenant's counter when it ends)
        added to the transaction ``tx``."""
        tx.save(self._row(job), condition=self._Job.version == job.version - 1)
        tx.save(self._event_row(event, job), condition=self._Event.job_id.does_not_exist())
        if event.from_ is not None and event.from_.is_active and job.status.is_terminal:
            tx.update(self._Tenant(TENANT + job.tenant), actions=[self._Tenant.active_jobs.add(-1)])

    def set_reason(self, job: Job, reason: str) -> bool:
        """One UpdateItem of the ``reason`` attribute alone (no new version, no event), if the job is
        still at ``job.version`` in ``job.status``; False when it moved meanwhile."""
        J = self._Job
        try:
            with translated(f"update the reason of job {job.id}"):
                J._get_connection().update_item(
                    job.id,
                    actions=[J.reason.set(reason)],
                    condition=(J.version == job.version) & (J.status == str(job.status)),
                )
        except Conflict:
            return False
        return True

    def update(self, job: Job) -> None:
        """Store a new version of the job without a status change (no event), conditional on the
        stored version being the one before."""
        with translated(f"update job {job.id}"):
            self._row(job).save(condition=self._Job.version == job.version - 1)

    # -- reads ---------------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with translated(f"read job {job_id}"):
            try:
                return self._job(self._Job.get(job_id, consistent_read=True))
            except self._Job.DoesNotExist:
                return None

    def events(self, job_id: str) -> list[JobEvent]:
        with translated(f"read events of {job_id}"):
            return [
                JobEvent(
                    job_id=r.job_id,
                    seq=int(r.seq),
                    at=r.at,
                    from_=None if r.from_status is None else JobStatus(r.from_status),
                    to=JobStatus(r.to_status),
                    reason=r.reason,
                )
                for r in self._Event.query(job_id, consistent_read=True, scan_index_forward=True)
            ]

    def list_for_tenant(
        self, tenant: str, status: JobStatus | None, limit: int, next_token: str | None
    ) -> Page:
        start = self._decode_token(next_token, tenant, status) if next_token else None
        with translated(f"list jobs of {tenant}"):
            if status is None:
                result = self._Job.by_tenant.query(  # type: ignore[attr-defined]
                    tenant, scan_index_forward=False, limit=limit, last_evaluated_key=start
                )
            else:
                result = self._Job.by_tenant_status.query(  # type: ignore[attr-defined]
                    _tenant_status(tenant, status),
                    scan_index_forward=False,
                    limit=limit,
                    last_evaluated_key=start,
                )
            jobs = [self._job(r) for r in result]
            last = result.last_evaluated_key
        return Page(jobs=jobs, next_token=self._encode_token(last, tenant, status) if last else None)

    def list_by_status(self, status: JobStatus, limit: int) -> list[Job]:
        with translated(f"list {status} jobs"):
            result = self._Job.by_status.query(  # type: ignore[attr-defined]
                str(status), scan_index_forward=True, limit=limit
            )
            return [self._job(r) for r in result]

    def count_active(self, tenant: str) -> int:
        with translated(f"count active jobs of {tenant}"):
            try:
                row = self._Tenant.get(TENANT + tenant, consistent_read=True)
            except self._Tenant.DoesNotExist:
                return 0
        return int(row.active_jobs or 0)

    # Pagination tokens are signed and expire (PageTokenCodec), and are bound to the tenant and filter
    # that produced them, so a token can never be replayed to read another tenant's index partition.
    def _encode_token(self, key: dict[str, Any], tenant: str, status: JobStatus | None) -> str:
        return self._tokens.encode({"t": tenant, "s": None if status is None else str(status), "k": key})

    def _decode_token(self, token: str, tenant: str, status: JobStatus | None) -> dict[str, Any]:
        return _check_token(self._tokens.decode(token), tenant, status)


def _check_token(data: dict[str, Any], tenant: str, status: JobStatus | None) -> dict[str, Any]:
    bad = InvalidRequest("next_token is not valid for this query; start again without it")
    if data.get("t") != tenant:
        raise bad
    if data.get("s") != (None if status is None else str(status)):
        raise bad
    key = data.get("k")
    if not isinstance(key, dict) or not all(
        isinstance(v, dict) and set(v) == {"S"} and isinstance(v["S"], str) and v["S"] for v in key.values()
    ):
        raise bad
    expected_hash = "tenant" if status is None else "tenant_status"
    expected_hash_val = tenant if status is None else _tenant_status(tenant, status)
    if set(key) != {"job_id", "created_key", expected_hash} or key[expected_hash]["S"] != expected_hash_val:
        raise bad
    if not _CREATED_KEY.fullmatch(key["created_key"]["S"]) or not key["created_key"]["S"].endswith(
        "#" + key["job_id"]["S"]
    ):
        raise bad
    return key
