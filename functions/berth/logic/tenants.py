"""Tenant use cases: who is calling, and quotas. Pure logic over the tenant repository port."""

from __future__ import annotations

from dataclasses import dataclass

from berth.domain.errors import Forbidden, NotFound, Unauthenticated, ValidationFailed
from berth.domain.ports import TenantRepository
from berth.domain.tenancy import Caller, Quota, canonical_principal, valid_tenant_name


@dataclass(frozen=True)
class TenantService:
    tenants: TenantRepository

    def caller(self, principal_arn: str | None) -> Caller:
        """The tenant and role of a verified IAM principal. Unknown principals are refused."""
        if not principal_arn:
            raise Unauthenticated("request has no IAM identity; sign it with SigV4")
        principal = canonical_principal(principal_arn)
        member = self.tenants.member(principal)
        if member is None:
            raise Forbidden(
                f"principal {principal} is not a member of any Berth tenant; ask an admin to add it"
            )
        return Caller(principal=principal, tenant=member.tenant, role=member.role)

    def get_quota(self, caller: Caller, tenant: str) -> Quota:
        self._check_tenant(tenant)
        if not caller.is_admin and caller.tenant != tenant:
            raise Forbidden(f"only admins may read tenant {tenant!r}'s quota")
        quota = self.tenants.quota(tenant)
        if quota is None:
            if not self.tenants.tenant_exists(tenant):
                raise NotFound(f"tenant {tenant!r} not found")
            return Quota()
        return quota

    def put_quota(self, caller: Caller, tenant: str, quota: Quota) -> Quota:
        self._check_tenant(tenant)
        if not caller.is_admin:
            raise Forbidden("only admins may set quotas")
        if not self.tenants.tenant_exists(tenant):
            raise NotFound(f"tenant {tenant!r} not found")
        self.tenants.put_quota(tenant, quota)
        return quota

    @staticmethod
    def _check_tenant(tenant: str) -> None:
        if not valid_tenant_name(tenant):
            raise ValidationFailed(f"invalid tenant name {tenant!r}")
