"""BotocoreIO on botocore's Stubber: every call checked against the real service models, no network."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from berth_agent.attempt import AttemptIO
from berth_agent.awsio import BotocoreIO
from berth_agent.staging import ObjectCache, StagingError

CREDS = {"AccessKeyId": "ASIAJOB", "SecretAccessKey": "s", "SessionToken": "t"}


def _body(data: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(data), len(data))


@pytest.fixture
def aws(tmp_path: Path) -> Iterator[tuple[BotocoreIO, dict[str, Stubber]]]:
    session = botocore.session.Session()
    kw: dict[str, Any] = dict(
        region_name="eu-west-1", aws_access_key_id="ASIAJOB", aws_secret_access_key="s", aws_session_token="t"
    )
    clients = {n: session.create_client(n, **kw) for n in ("s3", "logs", "secretsmanager")}
    stubs = {n: Stubber(c) for n, c in clients.items()}
    for s in stubs.values():
        s.activate()
    cache = ObjectCache(tmp_path / "cache", max_bytes=10_000)
    yield (
        BotocoreIO(clients, cache=cache, artifacts_bucket="berth-artifacts", data_bucket="berth-data"),
        stubs,
    )
    for s in stubs.values():
        s.assert_no_pending_responses()


def test_bundle_fetched_once_through_the_cache(
    aws: tuple[BotocoreIO, dict[str, Stubber]], tmp_path: Path
) -> None:
    aio, stubs = aws
    data = b"bundle bytes"
    digest = hashlib.sha256(data).hexdigest()
    key = f"bundles/vision/sha256/{digest}.tar.gz"
    stubs["s3"].add_response("get_object", {"Body": _body(data)}, {"Bucket": "berth-artifacts", "Key": key})
    aio.fetch_bundle("vision", digest, tmp_path / "a" / "bundle")
    aio.fetch_bundle("vision", digest, tmp_path / "b" / "bundle")  # a cache hit: no second GetObject
    assert (tmp_path / "a" / "bundle").read_bytes() == data == (tmp_path / "b" / "bundle").read_bytes()


def test_single_object_pinned_to_its_version(
    aws: tuple[BotocoreIO, dict[str, Stubber]], tmp_path: Path
) -> None:
    aio, stubs = aws
    stubs["s3"].add_response(
        "head_object",
        {"VersionId": "v7", "ETag": '"e"', "ContentLength": 3},
        {"Bucket": "data-b", "Key": "vision/x.csv"},
    )
    stubs["s3"].add_response(
        "get_object", {"Body": _body(b"a,b")}, {"Bucket": "data-b", "Key": "vision/x.csv", "VersionId": "v7"}
    )
    out = aio.stage_s3("s3://data-b/vision/x.csv", tmp_path / "d")
    assert (out / "x.csv").read_bytes() == b"a,b"


def test_prefix_listed_and_keyed_by_etag(aws: tuple[BotocoreIO, dict[str, Stubber]], tmp_path: Path) -> None:
    aio, stubs = aws
    contents = [
        {"Key": "vision/ds/", "ETag": '"d"', "Size": 0},
        {"Key": "vision/ds/a.txt", "ETag": '"ea"', "Size": 1},
        {"Key": "vision/ds/sub/b.txt", "ETag": '"eb"', "Size": 1},
    ]
    stubs["s3"].add_response(
        "list_objects_v2", {"Contents": contents}, {"Bucket": "data-b", "Prefix": "vision/ds/"}
    )
    for key, etag, body in (("vision/ds/a.txt", '"ea"', b"A"), ("vision/ds/sub/b.txt", '"eb"', b"B")):
        stubs["s3"].add_response(
            "get_object", {"Body": _body(body)}, {"Bucket": "data-b", "Key": key, "IfMatch": etag}
        )
    out = aio.stage_s3("s3://data-b/vision/ds/", tmp_path / "d")
    assert (out / "a.txt").read_bytes() == b"A" and (out / "sub" / "b.txt").read_bytes() == b"B"
    # the cache now says it holds the whole source (the heartbeat's cached_datasets)
    [held] = aio.cache.cached_datasets()
    assert held.source == "s3://data-b/vision/ds/" and held.size_bytes == 2 and len(held.version) == 32


def test_a_source_that_failed_to_stage_is_not_reported_cached(
    aws: tuple[BotocoreIO, dict[str, Stubber]], tmp_path: Path
) -> None:
    aio, stubs = aws
    stubs["s3"].add_client_error("head_object", "403", http_status_code=403)
    with pytest.raises(StagingError):
        aio.stage_s3("s3://nlp-data/nlp/secret.csv", tmp_path / "d")
    assert aio.cache.cached_datasets() == []


def test_access_denied_is_a_staging_error(aws: tuple[BotocoreIO, dict[str, Stubber]], tmp_path: Path) -> None:
    aio, stubs = aws
    stubs["s3"].add_client_error("head_object", "403", http_status_code=403)
    with pytest.raises(StagingError):
        aio.stage_s3("s3://nlp-data/nlp/secret.csv", tmp_path / "d")


def test_outputs_checkpoints_and_secrets(aws: tuple[BotocoreIO, dict[str, Stubber]], tmp_path: Path) -> None:
    aio, stubs = aws
    p = "vision/jobs/j1/checkpoints/"
    out_key = "vision/jobs/j1/outputs/m"
    stubs["s3"].add_response(
        "list_objects_v2", {"Contents": [{"Key": p + "s1"}]}, {"Bucket": "berth-data", "Prefix": p}
    )
    stubs["s3"].add_response("get_object", {"Body": _body(b"1")}, {"Bucket": "berth-data", "Key": p + "s1"})
    stubs["s3"].add_response(
        "put_object", {}, {"Bucket": "berth-data", "Key": out_key, "Body": ANY, "ContentLength": 2}
    )
    assert aio.list_keys(p) == [p + "s1"]
    aio.get(p + "s1", tmp_path / "s1")
    assert (tmp_path / "s1").read_bytes() == b"1"
    aio.put(io.BytesIO(b"ab"), out_key, 2)
    stubs["secretsmanager"].add_response(
        "get_secret_value", {"SecretString": "wandb-key"}, {"SecretId": "berth/vision/wandb"}
    )
    assert aio.secret_value("berth/vision/wandb") == "wandb-key"
    stubs["secretsmanager"].add_response(
        "get_secret_value", {"SecretBinary": b"x"}, {"SecretId": "berth/vision/bin"}
    )
    with pytest.raises(StagingError, match="binary"):
        aio.secret_value("berth/vision/bin")


def test_clients_use_the_attempts_credentials(tmp_path: Path) -> None:
    aio = BotocoreIO.for_credentials(
        CREDS,
        region="eu-west-1",
        cache=ObjectCache(tmp_path / "c", 100),
        artifacts_bucket="a",
        data_bucket="d",
        endpoint_url="http://127.0.0.1:1",
    )
    as_io: AttemptIO = aio  # mypy: BotocoreIO is the AttemptRunner's AttemptIO
    assert as_io is aio
    creds = aio._s3._request_signer._credentials
    assert (creds.access_key, creds.token) == ("ASIAJOB", "t")
    assert aio.logs_client().meta.endpoint_url == "http://127.0.0.1:1"
