"""``BatchRegionStack``: Berth's AWS Batch capacity in one cloud region (docs/cloud.md).

Per region: a small VPC (or the subnets of an existing one), a security group with no ingress, a
launch template that requires IMDSv2 with a hop limit of 1 (a job's container cannot reach the
instance's credentials), the instance role, per instance type (g5.xlarge, g5.12xlarge, ...,
p5.48xlarge) two managed compute environments holding only that type (on-demand
``BEST_FIT_PROGRESSIVE`` and spot ``SPOT_PRICE_CAPACITY_OPTIMIZED``, the ECS NVIDIA AMI) and one
job queue on each (``berth-<region>-<family>_<size>-<ondemand|spot>``, the scheduler's
``CloudOffer.queue_name``), and a rule on the region's default bus that forwards Berth's ``Batch Job
State Change`` events to the home bus. AWS Batch chooses neither the GPU model nor the size, so a
queue that mixed families would run a job on whichever GPU it found first, and one that mixed sizes
on whichever size packed best (a g5.12xlarge at 5.672 USD/h for a job priced on a g5.xlarge at
1.006): not the instance the scheduler chose and priced.
"""

from __future__ import annotations

import re
from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack, Tags
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from berth.domain.batch_queues import instance_family
from berth.domain.cloud import ACTED_ON_STATUSES
from berth_infra.cloud_config import FORWARD_ROLE_PREFIX, FORWARD_RULE_NAME, CloudRegion

#: The ECS-optimised GPU AMI Batch launches (NVIDIA driver, container toolkit). Amazon Linux 2 left
#: standard support on 2026-06-30, so the AL2023 variant (ECS_AL2023_NVIDIA) is used.
IMAGE_TYPE = "ECS_AL2023_NVIDIA"
ONDEMAND_ALLOCATION = "BEST_FIT_PROGRESSIVE"
SPOT_ALLOCATION = "SPOT_PRICE_CAPACITY_OPTIMIZED"
#: Root volume of each instance (container images of training jobs are large), encrypted.
ROOT_VOLUME_GIB = 200
#: A job that stays RUNNABLE this long for lack of capacity or a misfit is canceled by Batch itself
#: (a backstop: the dispatcher's own runnable timeout is shorter and fails over first).
RUNNABLE_LIMIT_S = 3600
RUNNABLE_LIMIT_REASONS = (
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE",
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
)
BATCH_STATE_CHANGE = "Batch Job State Change"


def construct_prefix(instance_type: str, spot: bool) -> str:
    """Construct and output id prefix of an instance type's compute environment and queue:
    ``g6e.48xlarge`` -> ``G6e48xlargeSpot``."""
    parts = re.split(r"[^A-Za-z0-9]+", instance_type)
    return "".join(p.capitalize() for p in parts) + ("Spot" if spot else "OnDemand")


def home_bus_arn(partition: str, home_region: str, account: str, bus_name: str) -> str:
    return f"arn:{partition}:events:{home_region}:{account}:event-bus/{bus_name}"


class BatchRegionStack(Stack):
    """Berth's Batch compute environments, queues and event forwarding in ``cloud_region.region``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cloud_region: CloudRegion,
        home_region: str,
        home_bus_name: str,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault(
            "description", f"Berth: AWS Batch GPU capacity in {cloud_region.region} (queues, events)"
        )
        super().__init__(scope, construct_id, **kwargs)
        self.cloud_region = cloud_region
        region = cloud_region.region
        Tags.of(self).add("berth:component", "batch")

        # -- network ---------------------------------------------------------------------------
        vpc_id = self.node.try_get_context(f"berth:vpcId:{region}")
        subnet_ids = self.node.try_get_context(f"berth:subnetIds:{region}")
        self.vpc: ec2.Vpc | None = None
        if vpc_id and subnet_ids:
            # An existing VPC: its private subnets must reach ECS, ECR, S3, CloudWatch Logs and STS
            # (a NAT gateway or VPC endpoints), see docs/cloud.md.
            subnets = list(subnet_ids if isinstance(subnet_ids, list) else str(subnet_ids).split(","))
        else:
            self.vpc = self._vpc()
            vpc_id = self.vpc.vpc_id
            subnets = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnet_ids
        self.security_group = ec2.CfnSecurityGroup(
            self,
            "InstanceSecurityGroup",
            group_description="Berth Batch GPU instances: inbound from the group only, outbound to AWS APIs",
            vpc_id=vpc_id,
            security_group_egress=[
                ec2.CfnSecurityGroup.EgressProperty(
                    ip_protocol="-1", cidr_ip="0.0.0.0/0", description="AWS APIs and image registries"
                )
            ],
        )
        # A gang runs as a Batch multi-node parallel job: awsvpc mode, each node's container its own
        # network interface with this group; its ranks reach the main node (MASTER_ADDR:MASTER_PORT)
        # and each other (NCCL) only through this rule. Nothing outside the group gets in.
        ec2.CfnSecurityGroupIngress(
            self,
            "GangNodesIngress",
            group_id=self.security_group.attr_group_id,
            ip_protocol="-1",
            source_security_group_id=self.security_group.attr_group_id,
            description="Nodes of one multi-node parallel job reach each other",
        )

        # -- instances ------------------------------------------------------------------------
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                # IMDSv2 only, one hop: the ECS agent (host network) reaches the instance metadata,
                # a job's container (bridge network, one hop further) cannot.
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
                ),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name="/dev/xvda",
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            encrypted=True,
                            volume_size=ROOT_VOLUME_GIB,
                            volume_type="gp3",
                            delete_on_termination=True,
                        ),
                    )
                ],
            ),
        )
        self.instance_role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="Berth Batch GPU instances: the ECS agent (jobs use their tenant's job role)",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name(
                    "service-role/AmazonEC2ContainerServiceforEC2Role"
                )
            ],
        )
        self.instance_profile = iam.CfnInstanceProfile(
            self, "InstanceProfile", roles=[self.instance_role.role_name]
        )

        # -- compute environments and queues: one of each per (instance type, purchase type) -------
        self.compute_environments: dict[tuple[str, bool], batch.CfnComputeEnvironment] = {}
        self.job_queues: dict[tuple[str, bool], batch.CfnJobQueue] = {}
        for instance_type in cloud_region.instance_types:
            for spot in (False, True):
                ce = self._compute_environment(instance_type, spot, subnets)
                self.compute_environments[instance_type, spot] = ce
                self.job_queues[instance_type, spot] = batch.CfnJobQueue(
                    self,
                    f"{construct_prefix(instance_type, spot)}Queue",
                    job_queue_name=cloud_region.name(instance_type, spot),
                    priority=1,
                    state="ENABLED",
                    compute_environment_order=[
                        batch.CfnJobQueue.ComputeEnvironmentOrderProperty(compute_environment=ce.ref, order=1)
                    ],
                    job_state_time_limit_actions=[
                        batch.CfnJobQueue.JobStateTimeLimitActionProperty(
                            action="CANCEL",
                            max_time_seconds=RUNNABLE_LIMIT_S,
                            reason=reason,
                            state="RUNNABLE",
                        )
                        for reason in RUNNABLE_LIMIT_REASONS
                    ],
                )

        # -- job state changes to the home bus ------------------------------------------------
        self.home_bus_arn = home_bus_arn(self.partition, home_region, self.account, home_bus_name)
        rule_arn = f"arn:{self.partition}:events:{region}:{self.account}:rule/{FORWARD_RULE_NAME}"
        self.forward_role = iam.Role(
            self,
            "ForwardRole",
            role_name=f"{FORWARD_ROLE_PREFIX}{region}",
            assumed_by=iam.ServicePrincipal("events.amazonaws.com").with_conditions(
                {"StringEquals": {"aws:SourceAccount": self.account, "aws:SourceArn": rule_arn}}
            ),
            description=f"EventBridge: forward Berth's Batch job state changes in {region} to the home bus",
        )
        self.forward_role.add_to_policy(
            iam.PolicyStatement(
                sid="HomeBusOnly", actions=["events:PutEvents"], resources=[self.home_bus_arn]
            )
        )
        queue_arn_prefix = f"arn:{self.partition}:batch:{region}:{self.account}:job-queue/berth-"
        self.forward_rule = events.CfnRule(
            self,
            "ForwardJobStateChanges",
            name=FORWARD_RULE_NAME,
            description="Berth's Batch job state changes to the home event bus (consumers re-read the store)",
            state="ENABLED",
            event_pattern={
                "source": ["aws.batch"],
                "detail-type": [BATCH_STATE_CHANGE],
                "detail": {
                    "jobQueue": [{"prefix": queue_arn_prefix}],
                    "status": [str(s) for s in ACTED_ON_STATUSES],
                },
            },
            targets=[
                events.CfnRule.TargetProperty(
                    id="HomeBus",
                    arn=self.home_bus_arn,
                    role_arn=self.forward_role.role_arn,
                )
            ],
        )

        outputs: dict[str, tuple[str, str]] = {}
        for (instance_type, spot), queue in self.job_queues.items():
            what = f"{instance_type} {'spot' if spot else 'on-demand'}"
            prefix = construct_prefix(instance_type, spot)
            outputs[f"{prefix}QueueArn"] = (queue.ref, f"GPU job queue, {what}")
            outputs[f"{prefix}ComputeEnvironmentArn"] = (
                self.compute_environments[instance_type, spot].ref,
                f"GPU compute environment, {what}",
            )
        outputs["ForwardRoleArn"] = (self.forward_role.role_arn, "Forwards job state changes to the home bus")
        # (Ref on a compute environment or job queue is its ARN.)
        for output_id, (value, description) in outputs.items():
            CfnOutput(self, output_id, value=value, description=description)

        from berth_infra.nag import acknowledge_batch_findings

        self.nag_acknowledgments = acknowledge_batch_findings(self)

    def _vpc(self) -> ec2.Vpc:
        vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=1,
            # The default security group is never used (instances have their own); not emptying it
            # avoids the custom resource (a Lambda) CDK would add for that.
            restrict_default_security_group=False,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="Instances", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                ),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)
            },
        )
        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )
        return vpc

    def _compute_environment(
        self, instance_type: str, spot: bool, subnets: list[str]
    ) -> batch.CfnComputeEnvironment:
        region = self.cloud_region
        resources = batch.CfnComputeEnvironment.ComputeResourcesProperty(
            type="SPOT" if spot else "EC2",
            allocation_strategy=SPOT_ALLOCATION if spot else ONDEMAND_ALLOCATION,
            minv_cpus=0,
            maxv_cpus=region.max_vcpus,
            instance_types=[instance_type],
            subnets=subnets,
            security_group_ids=[self.security_group.attr_group_id],
            instance_role=self.instance_profile.attr_arn,
            launch_template=batch.CfnComputeEnvironment.LaunchTemplateSpecificationProperty(
                launch_template_id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            ec2_configuration=[
                batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty(image_type=IMAGE_TYPE)
            ],
            bid_percentage=100 if spot else None,
            tags={
                "berth:region": region.region,
                "berth:family": instance_family(instance_type),
                "berth:instance-type": instance_type,
                "berth:capacity": "spot" if spot else "ondemand",
            },
        )
        # No ServiceRole: Batch uses its service-linked role AWSServiceRoleForBatch (created on first
        # use), so the stack holds no role with AWSBatchServiceRole attached.
        return batch.CfnComputeEnvironment(
            self,
            f"{construct_prefix(instance_type, spot)}Compute",
            compute_environment_name=region.name(instance_type, spot),
            type="MANAGED",
            state="ENABLED",
            compute_resources=resources,
            replace_compute_environment=False,
            update_policy=batch.CfnComputeEnvironment.UpdatePolicyProperty(
                terminate_jobs_on_update=False, job_execution_timeout_minutes=30
            ),
        )
