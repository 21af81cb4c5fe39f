"""The cloud path's infrastructure: per-region Batch stacks and the home stack's cloud roles.

Expected values are written out here (names from docs/cloud.md, regions and instance types of the
shipped price file), independently of infra/.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from berth_infra.cloud_config import (
    DEFAULT_TENANTS,
    CloudConfigError,
    default_cloud_regions,
    parse_cloud_regions,
)
from berth_infra.nag import batch_acknowledgments
from tests.infra.conftest import Synthesized

REPO_ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("us-east-1", "us-east-2", "us-west-2")
#: The price file's g5/g6/g6e/p3/p4d/p5 types per region: single- and multi-GPU sizes.
INSTANCE_TYPES = {
    "us-east-1": [
        "g5.12xlarge",
        "g5.xlarge",
        "g6.4xlarge",
        "g6.8xlarge",
        "g6.xlarge",
        "g6e.16xlarge",
        "g6e.24xlarge",
        "g6e.2xlarge",
        "g6e.48xlarge",
        "p3.16xlarge",
        "p3.2xlarge",
        "p3.8xlarge",
        "p4d.24xlarge",
        "p5.48xlarge",
    ],
    "us-east-2": ["p4d.24xlarge", "p5.48xlarge"],
    "us-west-2": ["g5.xlarge", "g6.xlarge", "p3.16xlarge", "p3.2xlarge", "p4d.24xlarge", "p5.48xlarge"],
}
FAMILIES = {region: sorted({t.split(".")[0] for t in types}) for region, types in INSTANCE_TYPES.items()}
#: One compute environment and job queue per (region, instance type, purchase type): AWS Batch chooses
#: neither the GPU model nor the size, so each holds the one type the scheduler priced.
KINDS = ("ondemand", "spot")


def _queue(region: str, instance_type: str, kind: str) -> str:
    """``berth-us-east-1-g5_12xlarge-ondemand`` (Batch names allow no dot), written out here."""
    family, size = instance_type.split(".")
    return f"berth-{region}-{family}_{size}-{kind}"


TENANTS = ("vision", "nlp", "platform")
PASSED_TO = ["batch.amazonaws.com", "ecs-tasks.amazonaws.com"]
SESSION_TENANT = "${aws:PrincipalTag/berth:tenant}"


def _resources(template: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def _batch(s: Synthesized, region: str) -> dict[str, Any]:
    data: dict[str, Any] = dict(s.batch[region][1].to_json())
    return data


def _text(value: Any) -> str:
    """A Fn::Join of strings and pseudo parameters as text (<AccountId>, <Partition>)."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        return "".join(_text(p) for p in value["Fn::Join"][1])
    if "Ref" in value and str(value["Ref"]).startswith("AWS::"):
        return "<" + value["Ref"].split("::")[1] + ">"
    return json.dumps(value)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# -- configuration ------------------------------------------------------------------------------
def test_default_regions_and_types_come_from_the_price_file() -> None:
    regions = default_cloud_regions()
    assert [r.region for r in regions] == list(REGIONS)
    for region in regions:
        assert sorted(region.instance_types) == sorted(INSTANCE_TYPES[region.region])
        assert sorted(region.families) == FAMILIES[region.region]
        assert region.name("g5.xlarge", False) == f"berth-{region.region}-g5_xlarge-ondemand"
        assert region.name("p4d.24xlarge", True) == f"berth-{region.region}-p4d_24xlarge-spot"


def test_queue_names_match_the_schedulers_offers() -> None:
    from berth.scheduler.snapshot import CloudOffer

    offer = CloudOffer("us-east-2", "use2-az1", "p5.48xlarge", "H100", 8, 192, 2048, 98.0, 40.0)
    region = parse_cloud_regions(
        [{"region": "us-east-2", "instance_types": ["p4d.24xlarge", "p5.48xlarge"]}]
    )[0]
    assert offer.queue_name(True) == region.name("p5.48xlarge", True) == "berth-us-east-2-p5_48xlarge-spot"
    assert (
        offer.queue_name(False) == region.name("p5.48xlarge", False) == "berth-us-east-2-p5_48xlarge-ondemand"
    )


def test_a_regions_families_split_its_instance_types() -> None:
    (region,) = parse_cloud_regions(
        [{"region": "eu-west-1", "instance_types": ["g6.xlarge", "g5.xlarge", "g6.4xlarge", "g6.xlarge"]}]
    )
    assert region.families == ("g6", "g5")
    assert region.instance_types_of("g6") == ("g6.xlarge", "g6.4xlarge")
    assert region.instance_types_of("g5") == ("g5.xlarge",)


def test_the_capacity_the_functions_get_is_the_regions_instance_types() -> None:
    from berth.domain.batch_queues import CloudCapacity
    from berth_infra.cloud_config import cloud_capacity

    capacity = cloud_capacity(default_cloud_regions())
    assert CloudCapacity.from_json(capacity.to_json()) == capacity
    assert {r: sorted(t) for r, t in capacity.regions.items()} == INSTANCE_TYPES


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        [],
        [{"region": "Mars", "instance_types": ["p5.48xlarge"]}],
        [{"region": "us-east-1", "instance_types": []}],
        [{"region": "us-east-1", "instance_types": ["p5"]}],
        [{"region": "us-east-1", "instance_types": ["p5.48xlarge"], "max_vcpus": 0}],
        [{"region": "us-east-1", "instance_types": ["p5.48xlarge"]}] * 2,
        [{"region": "us-east-1", "instance_types": [f"x{i}.large" for i in range(21)]}],
    ],
)
def test_bad_region_configuration_is_refused(value: object) -> None:
    with pytest.raises(CloudConfigError):
        parse_cloud_regions(value)


def test_configured_regions_are_parsed_from_cli_json() -> None:
    (region,) = parse_cloud_regions(
        '[{"region": "eu-west-1", "instance_types": ["g6.xlarge"], "max_vcpus": 64}]'
    )
    assert (region.region, region.instance_types, region.max_vcpus) == ("eu-west-1", ("g6.xlarge",), 64)


def test_default_tenants_are_the_local_clouds() -> None:
    from berth_tools.localcloud.seed import DEFAULT_USERS

    assert set(DEFAULT_TENANTS) == {u.tenant for u in DEFAULT_USERS} == set(TENANTS)


# -- regional stacks ----------------------------------------------------------------------------
def test_one_batch_stack_per_region_written_to_the_assembly(synthesized: Synthesized) -> None:
    assert set(synthesized.batch) == set(REGIONS)
    for region, (stack, _) in synthesized.batch.items():
        assert stack.stack_name == f"Berth-batch-{region}"
        assert stack.region == region
        assert (synthesized.outdir / f"Berth-batch-{region}.template.json").is_file()


def _compute_environments(s: Synthesized, region: str) -> dict[str, dict[str, Any]]:
    return {
        e["Properties"]["ComputeEnvironmentName"]: e["Properties"]
        for e in _resources(_batch(s, region), "AWS::Batch::ComputeEnvironment").values()
    }


def test_compute_environments_per_region_and_instance_type(synthesized: Synthesized) -> None:
    for region in REGIONS:
        envs = _compute_environments(synthesized, region)
        assert set(envs) == {_queue(region, t, k) for t in INSTANCE_TYPES[region] for k in KINDS}
        # Under AWS Batch's default quota of 50 compute environments (and queues) per region.
        assert len(envs) <= 40
        for instance_type in INSTANCE_TYPES[region]:
            ondemand = envs[_queue(region, instance_type, "ondemand")]
            spot = envs[_queue(region, instance_type, "spot")]
            for env, kind, strategy in (
                (ondemand, "EC2", "BEST_FIT_PROGRESSIVE"),
                (spot, "SPOT", "SPOT_PRICE_CAPACITY_OPTIMIZED"),
            ):
                assert env["Type"] == "MANAGED" and env["State"] == "ENABLED"
                # Batch's service-linked role, not a role of the stack with AWSBatchServiceRole.
                assert "ServiceRole" not in env
                resources = env["ComputeResources"]
                assert resources["Type"] == kind
                assert resources["AllocationStrategy"] == strategy
                # Only this instance type: Batch can pick neither another model nor another size.
                assert resources["InstanceTypes"] == [instance_type]
                assert resources["MinvCpus"] == 0 and resources["MaxvCpus"] > 0
                assert resources["Ec2Configuration"] == [{"ImageType": "ECS_AL2023_NVIDIA"}]
                assert resources["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": "LaunchTemplate"}
                assert "Ec2KeyPair" not in resources  # no SSH into GPU instances
                assert resources["Tags"]["berth:family"] == instance_type.split(".")[0]
                assert resources["Tags"]["berth:instance-type"] == instance_type
    # The multi-GPU sizes the scheduler packs several jobs onto have queues of their own.
    east1 = _compute_environments(synthesized, "us-east-1")
    assert east1["berth-us-east-1-g5_12xlarge-spot"]["ComputeResources"]["InstanceTypes"] == ["g5.12xlarge"]
    assert east1["berth-us-east-1-g6e_48xlarge-ondemand"]["ComputeResources"]["InstanceTypes"] == [
        "g6e.48xlarge"
    ]


def test_an_a10g_jobs_queue_runs_only_g5_instances(synthesized: Synthesized) -> None:
    """Regression (issue 11): the queue the scheduler names for an A10G offer has a compute
    environment of g5 (A10G) types only, so Batch cannot start the job on an L4, L40S, A100 or H100."""
    from berth.pricing.catalog import load_offers

    for region in ("us-east-1", "us-west-2"):
        template = _batch(synthesized, region)
        queues = {
            q["Properties"]["JobQueueName"]: q["Properties"]
            for q in _resources(template, "AWS::Batch::JobQueue").values()
        }
        envs = _resources(template, "AWS::Batch::ComputeEnvironment")
        offers = [o for o in load_offers(regions=[region], gpu_types=["A10G"])]
        assert offers
        for offer in offers:
            for spot in (False, True):
                (order,) = queues[offer.queue_name(spot)]["ComputeEnvironmentOrder"]
                ce = envs[order["ComputeEnvironment"]["Ref"]]["Properties"]["ComputeResources"]
                assert ce["InstanceTypes"] and all(t.startswith("g5.") for t in ce["InstanceTypes"])
                assert ce["Type"] == ("SPOT" if spot else "EC2")


def test_the_instance_the_scheduler_priced_is_the_one_batch_launches(synthesized: Synthesized) -> None:
    """Issue 23 item 6: for every offer of the catalog a region deploys, the queue the scheduler names
    runs exactly that instance type, so the price it decided on (the offer's) is the price paid. A
    queue of g5.xlarge and g5.12xlarge let Batch start a 5.672 USD/h g5.12xlarge for a job priced on
    a 1.006 USD/h g5.xlarge."""
    from berth.pricing.catalog import load_offers

    for region in REGIONS:
        template = _batch(synthesized, region)
        queues = {
            q["Properties"]["JobQueueName"]: q["Properties"]
            for q in _resources(template, "AWS::Batch::JobQueue").values()
        }
        envs = _resources(template, "AWS::Batch::ComputeEnvironment")
        offers = [o for o in load_offers(regions=[region]) if o.instance_type in INSTANCE_TYPES[region]]
        assert {o.instance_type for o in offers} == set(INSTANCE_TYPES[region])
        for offer in offers:
            for spot in (False, True):
                (order,) = queues[offer.queue_name(spot)]["ComputeEnvironmentOrder"]
                ce = envs[order["ComputeEnvironment"]["Ref"]]["Properties"]["ComputeResources"]
                assert ce["InstanceTypes"] == [offer.instance_type], offer.queue_name(spot)
                assert ce["Type"] == ("SPOT" if spot else "EC2")


def test_job_queues_per_region_and_instance_type(synthesized: Synthesized) -> None:
    for region in REGIONS:
        template = _batch(synthesized, region)
        envs = {
            lid: e["Properties"]["ComputeEnvironmentName"]
            for lid, e in _resources(template, "AWS::Batch::ComputeEnvironment").items()
        }
        queues = {
            q["Properties"]["JobQueueName"]: q["Properties"]
            for q in _resources(template, "AWS::Batch::JobQueue").values()
        }
        assert set(queues) == {_queue(region, t, k) for t in INSTANCE_TYPES[region] for k in KINDS}
        for name, props in queues.items():
            assert props["State"] == "ENABLED"
            (order,) = props["ComputeEnvironmentOrder"]
            # Each queue on the compute environment of the same name (spot never falls to on-demand,
            # one instance type never to another).
            assert envs[order["ComputeEnvironment"]["Ref"]] == name
            reasons = {a["Reason"] for a in props["JobStateTimeLimitActions"]}
            assert "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY" in reasons
            assert all(
                a["State"] == "RUNNABLE" and a["Action"] == "CANCEL"
                for a in props["JobStateTimeLimitActions"]
            )
        outputs = template["Outputs"]
        for instance_type in INSTANCE_TYPES[region]:
            family, size = instance_type.split(".")
            prefix = family.capitalize() + size.capitalize()  # g6e.48xlarge -> G6e48xlarge
            for key, name in ((f"{prefix}OnDemandQueueArn", "ondemand"), (f"{prefix}SpotQueueArn", "spot")):
                ref = outputs[key]["Value"]["Ref"]
                assert template["Resources"][ref]["Properties"]["JobQueueName"] == _queue(
                    region, instance_type, name
                )


def test_instances_require_imdsv2_with_hop_limit_one(synthesized: Synthesized) -> None:
    for region in REGIONS:
        template = _batch(synthesized, region)
        (lt,) = _resources(template, "AWS::EC2::LaunchTemplate").values()
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"] == {
            "HttpEndpoint": "enabled",
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
        }
        assert all(m["Ebs"]["Encrypted"] is True for m in data["BlockDeviceMappings"])


def test_instances_accept_inbound_traffic_from_their_own_group_only(synthesized: Synthesized) -> None:
    for region in REGIONS:
        template = _batch(synthesized, region)
        ((logical, sg),) = _resources(template, "AWS::EC2::SecurityGroup").items()
        assert "SecurityGroupIngress" not in sg["Properties"]
        # the nodes of a gang (a multi-node parallel job, awsvpc) reach each other; nothing else gets in
        (ingress,) = _resources(template, "AWS::EC2::SecurityGroupIngress").values()
        own = {"Fn::GetAtt": [logical, "GroupId"]}
        assert (
            ingress["Properties"]["GroupId"] == own and ingress["Properties"]["SourceSecurityGroupId"] == own
        )
        assert "CidrIp" not in ingress["Properties"]
        envs = _resources(template, "AWS::Batch::ComputeEnvironment").values()
        subnets = {json.dumps(s) for e in envs for s in e["Properties"]["ComputeResources"]["Subnets"]}
        # Instances live in the private subnets (egress through the NAT gateway), never public ones.
        for subnet in subnets:
            logical = json.loads(subnet)["Ref"]
            assert template["Resources"][logical]["Properties"]["MapPublicIpOnLaunch"] is False


def test_job_state_changes_are_forwarded_to_the_home_bus(synthesized: Synthesized) -> None:
    for region in REGIONS:
        template = _batch(synthesized, region)
        (rule,) = _resources(template, "AWS::Events::Rule").values()
        props = rule["Properties"]
        assert "EventBusName" not in props  # the region's default bus, where Batch puts its events
        pattern = props["EventPattern"]
        assert pattern["source"] == ["aws.batch"]
        assert pattern["detail-type"] == ["Batch Job State Change"]
        assert pattern["detail"]["status"] == ["RUNNING", "SUCCEEDED", "FAILED"]  # what Berth acts on
        (prefix,) = pattern["detail"]["jobQueue"]
        assert _text(prefix["prefix"]) == f"arn:aws:batch:{region}:<AccountId>:job-queue/berth-"
        (target,) = props["Targets"]
        assert _text(target["Arn"]) == "arn:aws:events:us-east-1:<AccountId>:event-bus/berth-Berth"
        role_id = target["RoleArn"]["Fn::GetAtt"][0]
        role = template["Resources"][role_id]["Properties"]
        assert role["RoleName"] == f"Berth-batch-events-{region}"
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "events.amazonaws.com"}
        assert trust["Condition"]["StringEquals"]["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
        assert _text(trust["Condition"]["StringEquals"]["aws:SourceArn"]) == (
            f"arn:aws:events:{region}:<AccountId>:rule/berth-batch-state-changes"
        )
        # The forwarding role may do exactly one thing: put events on the home bus.
        statements = [
            st
            for policy in _resources(template, "AWS::IAM::Policy").values()
            if {"Ref": role_id} in policy["Properties"]["Roles"]
            for st in policy["Properties"]["PolicyDocument"]["Statement"]
        ]
        assert [(st["Effect"], st["Action"], _text(st["Resource"])) for st in statements] == [
            ("Allow", "events:PutEvents", "arn:aws:events:us-east-1:<AccountId>:event-bus/berth-Berth")
        ]


def test_regional_stacks_make_no_cross_stack_references(synthesized: Synthesized) -> None:
    for region in REGIONS:
        text = json.dumps(_batch(synthesized, region))
        assert "Fn::ImportValue" not in text
        assert "Custom::" not in text  # no custom resource (and no Lambda) in a Batch stack


def test_batch_acknowledgments_have_reasons(synthesized: Synthesized) -> None:
    doc = (REPO_ROOT / "docs" / "infrastructure.md").read_text()
    for stack, _ in synthesized.batch.values():
        acks = batch_acknowledgments(stack)
        assert acks
        for ack in acks:
            assert len(ack.reason) >= 60 and ack.scope is not stack
            assert ack.rule_id.split("[")[0] in doc


def test_cfn_lint_passes_on_the_batch_templates(synthesized: Synthesized) -> None:
    paths = [str(synthesized.outdir / f"Berth-batch-{region}.template.json") for region in REGIONS]
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), *paths],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the home stack's cloud roles ---------------------------------------------------------------
def _role_by_name(s: Synthesized, name: str) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (lid, role["Properties"])
        for lid, role in s.resources("AWS::IAM::Role").items()
        if role["Properties"].get("RoleName") == name
    ]
    return found


def _role_statements(s: Synthesized, role_id: str) -> list[dict[str, Any]]:
    return [
        st
        for policy in s.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def _bucket_names(s: Synthesized) -> dict[str, str]:
    outputs = s.json["Outputs"]
    return {outputs[o]["Value"]["Ref"]: o for o in ("ArtifactsBucketName", "DataBucketName")}


def _resource_text(s: Synthesized, value: Any) -> str:
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(_resource_text(s, p) for p in value["Fn::Join"][1])
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        logical = value["Fn::GetAtt"][0]
        return _bucket_names(s).get(logical) or f"<{s.json['Resources'][logical]['Type']}>"
    return _text(value)


def test_a_job_role_per_tenant_scoped_to_its_prefixes(synthesized: Synthesized) -> None:
    for tenant in TENANTS:
        role_id, role = _role_by_name(synthesized, f"Berth-job-{tenant}")
        assert {"Key": "berth:tenant", "Value": tenant} in role["Tags"]
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
        assert trust["Action"] == "sts:AssumeRole"
        assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
        assert _text(trust["Condition"]["ArnLike"]["aws:SourceArn"]) == "arn:<Partition>:ecs:*:<AccountId>:*"
        assert "ManagedPolicyArns" not in role
        granted: dict[str, set[str]] = {}
        for st in _role_statements(synthesized, role_id):
            assert st["Effect"] == "Allow"
            for resource in _as_list(st["Resource"]):
                granted.setdefault(_resource_text(synthesized, resource), set()).update(
                    _as_list(st["Action"])
                )
            if st["Action"] == "s3:ListBucket":
                assert st["Condition"] == {"StringLike": {"s3:prefix": [f"{tenant}/*"]}}
        assert granted == {
            f"ArtifactsBucketName/bundles/{tenant}/*": {"s3:GetObject"},
            f"DataBucketName/{tenant}/*": {"s3:GetObject"},
            f"DataBucketName/{tenant}/jobs/*": {"s3:PutObject"},
            "DataBucketName": {"s3:ListBucket"},
            f"arn:<Partition>:secretsmanager:<Region>:<AccountId>:secret:berth/{tenant}/*": {
                "secretsmanager:GetSecretValue"
            },
            "<AWS::Logs::LogGroup>": {"logs:CreateLogStream", "logs:PutLogEvents"},
        }
        # Every prefix ends with '/': tenant vision never matches vision2.
        for resource in granted:
            if resource.endswith("*"):
                assert resource.endswith(f"{tenant}/*") or resource.endswith(f"{tenant}/jobs/*"), resource


def test_an_execution_role_per_tenant_reads_only_its_own_secrets(synthesized: Synthesized) -> None:
    """ECS resolves a definition's ``secrets`` with ``Berth-exec-<tenant>``: a definition naming another
    tenant's secret (however it was crafted) cannot start."""
    for tenant in TENANTS:
        role_id, role = _role_by_name(synthesized, f"Berth-exec-{tenant}")
        assert {"Key": "berth:tenant", "Value": tenant} in role["Tags"]
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
        assert trust["Action"] == "sts:AssumeRole"
        assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
        assert _text(trust["Condition"]["ArnLike"]["aws:SourceArn"]) == "arn:<Partition>:ecs:*:<AccountId>:*"
        assert "ManagedPolicyArns" not in role
        granted: dict[str, set[str]] = {}
        for st in _role_statements(synthesized, role_id):
            assert st["Effect"] == "Allow" and "Condition" not in st
            for resource in _as_list(st["Resource"]):
                granted.setdefault(_resource_text(synthesized, resource), set()).update(
                    _as_list(st["Action"])
                )
        assert granted == {
            f"arn:<Partition>:secretsmanager:<Region>:<AccountId>:secret:berth/{tenant}/*": {
                "secretsmanager:GetSecretValue"
            },
            "<AWS::Logs::LogGroup>": {"logs:CreateLogStream", "logs:PutLogEvents"},
            "*": {"ecr:GetAuthorizationToken"},
            "arn:<Partition>:ecr:*:<AccountId>:repository/*": {
                "ecr:BatchCheckLayerAvailability",
                "ecr:GetDownloadUrlForLayer",
                "ecr:BatchGetImage",
            },
        }
        (logs,) = [st for st in _role_statements(synthesized, role_id) if st["Sid"] == "OwnLogGroup"]
        logical = logs["Resource"]["Fn::GetAtt"][0]
        assert synthesized.json["Resources"][logical]["Properties"]["LogGroupName"] == f"/berth/jobs/{tenant}"


def test_each_tenant_has_its_job_log_group(synthesized: Synthesized) -> None:
    names = {
        g["Properties"].get("LogGroupName"): g for g in synthesized.resources("AWS::Logs::LogGroup").values()
    }
    for tenant in TENANTS:
        group = names[f"/berth/jobs/{tenant}"]
        assert group["Properties"]["RetentionInDays"] == 30
        assert group["DeletionPolicy"] == "Retain"
        role_id, _ = _role_by_name(synthesized, f"Berth-job-{tenant}")
        (logs,) = [st for st in _role_statements(synthesized, role_id) if st["Sid"] == "OwnLogGroup"]
        logical = logs["Resource"]["Fn::GetAtt"][0]
        assert synthesized.json["Resources"][logical]["Properties"]["LogGroupName"] == f"/berth/jobs/{tenant}"


def _submit_role(s: Synthesized) -> tuple[str, dict[str, Any]]:
    arn = s.json["Outputs"]["BatchSubmitRoleArn"]["Value"]
    role_id = arn["Fn::GetAtt"][0]
    return role_id, s.json["Resources"][role_id]["Properties"]


def test_passrole_only_to_the_sessions_tenant_job_role(synthesized: Synthesized) -> None:
    role_id, _ = _submit_role(synthesized)
    statements = _role_statements(synthesized, role_id)
    passes = [st for st in statements if "iam:PassRole" in _as_list(st["Action"])]
    assert len(passes) == 1
    (st,) = passes
    assert st["Action"] == "iam:PassRole"
    assert sorted(_text(r) for r in st["Resource"]) == [
        "arn:<Partition>:iam::<AccountId>:role/Berth-exec-*",
        "arn:<Partition>:iam::<AccountId>:role/Berth-job-*",
    ]
    assert st["Condition"] == {
        "StringEquals": {
            "iam:PassedToService": PASSED_TO,
            "iam:ResourceTag/berth:tenant": SESSION_TENANT,
        }
    }
    # No other statement of any role in the stack may pass a role.
    for policy in synthesized.resources("AWS::IAM::Policy").values():
        for other in _as_list(policy["Properties"]["PolicyDocument"]["Statement"]):
            actions = _as_list(other["Action"])
            assert not any(a in ("iam:PassRole", "iam:*", "*") for a in actions) or other == st


def test_submit_role_is_assumed_only_with_a_tenant_session_tag(synthesized: Synthesized) -> None:
    _, role = _submit_role(synthesized)
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert sorted(trust["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert "root" in _text(trust["Principal"]["AWS"])
    assert trust["Condition"]["StringLike"] == {"aws:RequestTag/berth:tenant": "?*"}
    assert (
        _text(trust["Condition"]["ArnLike"]["aws:PrincipalArn"])
        == "arn:<Partition>:iam::<AccountId>:role/Berth-*"
    )


def test_submit_role_acts_on_berth_queues_and_the_sessions_tenant_jobs(synthesized: Synthesized) -> None:
    role_id, _ = _submit_role(synthesized)
    by_sid = {st["Sid"]: st for st in _role_statements(synthesized, role_id)}
    submit = by_sid["SubmitTaggedWithSessionTenant"]
    assert submit["Action"] == "batch:SubmitJob"
    resources = sorted(_text(r) for r in submit["Resource"])
    assert resources == sorted(
        [
            # Berth's queues of the configured regions (one per instance type would overflow the
            # role's inline policy), never another region's or another prefix's.
            f"arn:<Partition>:batch:{r}:<AccountId>:job-queue/berth-{r}-*"
            for r in REGIONS
        ]
        + [f"arn:<Partition>:batch:{r}:<AccountId>:job-definition/berth-*" for r in REGIONS]
    )
    assert submit["Condition"] == {"StringEquals": {"aws:RequestTag/BERTH_TENANT": SESSION_TENANT}}
    # Every queue a regional stack creates is one the role may submit to; no other role policy (no
    # overflow managed policy: the inline policy fits).
    for region in REGIONS:
        for q in _resources(_batch(synthesized, region), "AWS::Batch::JobQueue").values():
            arn = f"arn:<Partition>:batch:{region}:<AccountId>:job-queue/{q['Properties']['JobQueueName']}"
            assert any(fnmatch.fnmatchcase(arn, r) for r in resources if ":job-queue/" in r), arn
    assert not [
        p
        for p in synthesized.resources("AWS::IAM::ManagedPolicy").values()
        if {"Ref": role_id} in p["Properties"].get("Roles", [])
    ]
    terminate = by_sid["TerminateSessionTenantJobs"]
    assert terminate["Action"] == "batch:TerminateJob"
    assert terminate["Condition"] == {"StringEquals": {"aws:ResourceTag/BERTH_TENANT": SESSION_TENANT}}
    assert set(by_sid) == {
        "SubmitTaggedWithSessionTenant",
        "RegisterBerthDefinitions",
        "TagOnCreate",
        "TerminateSessionTenantJobs",
        "Describe",
        "PassSessionTenantJobRole",
    }
    assert sorted(_as_list(by_sid["Describe"]["Action"])) == [
        "batch:DescribeJobDefinitions",
        "batch:DescribeJobQueues",
        "batch:DescribeJobs",
    ]


def test_only_berth_roles_put_events_on_the_home_bus(synthesized: Synthesized) -> None:
    policies = {
        p["Properties"]["StatementId"]: p
        for p in synthesized.resources("AWS::Events::EventBusPolicy").values()
    }
    assert set(policies) == {"OnlyBerthPublishes", "OnlyForwardersPutBatchEvents"}
    batch = policies["OnlyForwardersPutBatchEvents"]
    st = batch["Properties"]["Statement"]
    assert (st["Effect"], st["Principal"], st["Action"]) == ("Deny", "*", "events:PutEvents")
    assert st["Condition"]["StringEquals"] == {"events:source": "aws.batch"}
    forwarders = sorted(_text(a) for a in st["Condition"]["StringNotEqualsIfExists"]["aws:PrincipalArn"])
    assert forwarders == sorted(
        f"arn:<Partition>:iam::<AccountId>:role/Berth-batch-events-{r}" for r in REGIONS
    )
    # ...the very role names the regional stacks create.
    for region in REGIONS:
        names = {
            r["Properties"].get("RoleName")
            for r in _resources(_batch(synthesized, region), "AWS::IAM::Role").values()
        }
        assert f"Berth-batch-events-{region}" in names
    # One bus policy change at a time.
    ids = {
        p["Properties"]["StatementId"]: lid
        for lid, p in synthesized.resources("AWS::Events::EventBusPolicy").items()
    }
    assert ids["OnlyBerthPublishes"] in _as_list(batch.get("DependsOn", []))


def test_cloud_regions_output_matches_the_regional_stacks(synthesized: Synthesized) -> None:
    regions = json.loads(synthesized.json["Outputs"]["CloudRegions"]["Value"])
    assert [r["region"] for r in regions] == list(REGIONS)
    for entry in regions:
        assert sorted(entry["instance_types"]) == sorted(INSTANCE_TYPES[entry["region"]])
        assert sorted(entry["families"]) == FAMILIES[entry["region"]]
        for family, types in entry["families"].items():
            assert sorted(types) == sorted(
                t for t in INSTANCE_TYPES[entry["region"]] if t.startswith(f"{family}.")
            )
        assert sorted(entry["queues"]) == sorted(INSTANCE_TYPES[entry["region"]])
        for instance_type, queues in entry["queues"].items():
            assert queues == {k: _queue(entry["region"], instance_type, k) for k in KINDS}


def test_the_functions_that_read_offers_get_the_deployed_capacity(synthesized: Synthesized) -> None:
    capacity = {}
    for lid, fn in synthesized.resources("AWS::Lambda::Function").items():
        value = fn["Properties"].get("Environment", {}).get("Variables", {}).get("BERTH_CLOUD_CAPACITY")
        if value is not None:
            capacity[lid] = json.loads(value)
    assert (
        len(capacity) == 2
        and any("Api" in lid for lid in capacity)
        and any("Scheduler" in lid for lid in capacity)
    )
    for value in capacity.values():
        assert value == INSTANCE_TYPES


def test_grant_assume_lets_a_role_assume_the_submit_role() -> None:
    from aws_cdk import App, Stack
    from aws_cdk import aws_events as events
    from aws_cdk import aws_iam as iam
    from aws_cdk.assertions import Template

    from berth_infra.app import cdk_json_context
    from berth_infra.cloud_roles import CloudRoles
    from berth_infra.storage import Storage

    stack = Stack(App(context=cdk_json_context()), "Probe")
    cloud = CloudRoles(
        stack,
        "Cloud",
        storage=Storage(stack, "Storage"),
        bus=events.EventBus(stack, "Bus", event_bus_name="berth-Probe"),
        regions=parse_cloud_regions([{"region": "eu-west-1", "instance_types": ["g6.xlarge"]}]),
        tenants=["vision"],
    )
    dispatcher = iam.Role(stack, "Dispatcher", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    cloud.grant_assume(dispatcher)
    template = Template.from_stack(stack).to_json()
    dispatcher_id = stack.get_logical_id(dispatcher.node.default_child)  # type: ignore[arg-type]
    submit_id = stack.get_logical_id(cloud.submit_role.node.default_child)  # type: ignore[arg-type]
    (statement,) = [
        st
        for p in template["Resources"].values()
        if p["Type"] == "AWS::IAM::Policy" and {"Ref": dispatcher_id} in p["Properties"]["Roles"]
        for st in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Resource"] == {"Fn::GetAtt": [submit_id, "Arn"]}
    names = {
        r["Properties"].get("RoleName")
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Role"
    }
    assert "Berth-job-vision" in names


def test_configured_regions_and_tenants_shape_the_app() -> None:
    from berth_infra.app import batch_region_stacks, build_app, cdk_json_context

    context = {
        **cdk_json_context(),
        "berth:cloudRegions": '[{"region": "eu-west-1", "instance_types": ["g6.xlarge", "g6e.48xlarge"]}]',
        "berth:tenants": "alpha,beta",
        "berth:homeRegion": "eu-central-1",
    }
    app, stack = build_app(context=context)
    (regional,) = batch_region_stacks(app)
    assert regional.stack_name == "Berth-batch-eu-west-1" and regional.region == "eu-west-1"
    assert regional.cloud_region.instance_types == ("g6.xlarge", "g6e.48xlarge")
    assert "eu-central-1:" in regional.home_bus_arn and regional.home_bus_arn.endswith(
        ":event-bus/berth-Berth"
    )
    assert set(stack.cloud.job_roles) == {"alpha", "beta"}


def test_an_existing_vpc_replaces_the_stacks_own() -> None:
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from berth_infra.app import cdk_json_context
    from berth_infra.batch import BatchRegionStack

    app = App(
        context={
            **cdk_json_context(),
            "berth:vpcId:eu-west-1": "vpc-0123456789abcdef0",
            "berth:subnetIds:eu-west-1": "subnet-0aaaaaaaaaaaaaaaa,subnet-0bbbbbbbbbbbbbbbb",
        }
    )
    stack = BatchRegionStack(
        app,
        "Berth-batch-eu-west-1",
        cloud_region=parse_cloud_regions([{"region": "eu-west-1", "instance_types": ["g6.xlarge"]}])[0],
        home_region="us-east-1",
        home_bus_name="berth-Berth",
    )
    template = Template.from_stack(stack).to_json()
    types = {r["Type"] for r in template["Resources"].values()}
    assert "AWS::EC2::VPC" not in types and "AWS::EC2::NatGateway" not in types
    (sg,) = _resources(template, "AWS::EC2::SecurityGroup").values()
    assert sg["Properties"]["VpcId"] == "vpc-0123456789abcdef0"
    for env in _resources(template, "AWS::Batch::ComputeEnvironment").values():
        assert env["Properties"]["ComputeResources"]["Subnets"] == [
            "subnet-0aaaaaaaaaaaaaaaa",
            "subnet-0bbbbbbbbbbbbbbbb",
        ]


@pytest.mark.parametrize("value", ["Vision", "a,a", "", "x" * 41, '["ok", "no/slash"]'])
def test_bad_tenant_names_are_refused(value: str) -> None:
    from aws_cdk import App

    from berth_infra.cloud_config import tenants

    with pytest.raises(CloudConfigError):
        tenants(App(context={"berth:tenants": value}))
