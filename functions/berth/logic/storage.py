"""Code and data use cases: bundle uploads, datasets and grants, and the submit-time access check.

Every check uses the tenant record and registries only, never what the spec claims about itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from berth.domain.errors import Forbidden, NotFound, ValidationFailed
from berth.domain.job_access import check_policy_fits
from berth.domain.job_spec import JobSpec
from berth.domain.ports import BundleStore, SecretCatalog, TenantRecord, TenantRepository, UploadTicket
from berth.domain.storage import (
    DIGEST_RE,
    DataGrants,
    Dataset,
    StorageLayout,
    check_bundle_size,
    check_data_sources,
    check_secret_names,
    dataset_names,
    parse_digest,
)
from berth.domain.tenancy import Caller, valid_tenant_name


@dataclass(frozen=True)
class StorageService:
    layout: StorageLayout
    bundles: BundleStore
    secrets: SecretCatalog
    tenants: TenantRepository

    # -- bundles ----------------------------------------------------------------------------------
    def request_upload(self, caller: Caller, digest: str, size: int) -> UploadTicket | None:
        """A presigned upload for the caller's tenant, or None when the bundle is already stored."""
        if not DIGEST_RE.fullmatch(digest):
            raise ValidationFailed("digest must be 64 lowercase hex characters (SHA-256 of the .tar.gz)")
        check_bundle_size(size)
        if self.bundles.exists(caller.tenant, digest):
            return None
        return self.bundles.upload_ticket(caller.tenant, digest, size)

    # -- submit-time access check -------------------------------------------------------------------
    def check_spec(self, spec: JobSpec, tenant: str, record: TenantRecord | None = None) -> None:
        """Raise unless the tenant may use every bundle, data source and secret the spec names.
        ``record``: the tenant's record the caller already read (its grants); None reads them."""
        digest = None if spec.code is None else parse_digest(spec.code)
        if digest is not None and not self.bundles.exists(tenant, digest):
            raise ValidationFailed(
                f"code bundle sha256:{digest} was never uploaded by tenant {tenant!r}; "
                "upload it first (berth submit packs and uploads code: ./dir)",
                details={"code": spec.code},
            )
        datasets = {name: self.tenants.dataset(name) for name in dataset_names(spec)}
        grants = self.tenants.grants(tenant) if record is None else record.grants
        check_data_sources(spec, tenant, self.layout, grants, datasets)
        check_secret_names(spec.secrets, tenant)
        check_policy_fits(spec, tenant, self.layout, grants, datasets)
        for env_name, name in spec.secrets.items():
            if not self.secrets.exists(name):
                raise ValidationFailed(
                    f"secret {name!r} (for {env_name}) does not exist", details={"secret": name}
                )
        if digest is not None:
            self.bundles.mark_referenced(tenant, digest)

    # -- datasets and grants (admin writes) -------------------------------------------------------
    def get_dataset(self, caller: Caller, name: str) -> Dataset:
        ds = self.tenants.dataset(name)
        if ds is None or (not caller.is_admin and caller.tenant not in ds.tenants):
            raise NotFound(f"dataset {name!r} not found")
        return ds

    def put_dataset(self, caller: Caller, name: str, dataset: Dataset) -> Dataset:
        if not caller.is_admin:
            raise Forbidden("only admins may register datasets")
        self.tenants.put_dataset(name, dataset)
        return dataset

    def get_grants(self, caller: Caller, tenant: str) -> DataGrants:
        self._tenant(caller, tenant, write=False)
        return self.tenants.grants(tenant)

    def put_grants(self, caller: Caller, tenant: str, grants: DataGrants) -> DataGrants:
        self._tenant(caller, tenant, write=True)
        self.tenants.put_grants(tenant, grants)
        return grants

    def _tenant(self, caller: Caller, tenant: str, *, write: bool) -> None:
        if not valid_tenant_name(tenant):
            raise ValidationFailed(f"invalid tenant name {tenant!r}")
        if write and not caller.is_admin:
            raise Forbidden("only admins may grant data")
        if not caller.is_admin and caller.tenant != tenant:
            raise Forbidden(f"only admins may read tenant {tenant!r}'s grants")
        if not self.tenants.tenant_exists(tenant):
            raise NotFound(f"tenant {tenant!r} not found")
