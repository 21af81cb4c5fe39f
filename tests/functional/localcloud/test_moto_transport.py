"""The in-process transport: SDK calls to the local moto server answered in the calling thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from berth_tools.localcloud.moto_server import MotoServer
from berth_tools.localcloud.moto_transport import InProcessTransport, in_process_clients


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    moto = MotoServer().start()
    yield moto
    moto.stop()


def _client(server: MotoServer, service: str, transport: InProcessTransport | None) -> Any:
    client = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).client(service, endpoint_url=server.endpoint_url)
    if transport is not None:
        client.meta.events.register("before-send", transport)
    return client


def test_dynamodb_in_process_answers_like_the_server(server: MotoServer) -> None:
    transport = InProcessTransport(server.endpoint_url)
    local, remote = _client(server, "dynamodb", transport), _client(server, "dynamodb", None)
    local.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    local.put_item(TableName="t", Item={"pk": {"S": "a"}, "n": {"N": "1"}})
    stored = remote.get_item(TableName="t", Key={"pk": {"S": "a"}})["Item"]
    assert stored == {"pk": {"S": "a"}, "n": {"N": "1"}}
    errors = []
    for client in (local, remote):
        with pytest.raises(ClientError) as err:
            client.put_item(
                TableName="t", Item={"pk": {"S": "a"}}, ConditionExpression="attribute_not_exists(pk)"
            )
        response = err.value.response
        errors.append((response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]))
    assert errors[0] == errors[1] == ("ConditionalCheckFailedException", 400)
    assert transport.served == 3  # create, put, refused put: none of them crossed the socket


def test_other_services_go_through_moto_s_wsgi_app(server: MotoServer) -> None:
    transport = InProcessTransport(server.endpoint_url)
    s3 = _client(server, "s3", transport)
    s3.create_bucket(Bucket="bucket-b")
    s3.put_object(Bucket="bucket-b", Key="dir/k v.txt", Body=b"\x00binary\xff")
    assert s3.get_object(Bucket="bucket-b", Key="dir/k v.txt")["Body"].read() == b"\x00binary\xff"
    listed = s3.list_objects_v2(Bucket="bucket-b", Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/k v.txt"]
    assert transport.served == 4


def test_requests_for_other_endpoints_are_left_alone(server: MotoServer) -> None:
    transport = InProcessTransport("http://127.0.0.1:1")  # not this server
    client = _client(server, "dynamodb", transport)
    client.list_tables()
    assert transport.served == 0


def test_a_moto_failure_is_a_500_not_an_exception_in_the_caller(
    server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = InProcessTransport(server.endpoint_url)

    def broken(*_: Any) -> Any:
        raise KeyError("moto bug")

    monkeypatch.setattr(transport, "_dynamodb_dispatch", broken)
    client = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).client(
        "dynamodb",
        endpoint_url=server.endpoint_url,
        config=Config(retries={"max_attempts": 1}),
    )
    client.meta.events.register("before-send", transport)
    with pytest.raises(ClientError) as err:
        client.list_tables()
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500


def test_clients_created_within_in_process_clients_are_served_in_process(
    server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pynamodb.connection import Connection

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")  # pynamodb's client reads the environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    before = _client(server, "sqs", None)
    with in_process_clients(server.endpoint_url) as transport:
        inside = _client(server, "sqs", None)
        elsewhere = boto3.session.Session(
            aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
        ).client("sqs", endpoint_url="http://127.0.0.1:9")  # another endpoint: left alone
        table = Connection(region="us-east-1", host=server.endpoint_url)
        url = inside.create_queue(QueueName="in-process")["QueueUrl"]
        table.list_tables()
        assert transport.served == 2
        assert before.get_queue_url(QueueName="in-process")["QueueUrl"] == url  # the same moto, by socket
        assert transport.served == 2
        assert transport.handles("http://127.0.0.1:9") is False and elsewhere.meta.endpoint_url.endswith(":9")
    after = _client(server, "sqs", None)
    after.list_queues()
    assert transport.served == 2  # created after: by socket
