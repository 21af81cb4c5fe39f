"""Seed the local cloud: IAM users with access keys, the policy that lets them call the API, tenants."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

_ENVIRONMENT_LOCK = threading.RLock()


@contextlib.contextmanager
def process_environment(env: dict[str, str]) -> Iterator[None]:
    """Run the block with `env` set in this process's environment, then restore it.

    For the local cloud's own use of Berth's adapters (seeding the store, `berth bench pass`): they read
    their endpoint and credentials from the environment, as on Lambda. Blocks are serialised; SDK clients
    created meanwhile by other threads of this process see `env` too (the local cloud's own clients pass
    their endpoint and credentials explicitly)."""
    with _ENVIRONMENT_LOCK:
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@dataclass(frozen=True)
class SeedUser:
    profile: str  # IAM user name and AWS profile name
    tenant: str  # for a host: its host id
    role: str  # "member", "admin" or "host"


#: The users `berth local up` creates; the brief's CLI contract names the profiles and tenants.
DEFAULT_USERS = (
    SeedUser("alice", "vision", "member"),
    SeedUser("bob", "nlp", "member"),
    SeedUser("admin", "platform", "admin"),
)
INVOKE_POLICY_NAME = "BerthApiInvoke"


@dataclass(frozen=True)
class SeededUser:
    profile: str
    tenant: str
    role: str
    arn: str
    access_key_id: str
    secret_access_key: str
    unique_id: str = ""  # the IAM user's UserId: membership is registered with it


def create_iam_users(
    session: boto3.session.Session,
    endpoint_url: str,
    rest_api_id: str,
    users: tuple[SeedUser, ...],
    policy_name: str = INVOKE_POLICY_NAME,
) -> list[SeededUser]:
    """IAM users with one access key each and a managed policy allowing execute-api:Invoke on the API."""
    iam = session.client("iam", endpoint_url=endpoint_url)
    account = session.client("sts", endpoint_url=endpoint_url).get_caller_identity()["Account"]
    policy_document = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "execute-api:Invoke",
                "Resource": f"arn:aws:execute-api:{session.region_name}:{account}:{rest_api_id}/*",
            }
        ],
    }
    policy_arn = iam.create_policy(PolicyName=policy_name, PolicyDocument=json.dumps(policy_document))[
        "Policy"
    ]["Arn"]
    seeded = []
    for user in users:
        # The berth:tenant tag is what the API's resource policy admits (berth_infra.api.DEFAULT_MEMBER_TAG);
        # a host's identity carries berth:host (its host id) instead.
        tag = "berth:host" if user.role == "host" else "berth:tenant"
        created = iam.create_user(UserName=user.profile, Tags=[{"Key": tag, "Value": user.tenant}])["User"]
        arn = created["Arn"]
        iam.attach_user_policy(UserName=user.profile, PolicyArn=policy_arn)
        key = iam.create_access_key(UserName=user.profile)["AccessKey"]
        seeded.append(
            SeededUser(
                profile=user.profile,
                tenant=user.tenant,
                role=user.role,
                arn=arn,
                access_key_id=key["AccessKeyId"],
                secret_access_key=key["SecretAccessKey"],
                unique_id=created["UserId"],
            )
        )
    return seeded


#: put_member(principal_arn, tenant, role, unique_id)
PutMember = Callable[[str, str, str, str], None]


def tenant_repository_writer(table_name: str) -> PutMember:
    """`put_member(principal_arn, tenant, role, unique_id)` of Berth's tenants repository."""
    from berth.dal.tenants import DynamoTenantRepository

    return DynamoTenantRepository(table_name).put_member


def seed_tenants(
    users: list[SeededUser],
    tenants_table: str,
    endpoint_url: str,
    region: str,
    writer: PutMember | None = None,
    hosts_table: str | None = None,
    members_only: bool = False,
) -> None:
    """Map each user's principal to its tenant and role, through Berth's own tenants repository.

    The repository (pynamodb) reads its endpoint and credentials from the environment, so it runs
    with this process's environment pointing at moto (`process_environment`).
    """
    env = {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_ACCESS_KEY_ID": "seed",
        "AWS_SECRET_ACCESS_KEY": "seed",
    }
    with process_environment(env):
        put_member = writer or tenant_repository_writer(tenants_table)
        for user in users:
            put_member(user.arn, user.tenant, user.role, user.unique_id)
        if writer is None and not members_only:
            seed_example_data(tenants_table)
            if hosts_table is not None and not any(u.role == "host" for u in users):
                seed_example_hosts(hosts_table)
            # Each tenant's job log group (agents ship job output there with the attempt's scoped
            # credentials, which may create streams but not groups).
            logs = boto3.client("logs", endpoint_url=endpoint_url, region_name=region)
            for tenant in sorted({u.tenant for u in users if u.role != "host"}):
                with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
                    logs.create_log_group(logGroupName=f"{JOB_LOG_GROUP_PREFIX}/{tenant}")
            for name, value in EXAMPLE_SECRETS.items():
                boto3.client("secretsmanager", endpoint_url=endpoint_url, region_name=region).create_secret(
                    Name=name, SecretString=value
                )
            seed_example_objects(boto3.client("s3", endpoint_url=endpoint_url, region_name=region))


#: What the example job specs (examples/jobs/) read: team vision's own dataset bucket, granted by an
#: admin, and team nlp's GLUE copy on the on-prem hosts, registered as a dataset that stays on-prem.
EXAMPLE_GRANTS = {"vision": ["s3://vision-datasets/"]}
#: A secret of team vision's for examples/jobs/mnist-bundle.yaml (a placeholder value).
#: Where agents ship job output: ``<prefix>/<tenant>``, stream ``<job>/<attempt>``.
JOB_LOG_GROUP_PREFIX = "/berth/jobs"
EXAMPLE_SECRETS = {"berth/vision/wandb": "local-placeholder-not-a-real-key"}
EXAMPLE_DATASETS = {
    "glue": {
        "locations": [{"pool": "default", "root": "/datasets/glue"}],
        "tenants": ["nlp"],
        "residency": "onprem-only",
    }
}


#: Small stand-ins for the example jobs' S3 data (team vision's bucket), so real agents can stage it.
EXAMPLE_OBJECTS = {
    "vision-datasets": {
        "mnist/train.csv": "label,pixels\n5,0 0 0 18 126\n0,0 0 51 159 253\n",
        "imagenet/train/shard-0000.txt": "n01440764/img-0001.jpeg\nn01443537/img-0002.jpeg\n",
        "imagenet/val/shard-0000.txt": "n01440764/img-0101.jpeg\n",
    }
}
#: What an on-prem host holds under the example dataset ``glue``'s root (``example_dataset_roots``).
EXAMPLE_DATASET_FILES = {
    "glue": {"mnli/train.tsv": "premise\thypothesis\tlabel\n", "README": "GLUE (stand-in)\n"}
}


def seed_example_objects(s3: Any) -> None:
    """The example data buckets and their objects (idempotent)."""
    for bucket, objects in EXAMPLE_OBJECTS.items():
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
        for key, body in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body.encode())


def example_dataset_roots(base: Path) -> dict[str, str]:
    """Create the example datasets' files under ``base`` (a host's local disk) and return their roots."""
    roots = {}
    for name, files in EXAMPLE_DATASET_FILES.items():
        root = base / name
        for rel, body in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(body)
        roots[name] = str(root)
    return roots


def seed_example_data(tenants_table: str) -> None:
    """Grants and datasets the examples use, written as an admin would through the API's store."""
    from berth.dal.tenants import DynamoTenantRepository
    from berth.domain.storage import DataGrants, Dataset

    repo = DynamoTenantRepository(tenants_table)
    for tenant, prefixes in EXAMPLE_GRANTS.items():
        repo.put_grants(tenant, DataGrants(s3_prefixes=prefixes))
    for name, dataset in EXAMPLE_DATASETS.items():
        repo.put_dataset(name, Dataset.model_validate(dataset))


#: A small simulated on-prem fleet (pool ``default``, where the example dataset ``glue`` lives), so
#: that submit-time feasibility, ``berth explain`` and ``berth capacity`` have hosts to reason about
#: before real agents register. (host id, GPU model, GPUs)
EXAMPLE_HOSTS = (
    ("sim-a100-0", "A100", 8),
    ("sim-a100-1", "A100", 8),
    ("sim-v100-0", "V100", 8),
    ("sim-v100-1", "V100", 8),
)
#: Seeded hosts hold their lease this long (the simulated fleet does not heartbeat).
EXAMPLE_HOST_LEASE_DAYS = 365


def host_gpu_ids(host_id: str, gpus: int) -> tuple[str, ...]:
    """Stable simulated device UUIDs of a host."""
    import uuid

    return tuple(f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host_id}.{i}.berth.local')}" for i in range(gpus))


def example_agents(count: int, gpus: int, gpu_type: str | None) -> list[tuple[str, str, int]]:
    """(host id, GPU model, GPUs) of ``count`` simulated agents: the example fleet's models in turn
    (or all ``gpu_type``)."""
    out = []
    per_model: dict[str, int] = {}
    for i in range(count):
        model = gpu_type or EXAMPLE_HOSTS[i % len(EXAMPLE_HOSTS)][1]
        n = per_model[model] = per_model.get(model, -1) + 1
        out.append((f"sim-{model.lower()}-{n}", model, gpus))
    return out


def seed_example_hosts(hosts_table: str) -> None:
    """Register the simulated hosts through Berth's host repository, as an agent's registration will."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from berth.dal.hosts import DynamoHostRepository
    from berth.domain.fleet import HostInventory

    repo = DynamoHostRepository(hosts_table)
    lease = datetime.now(UTC) + timedelta(days=EXAMPLE_HOST_LEASE_DAYS)
    for host_id, model, gpus in EXAMPLE_HOSTS:
        ids = tuple(
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host_id}.{i}.berth.local')}" for i in range(gpus)
        )
        inventory = HostInventory(
            host_id=host_id,
            pool="default",
            gpu_type=model,
            gpu_ids=ids,
            cpu=64,
            memory_gib=512,
            labels={"simulated": "true"},
        )
        repo.register(inventory, lease)
