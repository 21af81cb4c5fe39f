"""The short form of `make bench-api`: concurrent submits through the local cloud, nothing lost or doubled,
memory bounded per submit. No timing assertions (shared machines); the long form reports throughput."""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Iterator

import pytest
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.dynamo_type import Item

from berth_tools.client import BerthClient, ClientConfig
from berth_tools.loadtest.submit_latency import measure, sample_process
from berth_tools.localcloud.cloud import LOCAL_TIMINGS, LocalCloud, load_template

from .conftest import REAL_TEMPLATE
from .test_real_template import _cold_start_handlers

pytestmark = pytest.mark.usefixtures("real_template")  # missing: an error that says `make synth`

SUBMITS = 100
CLIENTS = 8
#: The long form's target is 50 KiB per submit on a dedicated process; this process also runs pytest and
#: the clients, and RSS moves in allocator-sized steps. Measured here: about 13 KiB per submit; before the
#: fixes about 125 KiB at this size (moto copied every table a transaction touched and kept the copies,
#: so it grew with the square of the number of jobs: 2 MiB per submit over 1,000).
#: In the full suite this process also holds the workflow executions of earlier modules' local clouds
#: (moto keeps their threads until their timeouts), which allocate while this test measures; the
#: bound still catches the quadratic growth above, and the item-count check below is exact.
MAX_GROWTH_PER_SUBMIT_KIB = 512


@pytest.fixture(scope="module")
def loaded_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    _cold_start_handlers()
    # The API path alone: no workflow execution per submit (the whole path is `berth bench e2e`).
    with LocalCloud(
        template=load_template(REAL_TEMPLATE),
        state_dir=tmp_path_factory.mktemp("state"),
        function_timings={**LOCAL_TIMINGS, "BERTH_STATE_MACHINE_ARN": ""},
    ) as cloud:
        yield cloud
    _cold_start_handlers()


def test_concurrent_submits_are_neither_lost_nor_doubled_and_memory_stays_bounded(
    loaded_cloud: LocalCloud, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = loaded_cloud.state_dir
    assert state is not None
    monkeypatch.setenv("AWS_CONFIG_FILE", str(state / "aws" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(state / "aws" / "credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    config = ClientConfig(api_url=loaded_cloud.api_url, region=loaded_cloud.region, profile="alice")
    gc.collect()
    tracemalloc.start()
    try:
        report = measure(
            lambda: BerthClient(config),
            2 * CLIENTS,  # warm-up: the sandboxes, connections and the server's threads
            concurrency=CLIENTS,
            pid=os.getpid(),
        )
        gc.collect()
        heap_before = tracemalloc.get_traced_memory()[0]
        report = measure(lambda: BerthClient(config), SUBMITS, concurrency=CLIENTS, pid=os.getpid())
        gc.collect()
        heap_growth_kib = (tracemalloc.get_traced_memory()[0] - heap_before) / 1024 / SUBMITS
    finally:
        tracemalloc.stop()
    assert report.errors == {}
    assert (report.ok, report.failed, report.lost, report.duplicated) == (SUBMITS, 0, 0, 0)
    # The Python heap of the process that holds moto (what a leak of models or copies would grow). Its
    # RSS also moves with the allocator's per-thread arenas of the moto server's request threads (the
    # Lambda sandboxes call it over HTTP), so RSS is reported by `berth bench api`, not bounded here.
    assert heap_growth_kib <= MAX_GROWTH_PER_SUBMIT_KIB, (heap_growth_kib, report)
    # deterministic as well: moto keeps no model instance beyond the items the tables hold
    gc.collect()
    tables = dynamodb_backends["123456789012"]["us-east-1"].tables.values()
    stored = sum(len(v) if isinstance(v, dict) else 1 for t in tables for v in t.items.values())
    live = len(list(Item.instances_tracked))  # type: ignore[attr-defined]
    assert live <= 2 * stored + 100, f"{live} DynamoDB Item instances alive for {stored} stored items"
    # every probe job was canceled: the tenant's active-job counter is back where it was
    status, quota = loaded_cloud.request("GET", "/v1/jobs?status=QUEUED&limit=100", profile="alice")
    assert status == 200 and isinstance(quota, dict)
    assert [j for j in quota["jobs"] if j["spec"]["name"].startswith("bench-")] == []


def test_the_front_door_reports_the_local_cloud_process(loaded_cloud: LocalCloud) -> None:
    from berth_tools.loadtest.submit_latency import local_cloud_pid

    assert local_cloud_pid(loaded_cloud.api_url) == os.getpid()
    sample = sample_process(os.getpid())
    assert sample is not None and sample.rss_bytes > 0 and sample.cpu_s > 0
