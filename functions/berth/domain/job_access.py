"""The session policy of one job attempt's credentials. Pure.

Built from the tenant's records and the job as admitted at submit (its bundle, data sources and
secret names were checked against the tenant there, and are checked again here): read the job's
bundle, read its data sources, read and write its own output prefix, read its own secrets, write its
own log stream; nothing else. Every resource names the tenant from the record, and every prefix ends
with ``/`` so ``vision`` never reaches ``vision2``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from berth.domain.errors import ValidationFailed
from berth.domain.job import Job, new_job
from berth.domain.job_spec import JobSpec
from berth.domain.observability import log_stream
from berth.domain.storage import (
    DataGrants,
    Dataset,
    S3Location,
    StorageLayout,
    bundle_key,
    check_data_sources,
    check_secret_names,
    job_output_prefix,
    parse_digest,
)

#: Longest credential a job attempt gets; the agent refreshes it while the attempt holds its lease.
MAX_CREDENTIAL_S = 3600
MIN_CREDENTIAL_S = 900  # STS's floor


@dataclass(frozen=True, slots=True)
class AccountScope:
    partition: str
    region: str
    account: str
    log_group_prefix: str = "/berth/jobs"


def _s3(partition: str, bucket: str, key: str) -> str:
    return f"arn:{partition}:s3:::{bucket}/{key}"


def session_policy(
    job: Job,
    attempt: int,
    layout: StorageLayout,
    grants: DataGrants,
    datasets: dict[str, Dataset | None],
    scope: AccountScope,
) -> dict[str, Any]:
    """The IAM session policy document for ``job``'s attempt ``attempt``."""
    spec, tenant = job.spec, job.tenant
    check_data_sources(spec, tenant, layout, grants, datasets)
    check_secret_names(spec.secrets, tenant)
    out = job_output_prefix(tenant, job.id)
    statements: list[dict[str, Any]] = [
        {
            "Sid": "OwnOutputs",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject"],
            "Resource": [_s3(scope.partition, layout.data_bucket, out + "*")],
        },
        {
            "Sid": "ListOwnOutputs",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [f"arn:{scope.partition}:s3:::{layout.data_bucket}"],
            "Condition": {"StringLike": {"s3:prefix": [out + "*"]}},
        },
        {
            "Sid": "OwnLogStream",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": [
                f"arn:{scope.partition}:logs:{scope.region}:{scope.account}:log-group:"
                f"{scope.log_group_prefix}/{tenant}:log-stream:{log_stream(job.id, attempt)}"
            ],
        },
    ]
    digest = None if spec.code is None else parse_digest(spec.code)
    reads: list[str] = []
    if digest is not None:
        reads.append(_s3(scope.partition, layout.artifacts_bucket, bundle_key(tenant, digest)))
    for source in [d.source for d in spec.data] + (
        [spec.code] if spec.code and spec.code.startswith("s3://") else []
    ):
        if source.startswith("s3://"):
            loc = S3Location.parse(source)
            wildcard = "*" if loc.key.endswith("/") or not loc.key else ""
            reads.append(_s3(scope.partition, loc.bucket, loc.key + wildcard))
    if reads:
        statements.append({"Sid": "Inputs", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": reads})
    if spec.secrets:
        statements.append(
            {
                "Sid": "OwnSecrets",
                "Effect": "Allow",
                "Action": ["secretsmanager:GetSecretValue"],
                # Secrets Manager appends "-" and six characters to a secret's name in its ARN.
                "Resource": [
                    f"arn:{scope.partition}:secretsmanager:{scope.region}:{scope.account}:secret:{name}-??????"
                    for name in sorted(set(spec.secrets.values()))
                ],
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


#: STS's limit on a session policy's plain text.
MAX_SESSION_POLICY_CHARS = 2048
#: The longest values a real job id and account scope can take, to size a policy before the job exists.
_WORST_SCOPE = AccountScope("aws-us-gov", "us-gov-west-1", "0" * 12)
_WORST_JOB_ID = "j-" + "z" * 26


def check_policy_fits(
    spec: JobSpec, tenant: str, layout: StorageLayout, grants: DataGrants, datasets: dict[str, Dataset | None]
) -> None:
    """Refuse at submit a spec whose credentials STS could never vend (too many sources or secrets)."""
    job, _ = new_job(_WORST_JOB_ID, tenant, "-", spec, datetime.now(UTC))
    size = len(session_policy_json(session_policy(job, 99, layout, grants, datasets, _WORST_SCOPE)))
    if size > MAX_SESSION_POLICY_CHARS:
        raise ValidationFailed(
            f"this job names too many data sources and secrets for one credential ({size} of "
            f"{MAX_SESSION_POLICY_CHARS} characters of policy); use fewer, broader prefixes",
            details={"policy_chars": size},
        )


def session_policy_json(policy: dict[str, Any]) -> str:
    """Compact JSON (STS limits a session policy to 2,048 packed characters)."""
    return json.dumps(policy, separators=(",", ":"), sort_keys=True)


def session_name(job: Job, attempt: int) -> str:
    """RoleSessionName: the job and attempt, within STS's 64 characters of [\\w+=,.@-]."""
    return f"{job.id.replace(':', '_')}.{attempt}"[:64]


def credential_seconds(remaining_lease_s: float) -> int:
    """No longer than the attempt's lease (STS's 15-minute floor aside), at most an hour."""
    return int(max(MIN_CREDENTIAL_S, min(MAX_CREDENTIAL_S, remaining_lease_s)))
