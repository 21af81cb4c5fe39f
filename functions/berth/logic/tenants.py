"""Tenant use cases: who is calling, and quotas. Pure logic over the tenant repository port."""

from __future__ import annotations

from dataclasses import dataclass

from berth.domain.errors import Forbidden, NotFound, ValidationFailed
from berth.domain.identity import Identity, resolve_principal
from berth.domain.ports import TenantRepository
from berth.domain.tenancy import Caller, Quota, Role, valid_tenant_name


@dataclass(frozen=True)
class TenantService:
    tenants: TenantRepository

    def caller(self, identity: Identity) -> Caller:
        """The tenant and role of a verified IAM principal, matched on its ARN and its unique id.

        Unknown principals are refused, and so is a principal whose name is registered with another
        unique id (a role or user deleted and recreated under the same name) until it is re-registered.
        """
        principal = resolve_principal(identity)
        member = self.tenants.member(principal.arn)
        if member is None:
            raise Forbidden(
                f"principal {principal.arn} is not a member of any Berth tenant; ask an admin to add it"
            )
        if member.unique_id != principal.unique_id:
            raise Forbidden(
                f"principal {principal.arn} is not the one registered under that name (its unique id "
                "differs: was it deleted and recreated?); ask an admin to register it again"
            )
        if member.role is Role.HOST:
            raise Forbidden(f"principal {principal.arn} is a host identity; hosts may call /v1/agent/ only")
        return Caller(principal=principal.arn, tenant=member.tenant, role=member.role, actor=principal.actor)

    def host(self, identity: Identity) -> tuple[str, str]:
        """(host id, principal) of a verified host identity; Forbidden for anyone else."""
        principal = resolve_principal(identity)
        member = self.tenants.member(principal.arn)
        if member is None or member.role is not Role.HOST:
            raise Forbidden(
                f"principal {principal.arn} is not a registered Berth host; the agent API answers hosts only"
            )
        if member.unique_id != principal.unique_id:
            raise Forbidden(f"principal {principal.arn} is not the one registered under that name")
        return member.tenant, principal.arn

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
