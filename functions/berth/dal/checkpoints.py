"""A job's checkpoints in the data bucket, as the cloud branch reads them when a cloud attempt ends.

One ListObjectsV2 pass over ``<tenant>/jobs/<job>/checkpoints/`` (1000 keys a page): the newest
object's LastModified is the checkpoint's time, the objects' sizes add up to its size. The Batch
events function may list the bucket only under such prefixes (infra: ``CheckpointsList``); which
prefix it reads comes from the job record, never from the event.
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from berth.dal import aws
from berth.dal.storage import _Missing, _translated
from berth.domain.errors import StoreUnavailable
from berth.domain.workflow import CheckpointInfo

#: ListObjectsV2's own maximum: a checkpoint of N objects costs ceil(N / 1000) calls.
PAGE_KEYS = 1000


class S3CheckpointStore:
    def __init__(self, bucket: str, client: Any | None = None, page_keys: int = PAGE_KEYS) -> None:
        self.bucket = bucket
        self._client = client
        self._page_keys = page_keys

    @cached_property
    def _s3(self) -> Any:
        """Made on the first read: the functions that share the cloud branch but never end an
        attempt (the scheduler's sweep, the submitter) pay nothing for it."""
        return self._client or aws.client("s3")

    def last_checkpoint(self, prefix: str) -> CheckpointInfo | None:
        newest: datetime | None = None
        total = 0
        try:
            with _translated("data store"):
                pages = self._s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self._page_keys}
                )
                for page in pages:
                    for o in page.get("Contents", []):
                        total += int(o["Size"])
                        at = o["LastModified"]
                        newest = at if newest is None or at > newest else newest
        except _Missing as exc:  # a "not found" of a listing is the bucket's: not a store to read
            raise StoreUnavailable(f"data store unavailable (bucket {self.bucket} not found)") from exc
        if newest is None:
            return None
        return CheckpointInfo(at=newest, size_bytes=total)
