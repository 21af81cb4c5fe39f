"""S3 and Secrets Manager adapters for bundles and secrets; AWS errors become domain errors."""

from __future__ import annotations

import base64
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from berth.domain.errors import StoreUnavailable
from berth.domain.ports import UploadTicket
from berth.domain.storage import bundle_key

UPLOAD_TTL_S = 900
REFERENCED_TAG = "berth-referenced"
_MISSING = {"404", "NoSuchKey", "NotFound", "ResourceNotFoundException"}


def _b64(digest: str) -> str:
    return base64.b64encode(bytes.fromhex(digest)).decode()


def _missing(exc: ClientError) -> bool:
    err = exc.response.get("Error", {})
    return str(err.get("Code")) in _MISSING


class S3BundleStore:
    """Bundles in the artifacts bucket, content-addressed per tenant, immutable once stored."""

    def __init__(self, bucket: str, client: Any | None = None) -> None:
        self._bucket = bucket
        self._s3 = client or boto3.client("s3", config=Config(signature_version="s3v4"))

    def exists(self, tenant: str, digest: str) -> bool:
        try:
            head = self._s3.head_object(
                Bucket=self._bucket, Key=bundle_key(tenant, digest), ChecksumMode="ENABLED"
            )
        except ClientError as exc:
            if _missing(exc):
                return False
            raise StoreUnavailable(f"artifact store unavailable ({exc.__class__.__name__})") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(f"artifact store unavailable ({exc.__class__.__name__})") from exc
        # S3 verified the content against this checksum at upload; a bundle whose recorded checksum
        # is not its name is not the bundle.
        return bool(head.get("ChecksumSHA256") == _b64(digest))

    def upload_ticket(self, tenant: str, digest: str, size: int) -> UploadTicket:
        checksum = _b64(digest)
        tagging = f"{REFERENCED_TAG}=false"
        try:
            url = self._s3.generate_presigned_url(
                "put_object",
                Params={
                    "Bucket": self._bucket,
                    "Key": bundle_key(tenant, digest),
                    "ContentLength": size,
                    "ChecksumSHA256": checksum,
                    "IfNoneMatch": "*",
                    "Tagging": tagging,
                },
                ExpiresIn=UPLOAD_TTL_S,
            )
        except BotoCoreError as exc:
            raise StoreUnavailable(f"cannot presign an upload ({exc.__class__.__name__})") from exc
        headers = {
            "Content-Length": str(size),
            "x-amz-checksum-sha256": checksum,
            "x-amz-sdk-checksum-algorithm": "SHA256",
            "If-None-Match": "*",
            "x-amz-tagging": tagging,
        }
        return UploadTicket(url=url, method="PUT", headers=headers, expires_in_s=UPLOAD_TTL_S)

    def mark_referenced(self, tenant: str, digest: str) -> None:
        try:
            self._s3.put_object_tagging(
                Bucket=self._bucket,
                Key=bundle_key(tenant, digest),
                Tagging={"TagSet": [{"Key": REFERENCED_TAG, "Value": "true"}]},
            )
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"artifact store unavailable ({exc.__class__.__name__})") from exc


class SecretsManagerCatalog:
    def __init__(self, client: Any | None = None) -> None:
        self._sm = client or boto3.client("secretsmanager")

    def exists(self, name: str) -> bool:
        try:
            self._sm.describe_secret(SecretId=name)
        except ClientError as exc:
            if _missing(exc):
                return False
            raise StoreUnavailable(f"secret store unavailable ({exc.__class__.__name__})") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(f"secret store unavailable ({exc.__class__.__name__})") from exc
        return True
