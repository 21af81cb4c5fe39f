"""DynamoDB tenant repository: principal -> (tenant, role) and tenant -> quota."""

from __future__ import annotations

from pynamodb.exceptions import PutError

from berth.dal.errors import translated
from berth.dal.models import tenant_model
from berth.domain.ports import Member, TenantRecord
from berth.domain.storage import DataGrants, Dataset
from berth.domain.tenancy import Quota, Role, canonical_principal

PRINCIPAL = "PRINCIPAL#"
TENANT = "TENANT#"
DATASET = "DATASET#"
#: The ``directory`` value of every TENANT# item (the sparse ``by_directory`` index's one key).
DIRECTORY = "T"


class DynamoTenantRepository:
    def __init__(self, table_name: str) -> None:
        self._Row = tenant_model(table_name)

    def member(self, principal: str) -> Member | None:
        with translated("read tenant membership"):
            try:
                row = self._Row.get(PRINCIPAL + principal)
            except self._Row.DoesNotExist:
                return None
        if row.tenant is None or row.role is None:
            return None
        return Member(principal=principal, tenant=row.tenant, role=Role(row.role), unique_id=row.unique_id)

    def put_member(self, principal: str, tenant: str, role: str, unique_id: str | None = None) -> None:
        principal = canonical_principal(principal)
        with translated("write tenant membership"):
            row = self._Row(PRINCIPAL + principal, tenant=tenant, role=str(Role(role)), unique_id=unique_id)
            row.save()
            if Role(role) is Role.HOST:
                return  # a host's row names its host id, not a tenant
            try:
                self._Row(TENANT + tenant, tenant=tenant, directory=DIRECTORY).save(
                    condition=self._Row.pk.does_not_exist()
                )
            except PutError as exc:  # the tenant record already exists: keep its quota
                if exc.cause_response_code != "ConditionalCheckFailedException":
                    raise

    def tenant_exists(self, tenant: str) -> bool:
        with translated("read tenant"):
            try:
                self._Row.get(TENANT + tenant)
            except self._Row.DoesNotExist:
                return False
        return True

    def record(self, tenant: str) -> TenantRecord:
        """One strongly consistent GetItem of ``TENANT#<tenant>``: its quota and grants together."""
        with translated("read tenant record"):
            try:
                row = self._Row.get(TENANT + tenant, consistent_read=True)
            except self._Row.DoesNotExist:
                return TenantRecord()
        return TenantRecord(
            quota=None if row.quota is None else Quota.model_validate(row.quota),
            grants=DataGrants() if row.grants is None else DataGrants.model_validate(row.grants),
        )

    def quota(self, tenant: str) -> Quota | None:
        return self.record(tenant).quota

    def put_quota(self, tenant: str, quota: Quota) -> None:
        # Only the quota attributes: the record also holds ``active_jobs``, which job create and
        # finish move in their own transactions; replacing the whole item would drop it.
        row = self._Row
        with translated("write quota"):
            row(TENANT + tenant).update(
                actions=[row.tenant.set(tenant), row.quota.set(quota.model_dump(mode="json"))]
            )

    def grants(self, tenant: str) -> DataGrants:
        return self.record(tenant).grants

    def put_grants(self, tenant: str, grants: DataGrants) -> None:
        row = self._Row
        with translated("write grants"):
            row(TENANT + tenant).update(
                actions=[row.tenant.set(tenant), row.grants.set(grants.model_dump(mode="json"))]
            )

    def dataset(self, name: str) -> Dataset | None:
        with translated("read dataset"):
            try:
                row = self._Row.get(DATASET + name, consistent_read=True)
            except self._Row.DoesNotExist:
                return None
        return None if row.dataset is None else Dataset.model_validate(row.dataset)

    def put_dataset(self, name: str, dataset: Dataset) -> None:
        row = self._Row
        with translated("write dataset"):
            row(DATASET + name).update(actions=[row.dataset.set(dataset.model_dump(mode="json"))])
