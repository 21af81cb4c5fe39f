"""pynamodb table models. Table names are only known at run time, so each model is built per name."""

from __future__ import annotations

from functools import cache

from pynamodb.attributes import (
    JSONAttribute,
    NumberAttribute,
    UnicodeAttribute,
    UTCDateTimeAttribute,
)
from pynamodb.indexes import AllProjection, GlobalSecondaryIndex
from pynamodb.models import Model


class JobRow(Model):
    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    tenant = UnicodeAttribute()
    tenant_status = UnicodeAttribute()
    created_key = UnicodeAttribute()
    owner = UnicodeAttribute()
    status = UnicodeAttribute()
    reason = UnicodeAttribute()
    spec = JSONAttribute()
    created_at = UTCDateTimeAttribute()
    updated_at = UTCDateTimeAttribute()
    site = UnicodeAttribute(null=True)
    placement = JSONAttribute(null=True)
    attempts = NumberAttribute(default=0)
    cost_usd = NumberAttribute(default=0)
    version = NumberAttribute()


class ByTenant(GlobalSecondaryIndex["JobRow"]):
    class Meta:
        index_name = "by_tenant"
        projection = AllProjection()

    tenant = UnicodeAttribute(hash_key=True)
    created_key = UnicodeAttribute(range_key=True)


class ByTenantStatus(GlobalSecondaryIndex["JobRow"]):
    class Meta:
        index_name = "by_tenant_status"
        projection = AllProjection()

    tenant_status = UnicodeAttribute(hash_key=True)
    created_key = UnicodeAttribute(range_key=True)


class JobEventRow(Model):
    class Meta:
        table_name = "unset"

    job_id = UnicodeAttribute(hash_key=True)
    seq = NumberAttribute(range_key=True)
    at = UTCDateTimeAttribute()
    from_status = UnicodeAttribute(null=True)
    to_status = UnicodeAttribute()
    reason = UnicodeAttribute()


class TenantRow(Model):
    class Meta:
        table_name = "unset"

    pk = UnicodeAttribute(hash_key=True)
    tenant = UnicodeAttribute(null=True)
    role = UnicodeAttribute(null=True)
    quota = JSONAttribute(null=True)
    #: Jobs of this tenant not yet in a terminal state; kept in the same transactions as the jobs.
    active_jobs = NumberAttribute(null=True)
    #: TENANT# items: S3 prefixes granted besides the tenant's own (written alone, like ``quota``).
    grants = JSONAttribute(null=True)
    #: DATASET#<name> items: the registered dataset.
    dataset = JSONAttribute(null=True)


def _bind(base: type[Model], table_name: str, **attrs: object) -> type[Model]:
    meta = type("Meta", (), {"table_name": table_name})
    return type(f"{base.__name__}_{table_name}", (base,), {"Meta": meta, **attrs})


@cache
def job_model(table_name: str) -> type[JobRow]:
    # An index's Meta is bound to one model class, so each table gets its own index classes.
    indexes = {
        name: type(f"{base.__name__}_{table_name}", (base,), {"Meta": type("Meta", (base.Meta,), {})})()
        for name, base in (("by_tenant", ByTenant), ("by_tenant_status", ByTenantStatus))
    }
    return _bind(JobRow, table_name, **indexes)  # type: ignore[return-value]


@cache
def event_model(table_name: str) -> type[JobEventRow]:
    return _bind(JobEventRow, table_name)  # type: ignore[return-value]


@cache
def tenant_model(table_name: str) -> type[TenantRow]:
    return _bind(TenantRow, table_name)  # type: ignore[return-value]
