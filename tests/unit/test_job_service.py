from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from berth.domain.errors import Conflict, Forbidden, NotFound, QuotaExceeded, Unauthenticated
from berth.domain.identity import Identity
from berth.domain.job_spec import JobSpec
from berth.domain.ports import TenantRecord
from berth.domain.status import JobStatus
from berth.domain.tenancy import Caller, Quota, Role, canonical_principal
from berth.logic.jobs import JobService
from berth.logic.tenants import TenantService
from tests.unit.fakes import FakeJobs, FakeTenants, fake_store

ALICE = Caller("arn:aws:iam::1:user/alice", "vision", Role.MEMBER)
BOB = Caller("arn:aws:iam::1:user/bob", "nlp", Role.MEMBER)
SPEC = JobSpec.model_validate({"name": "r", "image": "busybox", "command": ["true"]})


@pytest.fixture
def svc() -> JobService:
    ticks = count()
    t0 = datetime(2026, 11, 29, tzinfo=UTC)
    jobs, tenants = fake_store()
    tenants.put_member(ALICE.principal, "vision", "member")
    return JobService(jobs, tenants, clock=lambda: t0 + timedelta(seconds=next(ticks)))


def test_submit_records_queued_job_and_event(svc: JobService) -> None:
    job = svc.submit(ALICE, SPEC)
    assert job.status is JobStatus.QUEUED and job.tenant == "vision" and job.owner == ALICE.principal
    [ev] = svc.events(ALICE, job.id)
    assert ev.from_ is None and ev.to is JobStatus.QUEUED and ev.seq == 1


def test_other_tenant_sees_not_found(svc: JobService) -> None:
    job = svc.submit(ALICE, SPEC)
    with pytest.raises(NotFound):
        svc.get(BOB, job.id)
    with pytest.raises(NotFound):
        svc.cancel(BOB, job.id)
    assert svc.list_jobs(BOB, None, 10, None).jobs == []


def test_cancel_is_idempotent(svc: JobService) -> None:
    job = svc.submit(ALICE, SPEC)
    first = svc.cancel(ALICE, job.id)
    again = svc.cancel(ALICE, job.id)
    assert first.status is again.status is JobStatus.CANCELED
    assert [e.to for e in svc.events(ALICE, job.id)] == [JobStatus.QUEUED, JobStatus.CANCELED]


def test_cancel_retries_after_losing_a_race(svc: JobService) -> None:
    job = svc.submit(ALICE, SPEC)
    jobs = svc.jobs
    assert isinstance(jobs, FakeJobs)

    def racing_writer(_: object) -> None:  # the scheduler places the job meanwhile
        current = jobs.jobs[job.id]
        placed, ev = current.transition(JobStatus.STARTING, "placed", current.updated_at)
        jobs.jobs[job.id] = placed
        jobs.history[job.id].append(ev)

    jobs.before_save = racing_writer
    result = svc.cancel(ALICE, job.id)
    # The cancel was re-evaluated against the placed job: it now needs the executor's confirmation.
    assert result.status is JobStatus.CANCELING
    assert [e.to for e in svc.events(ALICE, job.id)] == [
        JobStatus.QUEUED,
        JobStatus.STARTING,
        JobStatus.CANCELING,
    ]


def test_cancel_gives_up_when_the_job_never_settles(svc: JobService) -> None:
    job = svc.submit(ALICE, SPEC)
    jobs = svc.jobs
    assert isinstance(jobs, FakeJobs)
    original = jobs.save

    def always_conflict(j: object, e: object, usage: object = None, releases: object = ()) -> None:
        raise Conflict("moved")

    jobs.save = always_conflict  # type: ignore[method-assign]
    with pytest.raises(Conflict, match="kept changing"):
        svc.cancel(ALICE, job.id)
    jobs.save = original  # type: ignore[method-assign]
    assert svc.get(ALICE, job.id).status is JobStatus.QUEUED


def test_active_job_quota(svc: JobService) -> None:
    svc.tenants.put_quota("vision", Quota(max_active_jobs=2))
    a = svc.submit(ALICE, SPEC)
    svc.submit(ALICE, SPEC)
    with pytest.raises(QuotaExceeded, match="max_active_jobs=2"):
        svc.submit(ALICE, SPEC)
    svc.cancel(ALICE, a.id)  # a canceled job no longer counts
    svc.submit(ALICE, SPEC)


def test_feasibility_check_refuses_before_storing(svc: JobService) -> None:
    from berth.domain.errors import Infeasible

    def never(spec: JobSpec, tenant: str, record: TenantRecord) -> None:
        raise Infeasible("no site has H100 for vision")

    strict = JobService(svc.jobs, svc.tenants, svc.clock, feasibility=never)
    with pytest.raises(Infeasible):
        strict.submit(ALICE, SPEC)
    assert svc.list_jobs(ALICE, None, 10, None).jobs == []


def test_list_newest_first_and_paginates(svc: JobService) -> None:
    ids = [svc.submit(ALICE, SPEC).id for _ in range(5)]
    p1 = svc.list_jobs(ALICE, None, 2, None)
    p2 = svc.list_jobs(ALICE, None, 2, p1.next_token)
    p3 = svc.list_jobs(ALICE, None, 2, p2.next_token)
    assert [j.id for j in p1.jobs + p2.jobs + p3.jobs] == ids[::-1]
    assert p3.next_token is None


def test_caller_resolution() -> None:
    _, tenants = fake_store()
    role_id = "AROAVISIONENGINEERS01"
    tenants.put_member("arn:aws:iam::123456789012:role/vision-engineers", "vision", "member", role_id)
    svc = TenantService(tenants)
    session = "arn:aws:sts::123456789012:assumed-role/vision-engineers/alice-session"
    c = svc.caller(Identity(session, f"{role_id}:alice-session"))
    assert c.tenant == "vision" and c.principal == "arn:aws:iam::123456789012:role/vision-engineers"
    assert c.actor == "alice-session" and c.name == "alice-session"
    with pytest.raises(Forbidden):
        svc.caller(Identity("arn:aws:iam::123456789012:user/mallory", "AIDAMALLORY0000000000"))
    with pytest.raises(Unauthenticated):
        svc.caller(Identity(None))
    assert canonical_principal("arn:aws:iam::1:user/x") == "arn:aws:iam::1:user/x"
    # IAM Identity Center roles carry a path that session ARNs drop: both sides map to one key.
    sso = "arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_ML_0a1b"
    session = "arn:aws:sts::123456789012:assumed-role/AWSReservedSSO_ML_0a1b/alice@example.com"
    assert canonical_principal(sso) == canonical_principal(session)


def test_quota_rules() -> None:
    _, tenants = fake_store()
    tenants.put_member("arn:a", "vision", "member")
    tenants.put_member("arn:b", "nlp", "member")
    svc = TenantService(tenants)
    admin = Caller("arn:admin", "platform", Role.ADMIN)
    member = Caller("arn:a", "vision", Role.MEMBER)
    assert svc.get_quota(member, "vision") == Quota()
    with pytest.raises(Forbidden):
        svc.get_quota(member, "nlp")
    with pytest.raises(Forbidden):
        svc.put_quota(member, "vision", Quota(max_active_jobs=1))
    with pytest.raises(NotFound):
        svc.put_quota(admin, "ghosts", Quota())
    svc.put_quota(admin, "nlp", Quota(max_active_jobs=7))
    assert svc.get_quota(admin, "nlp").max_active_jobs == 7


def test_keyed_submit_claims_its_key_in_the_creation(svc: JobService) -> None:
    from berth.domain.errors import IdempotencyMismatch

    first = svc.submit(ALICE, SPEC, idempotency_key="k")
    # A retry after a lost answer (whatever Powertools' record says) finds the same job.
    assert svc.submit(ALICE, SPEC, idempotency_key="k").id == first.id
    with pytest.raises(IdempotencyMismatch):
        svc.submit(ALICE, SPEC.model_copy(update={"name": "other"}), idempotency_key="k")
    bob = Caller("arn:aws:iam::1:user/bob", "nlp", Role.MEMBER)
    assert svc.submit(bob, SPEC, idempotency_key="k").id != first.id  # keys are per tenant
    assert len(svc.list_jobs(ALICE, None, 10, None).jobs) == 1


def test_submit_reads_the_tenant_record_once_for_every_check(svc: JobService) -> None:
    """The quota, the access check (grants) and the feasibility check (quota) share one read."""
    seen: list[TenantRecord] = []

    def check(spec: JobSpec, tenant: str, record: TenantRecord) -> None:
        assert tenant == "vision"
        seen.append(record)

    svc.tenants.put_quota("vision", Quota(max_active_jobs=7))
    checked = JobService(svc.jobs, svc.tenants, svc.clock, feasibility=check, access=check)
    tenants = svc.tenants
    assert isinstance(tenants, FakeTenants)
    tenants.reads.clear()
    checked.submit(ALICE, SPEC)
    assert tenants.reads == {"record": 1}
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].quota == Quota(max_active_jobs=7)
