"""CheckpointStore contract, run against the in-memory fake and S3 (moto): nothing under a prefix is
no checkpoint, objects elsewhere never count, the newest object's time and the sum of the sizes are
the checkpoint, a listing longer than a page is read to its end, and a store that cannot be read
raises ``StoreUnavailable`` (never an SDK error). Then the S3 adapter's own failure paths."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from berth.domain.errors import StoreUnavailable
from berth.domain.ports import CheckpointStore
from berth.domain.storage import job_checkpoint_prefix, job_output_prefix
from tests.functional.conftest import BUCKETS
from tests.unit.fakes import FakeCheckpointStore

DATA = BUCKETS["BERTH_DATA_BUCKET"]
PREFIX = job_checkpoint_prefix("vision", "j-1")


@dataclass(frozen=True)
class Bucket:
    store: CheckpointStore
    put: Callable[[str, int], None]
    broken: CheckpointStore
    """A store whose reads fail (S3: a bucket that is not there)."""


@pytest.fixture(params=["fake", "s3"])
def bucket(request: pytest.FixtureRequest) -> Iterator[Bucket]:
    if request.param == "fake":
        fake, broken = FakeCheckpointStore(), FakeCheckpointStore()
        broken.fail = True
        yield Bucket(fake, fake.put, broken)
        return
    request.getfixturevalue("aws")
    from berth.dal.checkpoints import S3CheckpointStore

    s3 = boto3.client("s3", region_name="us-east-1")

    def put(key: str, size: int) -> None:
        s3.put_object(Bucket=DATA, Key=key, Body=b"x" * size)

    # two keys a page: every test with more objects than that reads several pages
    yield Bucket(S3CheckpointStore(DATA, page_keys=2), put, S3CheckpointStore("berth-no-such-bucket"))


def _next_second() -> datetime:
    """Wait until the clock enters a new whole second (S3 keeps LastModified in whole seconds) and
    return it: whatever is stored from now on is dated at or after it, what was stored before it,
    before it."""
    now = time.time()
    time.sleep(int(now) + 1 - now + 0.01)
    return datetime.fromtimestamp(int(time.time()), UTC)


def test_nothing_under_the_prefix_is_no_checkpoint(bucket: Bucket) -> None:
    assert bucket.store.last_checkpoint(PREFIX) is None
    # the job's outputs, a job whose id extends this one's, another tenant's job of the same id
    bucket.put(job_output_prefix("vision", "j-1") + "outputs/model.pt", 10)
    bucket.put(job_checkpoint_prefix("vision", "j-10") + "step-1.pt", 10)
    bucket.put(job_checkpoint_prefix("nlp", "j-1") + "step-1.pt", 10)
    assert bucket.store.last_checkpoint(PREFIX) is None


def test_the_newest_object_dates_it_and_every_object_counts_its_size(bucket: Bucket) -> None:
    bucket.put(PREFIX + "step-1/model.pt", 100)
    bucket.put(PREFIX + "step-1/optim.pt", 250)
    bucket.put(job_output_prefix("vision", "j-1") + "outputs/log.txt", 9999)
    first = bucket.store.last_checkpoint(PREFIX)
    assert first is not None and first.size_bytes == 350
    boundary = _next_second()
    assert first.at < boundary
    bucket.put(PREFIX + "step-2/model.pt", 7)
    after = datetime.now(UTC)
    ckpt = bucket.store.last_checkpoint(PREFIX)
    assert ckpt is not None
    assert ckpt.size_bytes == 357
    assert boundary <= ckpt.at <= after  # the newest object's time, not the first one's


def test_a_listing_of_several_pages_is_read_to_its_end(bucket: Bucket) -> None:
    for i in range(7):
        bucket.put(f"{PREFIX}shard-{i}.pt", i + 1)
    ckpt = bucket.store.last_checkpoint(PREFIX)
    assert ckpt is not None and ckpt.size_bytes == sum(range(1, 8))


def test_a_store_that_cannot_be_read_raises_store_unavailable(bucket: Bucket) -> None:
    with pytest.raises(StoreUnavailable):
        bucket.broken.last_checkpoint(PREFIX)


# -- the S3 adapter's own paths ---------------------------------------------------------------------


def test_more_than_a_thousand_keys_are_read_past_s3s_page(aws: None) -> None:
    from berth.dal.checkpoints import S3CheckpointStore

    s3 = boto3.client("s3", region_name="us-east-1")
    for i in range(1001):
        s3.put_object(Bucket=DATA, Key=f"{PREFIX}shard-{i:04d}", Body=b"ab")
    ckpt = S3CheckpointStore(DATA).last_checkpoint(PREFIX)
    assert ckpt is not None and ckpt.size_bytes == 2002


@pytest.mark.parametrize("code", ["AccessDenied", "SlowDown", "InternalError", "NoSuchBucket", "NotFound"])
def test_s3_errors_become_store_unavailable(code: str) -> None:
    from berth.dal.checkpoints import S3CheckpointStore

    s3 = boto3.client(
        "s3", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    with Stubber(s3) as stub:
        stub.add_client_error("list_objects_v2", service_error_code=code, http_status_code=403)
        with pytest.raises(StoreUnavailable):
            S3CheckpointStore(DATA, client=s3).last_checkpoint(PREFIX)


def test_an_unreachable_s3_becomes_store_unavailable() -> None:
    from berth.dal.checkpoints import S3CheckpointStore

    s3 = boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",  # discard: nothing listens
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    with pytest.raises(StoreUnavailable):
        S3CheckpointStore(DATA, client=s3).last_checkpoint(PREFIX)
