"""The cloud path's identities in the home stack (IAM is global): one Batch job role per tenant, the
role the cloud dispatcher submits Batch jobs through, the tenants' job log groups and the home bus's
rule for Batch events (docs/cloud.md, "Security").

- ``Berth-job-<tenant>`` (tag ``berth:tenant=<tenant>``): what a tenant's Batch job runs as. Trusted by
  ``ecs-tasks.amazonaws.com`` only for this account (``aws:SourceAccount``); it reads the tenant's
  bundles (``bundles/<tenant>/``) and data (``<tenant>/``), writes its job outputs
  (``<tenant>/jobs/``), reads its secrets (``berth/<tenant>/``) and writes its log group
  (``/berth/jobs/<tenant>``). Every prefix ends with ``/``.
- ``Berth-exec-<tenant>`` (same tag and trust): the ECS execution role of the tenant's job definitions
  that name secrets. ECS resolves the definition's ``secrets`` with it before the container starts;
  it may read ``berth/<tenant>/*`` secrets only (so a crafted definition naming another tenant's
  secret fails to start), write the tenant's log group and pull images from the account's ECR.
- ``BatchSubmitRole``: assumed by the dispatcher with the session tag ``berth:tenant=<job's tenant>``;
  it may submit to Berth's queues and pass only a ``Berth-job-*`` or ``Berth-exec-*`` role to Batch/ECS whose
  ``berth:tenant`` tag equals the session's (``iam:ResourceTag`` vs ``aws:PrincipalTag``), so a job of
  ``vision`` can never run as ``nlp``.
"""

from __future__ import annotations

import json

from aws_cdk import RemovalPolicy, Stack, Tags
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from berth.domain.batch_queues import QUEUE_PREFIX
from berth_infra.cloud_config import (
    EXEC_ROLE_PREFIX,
    FORWARD_ROLE_PREFIX,
    JOB_LOG_GROUP_PREFIX,
    JOB_ROLE_PREFIX,
    JOB_TENANT_TAG,
    TENANT_TAG,
    CloudRegion,
    cloud_capacity,
)
from berth_infra.storage import Storage

#: The services a job role may be passed to (Batch registers the definition, ECS runs the task).
PASSED_TO_SERVICES = ["batch.amazonaws.com", "ecs-tasks.amazonaws.com"]
SESSION_TENANT = "${aws:PrincipalTag/" + TENANT_TAG + "}"


class CloudRoles(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        bus: events.IEventBus,
        regions: list[CloudRegion],
        tenants: list[str],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.regions = regions
        self.tenants = tenants
        acct, part = stack.account, stack.partition

        # -- a job role and a log group per tenant ----------------------------------------------
        self.job_roles: dict[str, iam.Role] = {}
        self.job_log_groups: dict[str, logs.LogGroup] = {}
        self.exec_roles: dict[str, iam.Role] = {}
        for tenant in tenants:
            log_group = logs.LogGroup(
                self,
                f"JobLogs-{tenant}",
                log_group_name=f"{JOB_LOG_GROUP_PREFIX}/{tenant}",
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=RemovalPolicy.RETAIN,
            )
            self.job_log_groups[tenant] = log_group
            role = iam.Role(
                self,
                f"JobRole-{tenant}",
                role_name=f"{JOB_ROLE_PREFIX}{tenant}",
                assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com").with_conditions(
                    {
                        "StringEquals": {"aws:SourceAccount": acct},
                        "ArnLike": {"aws:SourceArn": f"arn:{part}:ecs:*:{acct}:*"},
                    }
                ),
                description=f"Berth Batch jobs of tenant {tenant}: its own prefixes only",
            )
            Tags.of(role).add(TENANT_TAG, tenant)
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadBundlesAndData",
                    actions=["s3:GetObject"],
                    resources=[
                        storage.artifacts.arn_for_objects(f"bundles/{tenant}/*"),
                        storage.data.arn_for_objects(f"{tenant}/*"),
                    ],
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="WriteJobOutputs",
                    actions=["s3:PutObject"],
                    resources=[storage.data.arn_for_objects(f"{tenant}/jobs/*")],
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ListOwnPrefix",
                    actions=["s3:ListBucket"],
                    resources=[storage.data.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [f"{tenant}/*"]}},
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="OwnSecrets",
                    actions=["secretsmanager:GetSecretValue"],
                    resources=[f"arn:{part}:secretsmanager:{stack.region}:{acct}:secret:berth/{tenant}/*"],
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="OwnLogGroup",
                    actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                    resources=[f"{log_group.log_group_arn}"],
                )
            )
            self.job_roles[tenant] = role
            self.exec_roles[tenant] = self._exec_role(tenant, log_group)

        # -- the dispatcher's submit role ----------------------------------------------------------
        self.submit_role = iam.Role(
            self,
            "BatchSubmitRole",
            # Assumed only with a berth:tenant session tag (the job's tenant), by Berth's own roles
            # that are granted sts:AssumeRole on it (grant_assume).
            assumed_by=iam.AccountPrincipal(acct)
            .with_session_tags()
            .with_conditions(
                {
                    "ArnLike": {"aws:PrincipalArn": f"arn:{part}:iam::{acct}:role/{stack.stack_name}-*"},
                    "StringLike": {f"aws:RequestTag/{TENANT_TAG}": "?*"},
                }
            ),
            description="Berth cloud dispatcher: submit a job of the session's tenant to AWS Batch",
        )
        # Berth's queues of each configured region by their prefix (as the forwarding rule matches
        # them): one queue per instance type and purchase type, listed one by one, would overflow the
        # role's inline policy (10,240 characters) with three regions of the default catalog.
        queues = [f"arn:{part}:batch:{r.region}:{acct}:job-queue/{QUEUE_PREFIX}{r.region}-*" for r in regions]
        definitions = [f"arn:{part}:batch:{r.region}:{acct}:job-definition/berth-*" for r in regions]
        jobs = [f"arn:{part}:batch:{r.region}:{acct}:job/*" for r in regions]
        self.job_role_arns = f"arn:{part}:iam::{acct}:role/{JOB_ROLE_PREFIX}*"
        self.exec_role_arns = f"arn:{part}:iam::{acct}:role/{EXEC_ROLE_PREFIX}*"
        statements = [
            iam.PolicyStatement(
                sid="SubmitTaggedWithSessionTenant",
                actions=["batch:SubmitJob"],
                resources=[*queues, *definitions],
                conditions={"StringEquals": {f"aws:RequestTag/{JOB_TENANT_TAG}": SESSION_TENANT}},
            ),
            iam.PolicyStatement(
                sid="RegisterBerthDefinitions",
                actions=["batch:RegisterJobDefinition"],
                resources=definitions,
            ),
            iam.PolicyStatement(
                sid="TagOnCreate",
                actions=["batch:TagResource"],
                resources=[*definitions, *jobs],
            ),
            iam.PolicyStatement(
                sid="TerminateSessionTenantJobs",
                actions=["batch:TerminateJob"],
                resources=jobs,
                conditions={"StringEquals": {f"aws:ResourceTag/{JOB_TENANT_TAG}": SESSION_TENANT}},
            ),
            iam.PolicyStatement(
                sid="Describe",
                actions=["batch:DescribeJobs", "batch:DescribeJobDefinitions", "batch:DescribeJobQueues"],
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="PassSessionTenantJobRole",
                actions=["iam:PassRole"],
                resources=[self.job_role_arns, self.exec_role_arns],
                conditions={
                    "StringEquals": {
                        "iam:PassedToService": PASSED_TO_SERVICES,
                        f"iam:ResourceTag/{TENANT_TAG}": SESSION_TENANT,
                    }
                },
            ),
        ]
        for statement in statements:
            self.submit_role.add_to_policy(statement)

        # -- the home bus: only the regional forwarders put aws.batch events ------------------------
        self.forwarder_arns = [
            f"arn:{part}:iam::{acct}:role/{FORWARD_ROLE_PREFIX}{r.region}" for r in regions
        ]
        self.bus_policy = events.CfnEventBusPolicy(
            self,
            "BatchEventsBusPolicy",
            event_bus_name=bus.event_bus_name,
            statement_id="OnlyForwardersPutBatchEvents",
            statement={
                "Sid": "OnlyForwardersPutBatchEvents",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "events:PutEvents",
                "Resource": bus.event_bus_arn,
                "Condition": {
                    "StringEquals": {"events:source": "aws.batch"},
                    # IfExists: a delivery with no principal ARN is EventBridge's own.
                    "StringNotEqualsIfExists": {"aws:PrincipalArn": self.forwarder_arns},
                },
            },
        )

    def _exec_role(self, tenant: str, log_group: logs.LogGroup) -> iam.Role:
        """``Berth-exec-<tenant>``: what ECS reads the tenant's secrets (and pulls images) with."""
        stack = Stack.of(self)
        acct, part = stack.account, stack.partition
        role = iam.Role(
            self,
            f"ExecRole-{tenant}",
            role_name=f"{EXEC_ROLE_PREFIX}{tenant}",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com").with_conditions(
                {
                    "StringEquals": {"aws:SourceAccount": acct},
                    "ArnLike": {"aws:SourceArn": f"arn:{part}:ecs:*:{acct}:*"},
                }
            ),
            description=f"Berth Batch jobs of tenant {tenant}: ECS reads its secrets (berth/{tenant}/) only",
        )
        Tags.of(role).add(TENANT_TAG, tenant)
        for statement in (
            iam.PolicyStatement(
                sid="OwnSecrets",
                actions=["secretsmanager:GetSecretValue"],
                resources=[f"arn:{part}:secretsmanager:{stack.region}:{acct}:secret:berth/{tenant}/*"],
            ),
            iam.PolicyStatement(
                sid="OwnLogGroup",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_group.log_group_arn],
            ),
            # What the ECS agent's instance role already allows every job (image pulls from the
            # account's ECR); ECS uses the execution role for them once a definition names one.
            iam.PolicyStatement(sid="EcrToken", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
            iam.PolicyStatement(
                sid="PullImages",
                actions=[
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchGetImage",
                ],
                resources=[f"arn:{part}:ecr:*:{acct}:repository/*"],
            ),
        ):
            role.add_to_policy(statement)
        return role

    @property
    def regions_json(self) -> str:
        return json.dumps([r.as_json() for r in self.regions], separators=(",", ":"))

    @property
    def capacity_json(self) -> str:
        """``BERTH_CLOUD_CAPACITY``: the instance types the regions' compute environments hold."""
        return cloud_capacity(self.regions).to_json()

    def grant_assume(self, grantee: iam.IGrantable) -> None:
        """Let ``grantee`` (the dispatcher's role) assume BatchSubmitRole with a berth:tenant tag."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="AssumeBatchSubmitRole",
                actions=["sts:AssumeRole", "sts:TagSession"],
                resources=[self.submit_role.role_arn],
            )
        )
