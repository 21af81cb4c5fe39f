"""``BerthStack``: the walking skeleton of the control plane (state tables, API, API Lambda)."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from berth_infra.api import (
    DEFAULT_API_RESERVED_CONCURRENCY,
    DEFAULT_MEMBER_TAG,
    DEFAULT_TENANT_REQUESTS_PER_SECOND,
    ApiFunction,
    BerthApi,
)
from berth_infra.data import DataTables
from berth_infra.nag import acknowledge_findings
from berth_infra.storage import Storage

STACK_NAME = "Berth"


def context_flag(scope: Construct, key: str, default: bool = False) -> bool:
    """A boolean context value; `-c key=true` arrives as the string "true"."""
    value = scope.node.try_get_context(key)
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class BerthStack(Stack):
    """All of Berth's control plane in one stack. Environment-agnostic unless the app pins one."""

    def __init__(self, scope: Construct, construct_id: str = STACK_NAME, **kwargs: Any) -> None:
        kwargs.setdefault("description", "Berth: hybrid-cloud GPU allocation service (control plane)")
        super().__init__(scope, construct_id, **kwargs)

        self.tables = DataTables(self, "Data")
        self.storage = Storage(self, "Storage")
        context = self.node.try_get_context
        self.api_function = ApiFunction(
            self,
            "ApiFunction",
            tables=self.tables,
            storage=self.storage,
            bundle=context_flag(self, "berth:bundle"),
            reserved_concurrency=int(
                context("berth:apiReservedConcurrency") or DEFAULT_API_RESERVED_CONCURRENCY
            ),
            tenant_requests_per_second=int(
                context("berth:tenantRequestsPerSecond") or DEFAULT_TENANT_REQUESTS_PER_SECOND
            ),
        )
        self.api = BerthApi(
            self,
            "Api",
            handler=self.api_function.function,
            member_tag=str(context("berth:memberTag") or DEFAULT_MEMBER_TAG),
        )

        outputs = {
            "ApiUrl": (self.api.url, "Base URL of the API stage; routes start with /v1"),
            "ApiId": (self.api.rest_api.rest_api_id, "REST API id"),
            "JobsTableName": (self.tables.jobs.table_name, "Jobs table"),
            "JobEventsTableName": (self.tables.job_events.table_name, "Job events (state history) table"),
            "TenantsTableName": (self.tables.tenants.table_name, "Tenants and quotas table"),
            "IdempotencyTableName": (self.tables.idempotency.table_name, "Powertools idempotency table"),
            "HostsTableName": (self.tables.hosts.table_name, "On-prem hosts and their GPUs table"),
            "ApiFunctionName": (self.api_function.function.function_name, "API Lambda function name"),
            "ArtifactsBucketName": (
                self.storage.artifacts.bucket_name,
                "Code bundles (bundles/<tenant>/sha256/)",
            ),
            "DataBucketName": (self.storage.data.bucket_name, "Tenant data (<tenant>/) and job outputs"),
            "JobRoleArn": (
                self.storage.job_role.role_arn,
                "Role per-attempt job credentials are vended from",
            ),
        }
        for output_id, (value, description) in outputs.items():
            CfnOutput(self, output_id, value=value, description=description)

        self.nag_acknowledgments = acknowledge_findings(self)
