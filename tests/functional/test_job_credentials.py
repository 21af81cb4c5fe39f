"""Per-attempt job credentials on moto with IAM enforcement on (issue 9).

The job role is the outer bound; each vended credential's session policy narrows it to one job: its
bundle, its data sources, its own output prefix, its own secrets. moto alone ignores session
policies and expiry; the local cloud's ``moto_faithful`` patch restores both, as AWS behaves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.core import set_initial_no_auth_action_count
from moto.sts.models import sts_backends

from berth.dal.credentials import StsCredentialVendor
from berth.dal.tenants import DynamoTenantRepository
from berth.domain.job import Job, new_job
from berth.domain.job_access import AccountScope
from berth.domain.job_spec import JobSpec
from berth.domain.ports import JobCredentials
from berth.domain.status import JobStatus
from berth.domain.storage import DataGrants, StorageLayout, bundle_key
from berth.logic.credentials import CredentialService
from berth_tools.localcloud import moto_faithful
from tests.functional.conftest import ACCOUNT, BUCKETS, TABLES
from tests.unit.fakes import fake_store

ART, DATA = BUCKETS["BERTH_ARTIFACTS_BUCKET"], BUCKETS["BERTH_DATA_BUCKET"]
NOW = datetime(2026, 12, 1, tzinfo=UTC)
VISION_DIGEST = hashlib.sha256(b"vision bundle").hexdigest()
NLP_DIGEST = hashlib.sha256(b"nlp bundle").hexdigest()
JOB_ROLE_POLICY = {  # the same outer bound as infra/berth_infra/storage.py's JobRole
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": [f"arn:aws:s3:::{ART}/bundles/*", f"arn:aws:s3:::{DATA}/*"],
        },
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{DATA}/*/jobs/*"},
        {
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:berth/*",
        },
    ],
}
ADMIN_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


@pytest.fixture
def faithful() -> Iterator[None]:
    undo = moto_faithful.install()
    yield
    undo()


def _job(job_id: str, tenant: str, digest: str, data: str, secrets: dict[str, str]) -> Job:
    spec = JobSpec.model_validate(
        {
            "name": "train",
            "code": f"sha256:{digest}",
            "command": ["python", "train.py"],
            "data": [{"source": data, "mount": "/data"}],
            "secrets": secrets,
        }
    )
    job, _ = new_job(job_id, tenant, "arn:aws:iam::123456789012:user/alice", spec, NOW)
    return job.transition(JobStatus.STARTING, "placed", NOW)[0]


def _client(service: str, creds: JobCredentials | dict[str, str]) -> Any:
    if isinstance(creds, JobCredentials):
        kw = {
            "aws_access_key_id": creds.access_key_id,
            "aws_secret_access_key": creds.secret_access_key,
            "aws_session_token": creds.session_token,
        }
    else:
        kw = creds
    return boto3.client(service, region_name="us-east-1", **kw)


def _denied(call: Any) -> bool:
    try:
        call()
    except ClientError as exc:
        return exc.response["Error"]["Code"] in {"AccessDenied", "AccessDeniedException", "403"}
    return False


@set_initial_no_auth_action_count(4)
def test_vended_credentials_reach_only_their_own_job(aws: None, faithful: None) -> None:
    iam = boto3.client("iam", region_name="us-east-1")
    iam.create_user(UserName="control-plane")
    iam.put_user_policy(UserName="control-plane", PolicyName="all", PolicyDocument=json.dumps(ADMIN_POLICY))
    key = iam.create_access_key(UserName="control-plane")["AccessKey"]
    admin = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
    # From here on every call is authenticated and authorised by IAM.
    iam = _client("iam", admin)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/control-plane"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role_arn = iam.create_role(RoleName="berth-job", AssumeRolePolicyDocument=json.dumps(trust))["Role"][
        "Arn"
    ]
    iam.put_role_policy(RoleName="berth-job", PolicyName="bound", PolicyDocument=json.dumps(JOB_ROLE_POLICY))
    s3, sm = _client("s3", admin), _client("secretsmanager", admin)
    for tenant, digest, body in (
        ("vision", VISION_DIGEST, b"vision bundle"),
        ("nlp", NLP_DIGEST, b"nlp bundle"),
    ):
        s3.put_object(Bucket=ART, Key=bundle_key(tenant, digest), Body=body)
        s3.put_object(Bucket=DATA, Key=f"{tenant}/imagenet/part-0", Body=b"data")
        sm.create_secret(Name=f"berth/{tenant}/wandb", SecretString=f"{tenant}-token")
    s3.put_object(Bucket=DATA, Key="vision/jobs/j-other/ckpt", Body=b"other job")

    _, tenants = fake_store()  # tenant records are not what this test is about (no IAM on them)
    service = CredentialService(
        layout=StorageLayout(ART, DATA),
        scope=AccountScope("aws", "us-east-1", ACCOUNT),
        tenants=tenants,
        vendor=StsCredentialVendor(role_arn, client=_client("sts", admin)),
    )
    job = _job(
        "j-vision1", "vision", VISION_DIGEST, f"s3://{DATA}/vision/imagenet/", {"WANDB": "berth/vision/wandb"}
    )
    creds = service.for_attempt(job, 1, remaining_lease_s=1800)
    assert creds.expiration > datetime.now(UTC)
    js3, jsm = _client("s3", creds), _client("secretsmanager", creds)

    # Its own bundle, data, outputs and secret.
    assert (
        js3.get_object(Bucket=ART, Key=bundle_key("vision", VISION_DIGEST))["Body"].read() == b"vision bundle"
    )
    assert js3.get_object(Bucket=DATA, Key="vision/imagenet/part-0")["Body"].read() == b"data"
    js3.put_object(Bucket=DATA, Key="vision/jobs/j-vision1/ckpt-1", Body=b"step 1")
    assert js3.get_object(Bucket=DATA, Key="vision/jobs/j-vision1/ckpt-1")["Body"].read() == b"step 1"
    assert jsm.get_secret_value(SecretId="berth/vision/wandb")["SecretString"] == "vision-token"

    # Nothing of tenant nlp, nor another job of its own tenant, nor writes outside its outputs.
    assert _denied(lambda: js3.get_object(Bucket=ART, Key=bundle_key("nlp", NLP_DIGEST)))
    assert _denied(lambda: js3.get_object(Bucket=DATA, Key="nlp/imagenet/part-0"))
    assert _denied(lambda: js3.put_object(Bucket=DATA, Key="nlp/jobs/j-vision1/x", Body=b"x"))
    assert _denied(lambda: js3.get_object(Bucket=DATA, Key="vision/jobs/j-other/ckpt"))
    assert _denied(lambda: js3.put_object(Bucket=DATA, Key="vision/jobs/j-other/ckpt", Body=b"overwrite"))
    assert _denied(lambda: js3.put_object(Bucket=DATA, Key="vision/imagenet/part-0", Body=b"tamper"))
    assert _denied(lambda: js3.put_object(Bucket=ART, Key=bundle_key("vision", VISION_DIGEST), Body=b"x"))
    assert _denied(lambda: jsm.get_secret_value(SecretId="berth/nlp/wandb"))

    # Expired credentials are refused outright.
    session = sts_backends[ACCOUNT]["aws"].get_assumed_role_from_access_key(creds.access_key_id)
    assert session is not None
    session.expiration = session.expiration.replace(year=2000)
    with pytest.raises(ClientError) as exc:
        js3.get_object(Bucket=ART, Key=bundle_key("vision", VISION_DIGEST))
    assert exc.value.response["Error"]["Code"] in {"InvalidAccessKeyId", "ExpiredToken", "InvalidToken"}


def test_credentials_refuse_a_spec_outside_the_tenant(aws: None) -> None:
    """Re-checked at vending time against the tenant's records: never trust the stored spec alone."""
    tenants = DynamoTenantRepository(TABLES["BERTH_TENANTS_TABLE"])
    tenants.put_grants("vision", DataGrants(s3_prefixes=[]))

    class NoVendor:
        def assume(self, *args: Any, **kwargs: Any) -> JobCredentials:
            raise AssertionError("must not vend")

    service = CredentialService(
        StorageLayout(ART, DATA), AccountScope("aws", "us-east-1", ACCOUNT), tenants, NoVendor()
    )
    job = _job("j-bad", "vision", VISION_DIGEST, f"s3://{DATA}/nlp/imagenet/", {})
    from berth.domain.errors import Forbidden

    with pytest.raises(Forbidden):
        service.for_attempt(job, 1, remaining_lease_s=600)
    done = job.transition(JobStatus.FAILED, "x", NOW + timedelta(seconds=1))[0]
    from berth.domain.errors import Conflict

    with pytest.raises(Conflict):
        service.for_attempt(done, 1, remaining_lease_s=600)


def test_faithful_patches_undo_cleanly_and_match_iam_wildcards() -> None:
    from moto.iam.access_control import IAMPolicyStatement

    undo = moto_faithful.install()
    try:
        m = IAMPolicyStatement._match
        assert m("arn:x:secret:berth/vision/wandb-??????", "arn:x:secret:berth/vision/wandb-AbC123")
        assert not m("arn:x:secret:berth/vision/wandb-??????", "arn:x:secret:berth/vision/wandb-other-AbC123")
        assert not m("bucket/vision.data/*", "bucket/visionXdata/k")  # '.' is literal
        assert m("bucket/vision/*", "bucket/vision/a/b")
    finally:
        undo()
    assert IAMPolicyStatement._match("a*", "abc")  # moto's own again
