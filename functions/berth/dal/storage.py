"""S3 and Secrets Manager adapters for bundles and secrets; AWS errors become domain errors."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from berth.dal import aws
from berth.domain.errors import StoreUnavailable
from berth.domain.ports import UploadTicket
from berth.domain.storage import bundle_key

UPLOAD_TTL_S = 900
REFERENCED_TAG = "berth-referenced"
_MISSING = {"404", "NoSuchKey", "NotFound", "ResourceNotFoundException"}


def _b64(digest: str) -> str:
    return base64.b64encode(bytes.fromhex(digest)).decode()


class _Missing(Exception):
    """The object or secret does not exist (not a failure of the store)."""


@contextmanager
def _translated(store: str) -> Iterator[None]:
    """AWS errors become StoreUnavailable, except "does not exist", which becomes _Missing."""
    try:
        yield
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in _MISSING:
            raise _Missing from exc
        raise StoreUnavailable(f"{store} unavailable ({exc.__class__.__name__})") from exc
    except BotoCoreError as exc:
        raise StoreUnavailable(f"{store} unavailable ({exc.__class__.__name__})") from exc


#: A bundle this instance found stored and tagged referenced is taken as such for this long without
#: asking S3 again: a referenced bundle is immutable and never expires (docs/data.md), so a sweep's
#: submits of one bundle cost two S3 calls per instance per window, not two each.
KNOWN_REFERENCED_S = 600.0


class S3BundleStore:
    """Bundles in the artifacts bucket, content-addressed per tenant, immutable once stored."""

    def __init__(
        self, bucket: str, client: Any | None = None, known_referenced_s: float = KNOWN_REFERENCED_S
    ) -> None:
        self._bucket = bucket
        self._s3 = client or aws.client("s3", config=Config(signature_version="s3v4"))
        self._known_s = known_referenced_s
        self._referenced: dict[tuple[str, str], float] = {}  # (tenant, digest) -> monotonic time

    def _known(self, tenant: str, digest: str) -> bool:
        at = self._referenced.get((tenant, digest))
        return at is not None and time.monotonic() - at < self._known_s

    def exists(self, tenant: str, digest: str) -> bool:
        if self._known(tenant, digest):
            return True
        try:
            with _translated("artifact store"):
                head = self._s3.head_object(
                    Bucket=self._bucket, Key=bundle_key(tenant, digest), ChecksumMode="ENABLED"
                )
        except _Missing:
            return False
        # S3 verified the content against this checksum at upload; a bundle whose recorded checksum
        # is not its name is not the bundle.
        return bool(head.get("ChecksumSHA256") == _b64(digest))

    def upload_ticket(self, tenant: str, digest: str, size: int) -> UploadTicket:
        checksum = _b64(digest)
        tagging = f"{REFERENCED_TAG}=false"
        with _translated("artifact store"):
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
        headers = {
            "Content-Length": str(size),
            "x-amz-checksum-sha256": checksum,
            "x-amz-sdk-checksum-algorithm": "SHA256",
            "If-None-Match": "*",
            "x-amz-tagging": tagging,
        }
        return UploadTicket(url=url, method="PUT", headers=headers, expires_in_s=UPLOAD_TTL_S)

    def mark_referenced(self, tenant: str, digest: str) -> None:
        if self._known(tenant, digest):
            return
        with _translated("artifact store"):
            self._s3.put_object_tagging(
                Bucket=self._bucket,
                Key=bundle_key(tenant, digest),
                Tagging={"TagSet": [{"Key": REFERENCED_TAG, "Value": "true"}]},
            )
        if len(self._referenced) >= 4096:
            self._referenced.clear()
        self._referenced[(tenant, digest)] = time.monotonic()


class SecretsManagerCatalog:
    def __init__(self, client: Any | None = None) -> None:
        self._sm = client or aws.client("secretsmanager")

    def exists(self, name: str) -> bool:
        try:
            with _translated("secret store"):
                self._sm.describe_secret(SecretId=name)
        except _Missing:
            return False
        return True
