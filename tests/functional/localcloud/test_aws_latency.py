"""Added AWS latency (``aws_latency``): every metered call sleeps L ms once, before any lock, through
the in-process transport and the moto server alike; AWS's own (unmetered) calls do not; the local-only
route sets it in a running local cloud. Sleeps are recorded, not timed."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from berth_tools.localcloud import aws_latency, dynamodb_isolation, metering
from berth_tools.localcloud.moto_server import MotoServer
from berth_tools.localcloud.moto_transport import InProcessTransport


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    moto = MotoServer().start()
    yield moto
    moto.stop()


def _write_lock_held() -> bool:
    """Whether some thread holds DynamoDB's write lock (tried from another thread: it is reentrant)."""
    free: list[bool] = []

    def probe() -> None:
        got = dynamodb_isolation.WRITE_LOCK.acquire(blocking=False)
        if got:
            dynamodb_isolation.WRITE_LOCK.release()
        free.append(got)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return not free[0]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[float, bool]]]:
    """Each sleep the module takes, with whether DynamoDB's write lock was held meanwhile."""
    taken: list[tuple[float, bool]] = []
    monkeypatch.setattr(aws_latency.time, "sleep", lambda s: taken.append((s, _write_lock_held())))
    yield taken
    aws_latency.set_ms(0)


def _client(server: MotoServer, service: str, transport: InProcessTransport | None = None) -> Any:
    client = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).client(service, endpoint_url=server.endpoint_url)
    if transport is not None:
        client.meta.events.register("before-send", transport)
    return client


def test_every_metered_call_waits_once_outside_the_write_lock(
    server: MotoServer, sleeps: list[tuple[float, bool]]
) -> None:
    ddb = _client(server, "dynamodb", InProcessTransport(server.endpoint_url))
    ddb.create_table(
        TableName="latency",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    assert sleeps == []  # no latency set: no sleep
    assert aws_latency.set_ms(12.5) == 0
    ddb.put_item(TableName="latency", Item={"pk": {"S": "a"}})  # in-process transport
    ddb.get_item(TableName="latency", Key={"pk": {"S": "a"}})
    _client(server, "sqs").list_queues()  # through the moto server's middleware
    assert sleeps == [(0.0125, False)] * 3
    unmetered = _client(server, "dynamodb", InProcessTransport(server.endpoint_url, metered=False))
    unmetered.get_item(TableName="latency", Key={"pk": {"S": "a"}})  # AWS's own call: not delayed
    assert len(sleeps) == 3


def test_bad_latencies_are_refused() -> None:
    for bad in (-1, aws_latency.MAX_MS + 1):
        with pytest.raises(ValueError):
            aws_latency.set_ms(bad)
    assert aws_latency.get_ms() == 0


def test_the_local_route_sets_and_reads_it(server: MotoServer, sleeps: list[tuple[float, bool]]) -> None:
    assert aws_latency.get_remote(server.endpoint_url) == 0
    assert aws_latency.set_remote(server.endpoint_url, 7) == 7 and aws_latency.get_ms() == 7
    for body in (b"{}", b'{"ms": -3}', b'{"ms": "x"}', b"nope"):
        request = urllib.request.Request(server.endpoint_url + aws_latency.LATENCY_PATH, data=body)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 400 and "ms" in json.loads(err.value.read())["message"]
    assert aws_latency.get_ms() == 7  # nothing changed by bad input
    assert metering.read_meter(server.endpoint_url)["meter"]  # the meter's route is unaffected
