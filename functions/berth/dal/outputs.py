"""A job's outputs and checkpoints in the data bucket: list a prefix and presign a GET per object.

The API's role may list the bucket only under ``*/jobs/*`` prefixes and read only objects there
(infra: ``ApiFunction``); which prefix a caller gets is decided by ``berth.logic.outputs`` from the
job record, never from the request.
"""

from __future__ import annotations

from typing import Any

from botocore.config import Config

from berth.dal import aws
from berth.dal.storage import _translated
from berth.domain.ports import ObjectPage, StoredObject


class S3OutputStore:
    def __init__(self, bucket: str, client: Any | None = None) -> None:
        self.bucket = bucket
        self._s3 = client or aws.client("s3", config=Config(signature_version="s3v4"))

    def list_presigned(
        self, prefix: str, start_after: str | None, limit: int, expires_in_s: int
    ) -> ObjectPage:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": limit}
        if start_after:
            kwargs["StartAfter"] = start_after
        with _translated("data store"):
            page = self._s3.list_objects_v2(**kwargs)
            objects = [
                StoredObject(
                    key=o["Key"],
                    size=int(o["Size"]),
                    last_modified=o["LastModified"],
                    url=self._s3.generate_presigned_url(
                        "get_object", Params={"Bucket": self.bucket, "Key": o["Key"]}, ExpiresIn=expires_in_s
                    ),
                )
                for o in page.get("Contents", [])
            ]
        more = bool(page.get("IsTruncated")) and bool(objects)
        return ObjectPage(objects=objects, last_key=objects[-1].key if more else None)
