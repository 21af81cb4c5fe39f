"""STS adapter: per-attempt job credentials from the job role, narrowed by a session policy."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from berth.dal import aws
from berth.domain.errors import StoreUnavailable
from berth.domain.ports import JobCredentials


class StsCredentialVendor:
    def __init__(self, job_role_arn: str, client: Any | None = None) -> None:
        self._role_arn = job_role_arn
        self._sts = client or aws.client("sts")

    def assume(
        self, session_name: str, policy_json: str, seconds: int, source_identity: str
    ) -> JobCredentials:
        try:
            resp = self._sts.assume_role(
                RoleArn=self._role_arn,
                RoleSessionName=session_name,
                Policy=policy_json,
                DurationSeconds=seconds,
                # Shows in CloudTrail for everything done with these credentials, and cannot be
                # changed by whoever holds them.
                SourceIdentity=source_identity,
            )
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"cannot vend job credentials ({exc.__class__.__name__})") from exc
        c = resp["Credentials"]
        return JobCredentials(
            access_key_id=c["AccessKeyId"],
            secret_access_key=c["SecretAccessKey"],
            session_token=c["SessionToken"],
            expiration=c["Expiration"],
        )
