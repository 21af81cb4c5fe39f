"""Where code and data live: the artifacts bucket (code bundles), the data bucket (tenant data, job
outputs and checkpoints), their access-log bucket, and the job role that per-attempt credentials are
vended from. Layout and rules: docs/data.md; the key layout is a contract with ``berth.domain.storage``.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

#: Bundles tagged ``berth-referenced=false`` at upload and never used by a submit expire after this.
UNREFERENCED_BUNDLE_DAYS = 7
NONCURRENT_VERSION_DAYS = 30
#: Longest session a vended credential may have (the attempt's lease is shorter and refreshed).
JOB_CREDENTIALS_MAX_SESSION = Duration.hours(12)


def _bucket(scope: Construct, construct_id: str, **kwargs: object) -> s3.Bucket:
    """Berth's baseline: S3-managed encryption, TLS only, no public access, owner-enforced objects."""
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        removal_policy=RemovalPolicy.RETAIN,
        **kwargs,  # type: ignore[arg-type]
    )


class Storage(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.access_logs = _bucket(
            self,
            "AccessLogs",
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(365))],
        )
        self.artifacts = _bucket(
            self,
            "Artifacts",
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-unreferenced-bundles",
                    prefix="bundles/",
                    tag_filters={"berth-referenced": "false"},
                    expiration=Duration.days(UNREFERENCED_BUNDLE_DAYS),
                ),
                s3.LifecycleRule(
                    id="expire-old-versions",
                    noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
        )
        self.data = _bucket(
            self,
            "Data",
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-old-versions",
                    noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )
        stack = Stack.of(self)
        # The role per-attempt credentials are vended from. Its own policy bounds what any job could
        # ever do (read bundles and tenant data, write job outputs, read tenants' secrets); the session
        # policy of each AssumeRole narrows it to one tenant, one job and its sources.
        self.job_role = iam.Role(
            self,
            "JobRole",
            assumed_by=iam.AccountPrincipal(stack.account).with_conditions(
                {"StringEquals": {"aws:SourceAccount": stack.account}}
            ),
            max_session_duration=JOB_CREDENTIALS_MAX_SESSION,
            description="Berth job attempts: vended with a per-job session policy, never used bare",
        )
        # The agent API's function names the job as SourceIdentity and may tag the session.
        self.job_role.assume_role_policy.add_statements(  # type: ignore[union-attr]
            iam.PolicyStatement(
                actions=["sts:SetSourceIdentity", "sts:TagSession"],
                principals=[iam.AccountPrincipal(stack.account)],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        self.job_role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[self.artifacts.arn_for_objects("bundles/*"), self.data.arn_for_objects("*")],
            )
        )
        self.job_role.add_to_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[self.data.arn_for_objects("*/jobs/*")])
        )
        self.job_role.add_to_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.data.bucket_arn])
        )
        self.job_role.add_to_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue"],
                resources=[
                    f"arn:{stack.partition}:secretsmanager:{stack.region}:{stack.account}:secret:berth/*"
                ],
            )
        )
