"""The repository ports' contract suites run unchanged against the in-memory fakes and DynamoDB (moto).

A test here takes ``store``: a job and a tenant repository sharing one tenant table (with the
document repository), and a host repository, parametrised
over both implementations, so a fake cannot pass a rule that the real store breaks, or hide a bug
the real store has.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from berth.domain.ports import (
    DocumentRepository,
    HostRepository,
    JobRepository,
    PlacementWriter,
    TenantRepository,
    UsageLedger,
)
from tests.functional.conftest import TABLES
from tests.unit.fakes import FakeDocuments, FakeHosts, FakePlacements, FakeUsage, fake_store


@dataclass(frozen=True)
class Store:
    jobs: JobRepository
    tenants: TenantRepository
    hosts: HostRepository
    documents: DocumentRepository
    usage: UsageLedger
    placements: PlacementWriter


@pytest.fixture(params=["fake", "dynamodb"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "fake":
        jobs, tenants = fake_store()
        hosts = FakeHosts()
        ledger = FakeUsage()
        jobs.usage_ledger = ledger  # save's usage record (as DynamoDB's transaction does)
        jobs.hosts = hosts  # save's GPU holds given back (likewise)
        yield Store(jobs, tenants, hosts, FakeDocuments(), ledger, FakePlacements(jobs, hosts))
        return
    request.getfixturevalue("aws")
    from berth.dal.documents import DynamoDocumentRepository
    from berth.dal.hosts import DynamoHostRepository
    from berth.dal.jobs import DynamoJobRepository
    from berth.dal.placements import DynamoPlacementWriter
    from berth.dal.tenants import DynamoTenantRepository
    from berth.dal.usage import DynamoUsageLedger

    ledger = DynamoUsageLedger(TABLES["BERTH_USAGE_TABLE"])
    jobs = DynamoJobRepository(
        TABLES["BERTH_JOBS_TABLE"],
        TABLES["BERTH_JOB_EVENTS_TABLE"],
        TABLES["BERTH_TENANTS_TABLE"],
        usage=ledger,
        hosts_table=TABLES["BERTH_HOSTS_TABLE"],
    )
    hosts = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    yield Store(
        jobs,
        DynamoTenantRepository(TABLES["BERTH_TENANTS_TABLE"]),
        hosts,
        DynamoDocumentRepository(TABLES["BERTH_TENANTS_TABLE"]),
        ledger,
        DynamoPlacementWriter(jobs, hosts),
    )
