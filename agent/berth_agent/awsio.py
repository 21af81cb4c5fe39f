"""``AttemptIO`` over botocore, with one attempt's scoped credentials (S3, CloudWatch Logs, Secrets).

``BotocoreIO.for_credentials(creds, ...)`` builds the attempt's clients from the agent API's
``credentials`` answer (AccessKeyId, SecretAccessKey, SessionToken), never from the host's identity,
so every read and write is bounded by the attempt's session policy (its tenant's prefixes only;
the confused-deputy rule of the brief). Reads go through the host's ``ObjectCache``:

- bundles: ``bundle_key(tenant, digest)`` in the artifacts bucket, cached under the digest itself;
- ``s3://bucket/key``: HeadObject gives the version id (or the ETag on an unversioned bucket) and
  size, the cache key; GetObject fetches that exact version (``VersionId`` or ``IfMatch``);
- ``s3://bucket/prefix/``: ListObjectsV2 (paginated), each object keyed by its ETag and size.

Staged objects are hard-linked (or copied) into the attempt's directory and unpinned at once: the
link keeps the bytes for the job even if the cache evicts its entry meanwhile.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import botocore.session
from botocore.exceptions import BotoCoreError, ClientError

from berth_agent.staging import ObjectCache, ObjectRef, StagingError, bundle_key, safe_join

CHUNK = 1024 * 1024


def _version(head: Mapping[str, Any]) -> str:
    vid = head.get("VersionId")
    if vid and vid != "null":
        return f"version:{vid}"
    return f"etag:{head['ETag']}"


class BotocoreIO:
    def __init__(
        self,
        clients: Mapping[str, Any],
        *,
        cache: ObjectCache,
        artifacts_bucket: str,
        data_bucket: str,
    ) -> None:
        self._s3 = clients["s3"]
        self._logs = clients["logs"]
        self._secrets = clients["secretsmanager"]
        self.cache = cache
        self.artifacts_bucket, self.data_bucket = artifacts_bucket, data_bucket

    @classmethod
    def for_credentials(
        cls,
        creds: Mapping[str, Any],
        *,
        region: str,
        cache: ObjectCache,
        artifacts_bucket: str,
        data_bucket: str,
        endpoint_url: str | None = None,
    ) -> BotocoreIO:
        session = botocore.session.Session()
        kw = {
            "region_name": region,
            "aws_access_key_id": creds["AccessKeyId"],
            "aws_secret_access_key": creds["SecretAccessKey"],
            "aws_session_token": creds["SessionToken"],
            "endpoint_url": endpoint_url,
        }
        clients = {name: session.create_client(name, **kw) for name in ("s3", "logs", "secretsmanager")}
        return cls(clients, cache=cache, artifacts_bucket=artifacts_bucket, data_bucket=data_bucket)

    # -- S3 reads through the cache ------------------------------------------------------------
    def _fetch(self, ref: ObjectRef, dest: Path) -> None:
        args: dict[str, Any] = {"Bucket": ref.bucket, "Key": ref.key}
        kind, _, value = ref.version.partition(":")
        if kind == "version":
            args["VersionId"] = value
        elif kind == "etag":
            args["IfMatch"] = value
        try:
            body = self._s3.get_object(**args)["Body"]
            with dest.open("wb") as fh:
                for chunk in body.iter_chunks(CHUNK):
                    fh.write(chunk)
        except (ClientError, BotoCoreError) as exc:
            raise StagingError(f"s3://{ref.bucket}/{ref.key}: {exc}") from exc

    def _link(self, ref: ObjectRef, dest: Path, staged: list[ObjectRef] | None = None) -> None:
        src = self.cache.acquire(ref, self._fetch)
        if staged is not None:
            staged.append(ref)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                dest.hardlink_to(src)
            except OSError:
                shutil.copyfile(src, dest)
        finally:
            self.cache.release(ref)

    def fetch_bundle(self, tenant: str, digest: str, dest: Path) -> None:
        key = bundle_key(tenant, digest)
        self._link(ObjectRef(self.artifacts_bucket, key, f"sha256:{digest}"), dest)

    def fetch_bundle_uri(self, uri: str, digest: str, dest: Path) -> None:
        """A code bundle at ``s3://bucket/key`` (the cloud launcher's ``code.uri``), cached by its digest."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not bucket or not key or key.endswith("/"):
            raise StagingError(f"code bundle {uri} is not an s3://bucket/key object")
        self._link(ObjectRef(bucket, key, f"sha256:{digest}"), dest)

    def stage_s3(self, uri: str, dest: Path) -> Path:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        staged: list[ObjectRef] = []
        try:
            if key and not key.endswith("/"):
                head = self._s3.head_object(Bucket=bucket, Key=key)
                target = dest / key.rsplit("/", 1)[-1]
                self._link(ObjectRef(bucket, key, _version(head), int(head["ContentLength"])), target, staged)
                self.cache.note_dataset(uri, staged)
                return dest
            for obj in self._list(bucket, key):
                if obj["Key"].endswith("/"):
                    continue
                ref = ObjectRef(bucket, obj["Key"], f"etag:{obj['ETag']}", int(obj["Size"]))
                self._link(ref, safe_join(dest, obj["Key"][len(key) :]), staged)
        except (ClientError, BotoCoreError) as exc:
            raise StagingError(f"{uri}: {exc}") from exc
        # Staged whole: the host's cache now holds this source (its heartbeat says so).
        self.cache.note_dataset(uri, staged)
        dest.mkdir(parents=True, exist_ok=True)
        return dest

    def _list(self, bucket: str, prefix: str) -> Iterable[Mapping[str, Any]]:
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            yield from page.get("Contents", [])

    # -- outputs and checkpoints (the data bucket) ---------------------------------------------
    def list_keys(self, prefix: str) -> Iterable[str]:
        return [obj["Key"] for obj in self._list(self.data_bucket, prefix)]

    def get(self, key: str, dest: Path) -> None:
        body = self._s3.get_object(Bucket=self.data_bucket, Key=key)["Body"]
        with dest.open("wb") as fh:
            for chunk in body.iter_chunks(CHUNK):
                fh.write(chunk)

    def put(self, fh: BinaryIO, key: str, size: int) -> None:
        self._s3.put_object(Bucket=self.data_bucket, Key=key, Body=fh, ContentLength=size)

    # -- logs and secrets ----------------------------------------------------------------------
    def logs_client(self) -> Any:
        return self._logs

    def secret_value(self, name: str) -> str:
        answer = self._secrets.get_secret_value(SecretId=name)
        if "SecretString" not in answer:
            raise StagingError(f"secret {name} is binary; only string secrets go into the environment")
        return str(answer["SecretString"])
