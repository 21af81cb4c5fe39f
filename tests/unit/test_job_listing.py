"""Listing filters in the use case: name (substring or glob), site, since, every tenant's (admins)."""

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest

from berth.domain.errors import Forbidden, InvalidRequest
from berth.domain.job_filter import JobFilter, name_matches
from berth.domain.job_spec import JobSpec
from berth.domain.placement import Site
from berth.domain.tenancy import Caller, Role
from berth.logic.jobs import JobService
from tests.unit.fakes import FakeJobs, fake_store

ALICE = Caller("arn:aws:iam::1:user/alice", "vision", Role.MEMBER)
BOB = Caller("arn:aws:iam::1:user/bob", "nlp", Role.MEMBER)
ADMIN = Caller("arn:aws:iam::1:user/admin", "platform", Role.ADMIN)
T0 = datetime(2026, 11, 29, tzinfo=UTC)


def _spec(name: str) -> JobSpec:
    return JobSpec.model_validate({"name": name, "image": "busybox", "command": ["true"]})


@pytest.fixture
def store() -> tuple[JobService, FakeJobs]:
    ticks = count()
    jobs, tenants = fake_store()
    tenants.put_member(ALICE.principal, "vision", "member")
    tenants.put_member(BOB.principal, "nlp", "member")
    return JobService(jobs, tenants, clock=lambda: T0 + timedelta(minutes=next(ticks))), jobs


@pytest.mark.parametrize(
    ("pattern", "name", "hit"),
    [
        ("resnet", "resnet50-imagenet", True),
        ("net", "resnet50-imagenet", True),
        ("resnet*", "resnet50-imagenet", True),
        ("*res", "resnet50-imagenet", False),  # a glob covers the whole name
        ("*net", "resnet50-imagenet", True),
        ("res?et50-*", "resnet50-imagenet", True),
        ("[rb]*", "bert", True),
        ("bert", "resnet", False),
    ],
)
def test_name_matches_a_substring_or_a_whole_name_glob(pattern: str, name: str, hit: bool) -> None:
    assert name_matches(pattern, name) is hit


def test_name_site_and_since_filter_the_listing(store: tuple[JobService, FakeJobs]) -> None:
    svc, jobs = store
    a = svc.submit(ALICE, _spec("resnet-a"))
    b = svc.submit(ALICE, _spec("bert-b"))
    c = svc.submit(ALICE, _spec("resnet-c"))
    jobs.update(b.model_copy(update={"site": Site.CLOUD, "version": b.version + 1}))

    def ids(f: JobFilter) -> list[str]:
        return [j.id for j in svc.list_jobs(ALICE, None, 50, None, filters=f).jobs]

    assert ids(JobFilter(name="resnet")) == [c.id, a.id]
    assert ids(JobFilter(site=Site.CLOUD)) == [b.id]
    assert ids(JobFilter(site=Site.ONPREM)) == []  # not placed: no site
    assert ids(JobFilter(since=b.created_at)) == [c.id, b.id]
    assert ids(JobFilter(since=b.created_at, name="resnet-*")) == [c.id]


def test_every_tenants_jobs_for_admins_only(store: tuple[JobService, FakeJobs]) -> None:
    svc, _ = store
    mine = svc.submit(ALICE, _spec("a"))
    theirs = svc.submit(BOB, _spec("b"))
    page = svc.list_jobs(ADMIN, None, 50, None, all_tenants=True)
    assert [j.id for j in page.jobs] == [theirs.id, mine.id]
    with pytest.raises(Forbidden):
        svc.list_jobs(ALICE, None, 50, None, all_tenants=True)
    with pytest.raises(InvalidRequest):
        svc.list_jobs(ADMIN, None, 50, None, tenant="nlp", all_tenants=True)
    assert [j.id for j in svc.list_jobs(ADMIN, None, 50, None, tenant="nlp").jobs] == [theirs.id]
