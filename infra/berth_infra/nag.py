"""cdk-nag AwsSolutions acknowledgments (v3: ``Validations.of(scope).acknowledge``), each with its reason.

Every acknowledgment is scoped to the narrowest construct that needs it (an acknowledgment covers that
construct and its children) and, for granular rules, to the exact finding. docs/infrastructure.md
lists them; tests check that each has a reason and that nothing else is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

if TYPE_CHECKING:
    from berth_infra.batch import BatchRegionStack
    from berth_infra.stack import BerthStack


@dataclass(frozen=True)
class NagAck:
    scope: IConstruct
    rule_id: str
    reason: str


def berth_acknowledgments(stack: BerthStack) -> list[NagAck]:
    artifacts = Stack.of(stack).get_logical_id(stack.storage.artifacts.node.default_child)  # type: ignore[arg-type]
    data = Stack.of(stack).get_logical_id(stack.storage.data.node.default_child)  # type: ignore[arg-type]
    secrets = "arn:<AWS::Partition>:secretsmanager:<AWS::Region>:<AWS::AccountId>:secret:berth/*"
    return [
        NagAck(
            stack.api_function.role,
            f"AwsSolutions-IAM5[Resource::<{artifacts}.Arn>/bundles/*]",
            "Bundle keys are bundles/<tenant>/sha256/<digest>.tar.gz for any tenant and digest: the API "
            "checks, presigns and tags them for the caller's tenant, which it derives from the identity.",
        ),
        NagAck(
            stack.api_function.role,
            f"AwsSolutions-IAM5[Resource::{secrets}]",
            "DescribeSecret (existence only, never values) on Berth's secret namespace berth/<tenant>/...; "
            "the handler refuses names outside the caller's tenant prefix before calling it.",
        ),
        NagAck(
            stack.api_function.role,
            f"AwsSolutions-IAM5[Resource::<{data}.Arn>/*/jobs/*]",
            "Job output prefixes are <tenant>/jobs/<job>/ for any tenant and job: the API lists and "
            "presigns GETs only under the prefix of a job the caller's tenant owns (404 otherwise), "
            "derived from the job record, never from the request.",
        ),
        NagAck(
            stack.storage.job_role,
            f"AwsSolutions-IAM5[Resource::<{artifacts}.Arn>/bundles/*]",
            "The job role is never used bare: every credential is vended with a session policy that "
            "narrows it to one tenant's bundle key; the role's policy is the outer bound.",
        ),
        NagAck(
            stack.storage.job_role,
            f"AwsSolutions-IAM5[Resource::<{data}.Arn>/*]",
            "Outer bound of what any job may read in the data bucket; each session policy narrows it to "
            "the job's tenant prefix, granted prefixes and own output prefix.",
        ),
        NagAck(
            stack.storage.job_role,
            f"AwsSolutions-IAM5[Resource::<{data}.Arn>/*/jobs/*]",
            "Outer bound of job output prefixes (<tenant>/jobs/<job>/); each session policy narrows it to "
            "the one job's prefix.",
        ),
        NagAck(
            stack.storage.job_role,
            f"AwsSolutions-IAM5[Resource::{secrets}]",
            "Outer bound of Berth's secret namespace; each session policy names the job's own secrets "
            "under its tenant's prefix only.",
        ),
        NagAck(
            stack.api_function.role,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:"
            "log-group:/berth/jobs/*]",
            "GetLogEvents on the job log groups /berth/jobs/<tenant> (one per tenant, created with the "
            "tenant): the API reads only the stream of a job the caller passed the tenant check for.",
        ),
        NagAck(
            stack.api.rest_api,
            "AwsSolutions-COG4",
            "Berth authenticates every method with AWS_IAM (SigV4): callers are IAM principals mapped to "
            "tenants, so there is no Cognito user pool by design; no method is unauthenticated.",
        ),
        NagAck(
            stack.api.rest_api.deployment_stage,
            "AwsSolutions-APIG3",
            "Every request must carry a valid SigV4 signature (AWS_IAM) and the stage is throttled; a WAF "
            "web ACL is an optional, account-specific add-on attached outside this stack.",
        ),
        NagAck(
            stack.api.rest_api,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]",
            "API Gateway's account-level CloudWatch role, needed for execution logging (APIG6); the "
            "AWS-managed policy is the one AWS documents for this service role and only covers Logs.",
        ),
        NagAck(
            stack.api_function.role,
            "AwsSolutions-IAM5[Resource::*]",
            "xray:PutTraceSegments and xray:PutTelemetryRecords (added by active tracing) do not support "
            "resource-level permissions; no other statement of this role uses a '*' resource (the GSIs "
            "are named one by one).",
        ),
        NagAck(
            stack.api_function.function,
            "AwsSolutions-L1",
            "The runtime is pinned to Python 3.11, the version the project's code and tests target "
            "(pyproject requires-python, CI, the local cloud); it is supported by Lambda and moves only "
            "with the project's Python version.",
        ),
        *_workflow_acknowledgments(stack),
        *_cloud_acknowledgments(stack),
    ]


def _workflow_acknowledgments(stack: BerthStack) -> list[NagAck]:
    wf = stack.workflow
    host_queues = "arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:berth-host-*"
    fn_logical = Stack.of(stack).get_logical_id(wf.workflow_fn.function.node.default_child)  # type: ignore[arg-type]
    acks = [
        NagAck(
            fn.function,
            "AwsSolutions-L1",
            "Python 3.11 like every Berth function: the version the project's code and tests target.",
        )
        for fn in (
            wf.workflow_fn,
            wf.scheduler_fn,
            wf.agent_fn,
            wf.notifier_fn,
            wf.batch_submit_fn,
            wf.batch_events_fn,
        )
    ]
    acks += [
        NagAck(
            fn.role,
            f"AwsSolutions-IAM5[Resource::{host_queues}]",
            "One work queue per on-prem host (berth-host-<host id>), created when a host registers: "
            "host ids are not known when the stack deploys, so the prefix is the narrowest resource.",
        )
        for fn in (wf.workflow_fn, wf.agent_fn)
    ]
    acks += [
        NagAck(
            wf.notifier_fn.role,
            "AwsSolutions-IAM5[Resource::*]",
            "dynamodb:ListStreams (added by the stream event source) has no resource-level permissions; "
            "the stream's reads are on the job-events table's stream only.",
        ),
        NagAck(
            wf.state_machine.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray tracing and CloudWatch Logs delivery of the state machine (logs:*LogDelivery, "
            "xray:Put*) do not support resource-level permissions.",
        ),
        NagAck(
            wf.state_machine.role,
            f"AwsSolutions-IAM5[Resource::<{fn_logical}.Arn>:*]",
            "Invoking the workflow function's versions and aliases (CDK's grant for LambdaInvoke); it is "
            "the one function the state machine calls.",
        ),
        NagAck(
            wf.job_events_queue,
            "AwsSolutions-SQS3",
            "An example target of job events for users to read (JobEventsQueueUrl); messages expire "
            "after 4 days and nothing is lost by not having a dead-letter queue.",
        ),
    ]
    acks += [
        NagAck(
            fn.role,
            "AwsSolutions-IAM5[Resource::*]",
            "batch:ListJobs and batch:DescribeJobs (read-only lookups of Berth's Batch jobs in every "
            "cloud region) have no resource-level permissions; submits, terminations and PassRole run only "
            "in BatchSubmitRole sessions tagged with the job's tenant.",
        )
        for fn in (wf.scheduler_fn, wf.batch_submit_fn, wf.batch_events_fn)
    ]
    return acks


def acknowledge_findings(stack: BerthStack) -> list[NagAck]:
    acks = berth_acknowledgments(stack)
    for ack in acks:
        Validations.of(ack.scope).acknowledge(Acknowledgment(id=ack.rule_id, reason=ack.reason))
    return acks


def _cloud_acknowledgments(stack: BerthStack) -> list[NagAck]:
    """The cloud path's roles (cloud_roles.py): per-tenant prefixes, and Batch's own ARN shapes."""
    cloud = stack.cloud
    logical = Stack.of(stack).get_logical_id
    artifacts = logical(stack.storage.artifacts.node.default_child)  # type: ignore[arg-type]
    data = logical(stack.storage.data.node.default_child)  # type: ignore[arg-type]
    acct = "arn:<AWS::Partition>:{service}:{region}:<AWS::AccountId>:{rest}"
    acks: list[NagAck] = []
    for tenant, role in cloud.job_roles.items():
        for resource, what in (
            (
                f"<{artifacts}.Arn>/bundles/{tenant}/*",
                f"the code bundles of tenant {tenant} (bundles/{tenant}/)",
            ),
            (f"<{data}.Arn>/{tenant}/*", f"the data prefix of tenant {tenant} ({tenant}/)"),
            (f"<{data}.Arn>/{tenant}/jobs/*", f"the job output prefix of tenant {tenant} ({tenant}/jobs/)"),
            (
                acct.format(
                    service="secretsmanager", region="<AWS::Region>", rest=f"secret:berth/{tenant}/*"
                ),
                f"the secrets of tenant {tenant} (berth/{tenant}/)",
            ),
        ):
            acks.append(
                NagAck(
                    role,
                    f"AwsSolutions-IAM5[Resource::{resource}]",
                    f"A Batch job role is one tenant's: the wildcard covers only {what}, a prefix that ends "
                    "with '/'; object keys under it are not known when the stack deploys.",
                )
            )
    for tenant, role in cloud.exec_roles.items():
        secrets = acct.format(
            service="secretsmanager", region="<AWS::Region>", rest=f"secret:berth/{tenant}/*"
        )
        acks.append(
            NagAck(
                role,
                f"AwsSolutions-IAM5[Resource::{secrets}]",
                f"An execution role is one tenant's: ECS reads only the secrets of tenant {tenant} "
                f"(berth/{tenant}/, a prefix that ends with '/'); their names are the tenant's to choose.",
            )
        )
        acks.append(
            NagAck(
                role,
                "AwsSolutions-IAM5[Resource::*]",
                "ecr:GetAuthorizationToken has no resource-level permissions (the registry token only; pulls "
                "are limited to this account's repositories).",
            )
        )
        acks.append(
            NagAck(
                role,
                f"AwsSolutions-IAM5[Resource::{acct.format(service='ecr', region='*', rest='repository/*')}]",
                "Image pulls from this account's ECR, as the ECS instance role already allows every job; "
                "job images are named by the tenants at submit.",
            )
        )
    role = cloud.submit_role
    acks.append(
        NagAck(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "batch:DescribeJobs, DescribeJobDefinitions and DescribeJobQueues do not support resource-level "
            "permissions (they only read; the dispatcher re-reads its jobs after every event).",
        )
    )
    acks.append(
        NagAck(
            role,
            f"AwsSolutions-IAM5[Resource::{acct.format(service='iam', region='', rest='role/Berth-job-*')}]",
            "PassRole on Berth's per-tenant job roles only (Berth-job-<tenant>), and only when the role's "
            "berth:tenant tag equals the session's tenant and it is passed to Batch or ECS tasks.",
        )
    )
    acks.append(
        NagAck(
            role,
            f"AwsSolutions-IAM5[Resource::{acct.format(service='iam', region='', rest='role/Berth-exec-*')}]",
            "PassRole on Berth's per-tenant execution roles only (Berth-exec-<tenant>), and only when the "
            "role's berth:tenant tag equals the session's tenant and it is passed to Batch or ECS tasks.",
        )
    )
    for region in cloud.regions:
        definitions = acct.format(service="batch", region=region.region, rest="job-definition/berth-*")
        jobs = acct.format(service="batch", region=region.region, rest="job/*")
        queues = acct.format(service="batch", region=region.region, rest=f"job-queue/berth-{region.region}-*")
        acks.append(
            NagAck(
                role,
                f"AwsSolutions-IAM5[Resource::{queues}]",
                "Berth's job queues of the region (one per instance type and purchase type, "
                "berth-<region>-<family>_<size>-<ondemand|spot>, all created by Berth's regional stack): "
                "listed one by one they overflow the role's inline policy; SubmitJob is further limited "
                "to jobs tagged with the session's tenant.",
            )
        )
        acks.append(
            NagAck(
                role,
                f"AwsSolutions-IAM5[Resource::{definitions}]",
                "Berth registers one job definition per image (berth-img-<digest>...), named at run time; "
                "the prefix keeps the role off any other definition in the account.",
            )
        )
        acks.append(
            NagAck(
                role,
                f"AwsSolutions-IAM5[Resource::{jobs}]",
                "Batch job ids are assigned by Batch at submit; TerminateJob is further limited to jobs "
                "tagged with the session's tenant, TagResource to tag-on-create.",
            )
        )
    return acks


def batch_acknowledgments(stack: BatchRegionStack) -> list[NagAck]:
    return [
        NagAck(
            stack.instance_role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonEC2ContainerServiceforEC2Role]",
            "The ECS agent's instance role, the policy AWS Batch documents for EC2 compute environments "
            "and keeps current with the agent; jobs cannot use it (IMDSv2, hop limit 1) and run as their "
            "tenant's job role.",
        )
    ]


def acknowledge_batch_findings(stack: BatchRegionStack) -> list[NagAck]:
    acks = batch_acknowledgments(stack)
    for ack in acks:
        Validations.of(ack.scope).acknowledge(Acknowledgment(id=ack.rule_id, reason=ack.reason))
    return acks
