"""Fleet and policy use cases: the stored policy and offers (admin writes, versioned), the
submit-time feasibility check, ``explain`` and ``capacity``. Everything the scheduler core says
is rendered from its own typed outcome (``check_feasible``, ``explain_job``); nothing is re-derived.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from berth.domain.errors import Conflict, Forbidden, Infeasible, NotFound, ValidationFailed
from berth.domain.fleet import MAX_HOST_GPUS, Admission, StoredDocument
from berth.domain.job import Job
from berth.domain.job_spec import JobSpec
from berth.domain.ports import TenantRecord
from berth.domain.status import JobStatus
from berth.domain.storage import dataset_names
from berth.domain.tenancy import Caller
from berth.logic.gpu_faults import gpu_fault_rows
from berth.logic.jobs import JobService
from berth.logic.snapshot import (
    OFFERS,
    POLICY,
    Fleet,
    OffersDocument,
    SnapshotSource,
    default_document,
    tenant_state,
    undeployed,
)
from berth.scheduler.circuit import CircuitBoard
from berth.scheduler.explain import explain_job, not_considered
from berth.scheduler.feasibility import check_feasible
from berth.scheduler.policy import load_policy

KINDS = (POLICY, OFFERS)


def _validation_details(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in err.get("loc", ())), "message": str(err.get("msg", "invalid"))}
        for err in exc.errors()
    ]


def document_out(doc: StoredDocument) -> dict[str, Any]:
    return {
        "kind": doc.kind,
        "version": doc.version,
        "source": "default" if doc.version == 0 else "stored",
        "updated_at": None if doc.updated_at is None else doc.updated_at.isoformat(),
        "updated_by": doc.updated_by,
        "document": doc.document,
    }


@dataclass(frozen=True)
class FleetService:
    source: SnapshotSource
    #: How long ``check`` reuses a fleet it read (0: always read).
    cache_s: float = 0.0
    _cache: dict[frozenset[str], tuple[float, Fleet]] = field(default_factory=dict, repr=False)

    def clear_cache(self) -> None:
        self._cache.clear()

    def _check_fleet(self, datasets: frozenset[str]) -> Fleet:
        now = self.source.clock().timestamp()
        hit = self._cache.get(datasets)
        if hit is not None and now < hit[0]:
            return hit[1]
        # The feasibility check never reads the circuits (an open circuit is not infeasibility).
        fleet = self.source.fleet(datasets, circuits=False)
        if self.cache_s > 0:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[datasets] = (now + self.cache_s, fleet)
        return fleet

    # -- stored documents ---------------------------------------------------------------------
    def get_document(self, caller: Caller, kind: str, version: int | None = None) -> StoredDocument:
        """Any member may read the policy and offers (they decide where its jobs go)."""
        del caller
        if version is None or version == 0:
            return self.source.document(kind) if version is None else self._default(kind)
        found = self.source.documents.version(kind, version)
        if found is None:
            raise NotFound(f"{kind} version {version} not found")
        return found

    def _default(self, kind: str) -> StoredDocument:
        return default_document(kind, self.source.capacity)

    def put_document(
        self, caller: Caller, kind: str, document: Any, expected_version: int | None
    ) -> StoredDocument:
        """Validate and store a new version (admins). ``expected_version`` (If-Match): the version
        the admin edited; without it, the version current now. Conflict when another admin won."""
        if not caller.is_admin:
            raise Forbidden(f"only admins may replace the {kind}")
        normalized = self._validate(kind, document)
        current = self.source.documents.current(kind)
        current_version = 0 if current is None else current.version
        if expected_version is not None and expected_version != current_version:
            raise Conflict(
                f"the {kind} is at version {current_version}, not {expected_version}; read it again",
                details={"current_version": current_version},
            )
        return self.source.documents.put(kind, normalized, current_version, self.source.clock(), caller.name)

    def _validate(self, kind: str, document: Any) -> Any:
        if not isinstance(document, dict):
            raise ValidationFailed(f"the {kind} is a JSON object")
        try:
            if kind == POLICY:
                return load_policy(document).model_dump(mode="json")
            offers = OffersDocument.model_validate(document)
        except ValidationError as exc:
            details = _validation_details(exc)
            message = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
            raise ValidationFailed(f"invalid {kind}: {message}", details=details) from exc
        # Only what a deployed compute environment runs (its own instance type's queue, if one is named).
        missing = undeployed((o.offer() for o in offers.offers), self.source.capacity)
        if missing:
            raise ValidationFailed(
                f"invalid {kind}: no deployed compute environment runs {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                + " (or an offer names a queue other than its instance type's)",
                details=[{"field": "offers", "message": f"not deployed: {m}"} for m in missing],
            )
        return offers.model_dump(mode="json")

    # -- submit-time feasibility --------------------------------------------------------------
    def check(self, spec: JobSpec, tenant: str, record: TenantRecord | None = None) -> None:
        """``JobService.feasibility``: Infeasible (422) naming the core's rule when no host or offer
        could ever take the job. ``record``: the tenant's record the submit already read (its
        quota); None reads it."""
        fleet = self._check_fleet(frozenset(dataset_names(spec)))
        quota = self.source.tenants.quota(tenant) if record is None else record.quota
        state = tenant_state(tenant, quota)
        verdict = check_feasible(spec, state, fleet.policy, fleet.hosts, fleet.offers)
        if verdict is None:
            return
        raise Infeasible(
            f"no host or cloud offer could ever run this job ({verdict.rule}): {verdict.message}",
            details={
                "rule": str(verdict.rule),
                "sites": [
                    {"rule": str(ex.rule), "message": ex.message, "subject": ex.subject}
                    for ex in verdict.details
                ],
                "policy_version": fleet.policy_version,
                **({} if verdict.largest is None else {"largest_shape": verdict.largest.to_dict()}),
            },
        )

    # -- explain ------------------------------------------------------------------------------
    def explain(self, jobs: JobService, caller: Caller, job_id: str) -> dict[str, Any]:
        """Why a job is pending (the core's outcome for it in a pass over the store now), or where
        it was placed. The same tenant check as reading the job."""
        job = jobs.get(caller, job_id)
        if not job.status.is_active or job.placement is not None:
            return _settled(job)
        snapshot, fleet, _pending = self.source.snapshot()
        now = self.source.clock().timestamp()
        out = _described(job)
        try:
            explanation = explain_job(snapshot, fleet.policy, now, job.id)
        except KeyError:
            # Not pending in a snapshot read after the job: a pass may have placed it in between.
            fresh = jobs.get(caller, job_id)
            if not fresh.status.is_active or fresh.placement is not None:
                return _settled(fresh)
            unread = not_considered(snapshot, job.tenant) if job.status is JobStatus.QUEUED else None
            out.update(outcome="not-pending" if unread is None else "not-considered", explanation=unread)
            return out
        out.update(
            outcome=explanation.outcome,
            explanation=explanation.to_dict(),
            policy_version=fleet.policy_version,
            offers_version=fleet.offers_version,
        )
        return out

    # -- capacity -----------------------------------------------------------------------------
    def drain(self, caller: Caller, host_id: str, body: Any) -> dict[str, Any]:
        """An operator's drain of a host (admins; body ``{"drain": true|false}``): the scheduler
        places nothing more there and the host's next heartbeat answers ``drain`` (its agent stops
        taking work; running attempts finish). ``false`` lifts it. NotFound for a host never
        registered. The caller is checked before the body, as for the documents."""
        if not caller.is_admin:
            raise Forbidden("only admins may drain hosts")
        if not isinstance(body, dict) or set(body) != {"drain"} or not isinstance(body["drain"], bool):
            raise ValidationFailed('the body is {"drain": true} or {"drain": false}')
        drain = body["drain"]
        self.source.hosts.request_drain(host_id, drain)
        self.clear_cache()
        return {"host_id": host_id, "drain_requested": drain}

    def admit(self, caller: Caller, host_id: str, body: Any) -> dict[str, Any]:
        """An admin's admission of a host (body ``{"gpu_type": "H200", "gpus": 8}``): what its
        registrations may report at most from now on (its first registration fixed it before). The
        GPUs it has now are not changed: its agent's next registration is checked against it."""
        if not caller.is_admin:
            raise Forbidden("only admins may admit host inventory")
        try:
            admission = Admission.model_validate(body, strict=True)
        except ValidationError as exc:
            raise ValidationFailed(
                f'the body is {{"gpu_type": "<model>", "gpus": 0..{MAX_HOST_GPUS}}}',
                details=_validation_details(exc),
            ) from exc
        self.source.hosts.admit(host_id, admission)
        return {"host_id": host_id, "admitted": admission.model_dump()}

    def capacity(self, caller: Caller) -> dict[str, Any]:
        """Pools, hosts, free and used GPUs; cloud regions and their circuit state. Each host's
        ``attempts`` (``<job id>#<attempt>``) name only the caller's own tenant's jobs, unless the
        caller is an admin: another team's job ids are not a member's to see."""
        fleet = self.source.fleet()
        visible = self._visible_attempts(caller, [k for rec in fleet.records for k in rec.holds])
        now = self.source.clock()
        pools: dict[str, dict[str, Any]] = {}
        for rec in fleet.records:
            inv = rec.inventory
            pool = pools.setdefault(inv.pool, {"pool": inv.pool, "hosts": 0, "healthy_hosts": 0, **_zero()})
            alive = rec.alive(now)
            offers = rec.schedulable(now)
            pool["hosts"] += 1
            pool["healthy_hosts"] += int(alive)
            model = pool.setdefault("models", {}).setdefault(inv.gpu_type, _zero())
            for counts in (pool, model):
                counts["gpus"] += rec.gpus
                counts["used_gpus"] += len(rec.held_gpu_ids)
                # A host that is unhealthy, past its lease or draining offers nothing.
                counts["free_gpus"] += rec.free_gpus if offers else 0
                counts["unavailable_gpus"] += 0 if offers else rec.free_gpus
                # GPUs with a fatal fault (held ones too, while their attempt stops): never placed on.
                counts["faulted_gpus"] += len(rec.faulted_gpu_ids)
        hosts = [
            {
                "host_id": rec.host_id,
                "pool": rec.inventory.pool,
                "gpu_type": rec.inventory.gpu_type,
                "gpus": rec.gpus,
                "free_gpus": rec.free_gpus,
                "used_gpus": len(rec.held_gpu_ids),
                "cpu": rec.inventory.cpu,
                "memory_gib": rec.inventory.memory_gib,
                "labels": dict(rec.inventory.labels),
                "containment": rec.inventory.containment,
                "healthy": rec.healthy,
                "alive": rec.alive(now),
                "draining": rec.draining or rec.drain_requested,
                "lease_expires_at": None
                if rec.lease_expires_at is None
                else rec.lease_expires_at.isoformat(),
                "attempts": sorted(k for k in rec.holds if k in visible),
                "admitted_gpus": None if rec.admitted is None else rec.admitted.gpus,
                "degraded": rec.degraded,
                "gpu_faults": gpu_fault_rows(rec),
            }
            for rec in fleet.records
        ]
        board = CircuitBoard(fleet.circuits, now.timestamp(), fleet.policy.circuit)
        regions: dict[str, dict[str, Any]] = defaultdict(dict)
        for o in fleet.offers:
            r = regions[o.region]
            r.setdefault("region", o.region)
            r.setdefault("instance_types", {})
            r["instance_types"][o.instance_type] = {
                "gpu_type": o.gpu_type,
                "gpus": o.gpus,
                "circuit": str(board.state(o.region, o.instance_type)),
            }
        region_rows = [
            {
                "region": name,
                "circuit": str(board.state(name, "*")),
                "instance_types": [
                    {"instance_type": k, **v} for k, v in sorted(regions[name]["instance_types"].items())
                ],
            }
            for name in sorted(regions)
        ]
        totals: dict[str, int] = {"hosts": len(fleet.records), **_zero()}
        for p in pools.values():
            for k in _zero():
                totals[k] += p[k]
        return {
            "as_of": now.isoformat(),
            "totals": totals,
            "pools": [pools[k] for k in sorted(pools)],
            "hosts": hosts,
            "cloud": {
                "enabled": self.source.cloud_enabled,
                "offers_version": fleet.offers_version,
                "regions": region_rows,
            },
            "policy_version": fleet.policy_version,
        }

    def _visible_attempts(self, caller: Caller, keys: list[str]) -> set[str]:
        """The hold keys ``caller`` may see: all for an admin, else those of its tenant's jobs (one
        batch read of the held jobs; a hold whose job is not found is shown to admins only)."""
        if caller.is_admin:
            return set(keys)
        job_ids = {k.rpartition("#")[0] for k in keys}
        jobs = self.source.jobs.get_many(sorted(job_ids)) if job_ids else {}
        return {
            k
            for k in keys
            if (job := jobs.get(k.rpartition("#")[0])) is not None and job.tenant == caller.tenant
        }


def _zero() -> dict[str, int]:
    return {"gpus": 0, "used_gpus": 0, "free_gpus": 0, "unavailable_gpus": 0, "faulted_gpus": 0}


def _described(job: Job) -> dict[str, Any]:
    """What explain says of any job before its outcome."""
    return {
        "job_id": job.id,
        "tenant": job.tenant,
        "status": str(job.status),
        "reason": job.reason,
        "site": None if job.site is None else str(job.site),
        "placement": None if job.placement is None else job.placement.model_dump(mode="json"),
    }


def _settled(job: Job) -> dict[str, Any]:
    """Explain of a job that is placed or has ended: where, and no explanation."""
    out = _described(job)
    out.update(outcome="placed" if job.placement is not None else "finished", explanation=None)
    return out
