"""moto_dynamodb_json: DynamoDB answers serialised with attribute values written directly are, byte for
byte once parsed as JSON, what moto's generic serializer writes (every attribute type, nested maps and
lists, every operation that returns items), and an attribute value it does not know goes the generic way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from berth_tools.localcloud import moto_dynamodb_json

ITEM: dict[str, Any] = {
    "pk": {"S": "job-1"},
    "s": {"S": 'héllo "quoted" \\ \n'},
    "empty": {"S": ""},
    "n": {"N": "12.50"},
    "neg": {"N": "-3"},
    "b": {"B": b"\x00\x01\xffbinary"},
    "ss": {"SS": ["a", "b"]},
    "ns": {"NS": ["1", "2.5"]},
    "bs": {"BS": [b"\x01", b"\x02\x03"]},
    "t": {"BOOL": True},
    "f": {"BOOL": False},
    "null": {"NULL": True},
    "m": {"M": {"inner": {"M": {"deep": {"L": [{"S": "x"}, {"N": "1"}, {"B": b"z"}, {"NULL": True}]}}}}},
    "l": {"L": [{"M": {"a": {"SS": ["q"]}}}, {"L": []}, {"M": {}}]},
}


@pytest.fixture
def ddb(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, list[Any]]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        bodies: list[Any] = []

        def keep(http_response: Any, **_: Any) -> None:
            bodies.append(json.loads(http_response.content or b"{}"))

        client.meta.events.register("after-call.dynamodb.*", keep)
        client.put_item(TableName="t", Item=ITEM)
        client.put_item(TableName="t", Item={**ITEM, "pk": {"S": "job-2"}, "n": {"N": "7"}})
        yield client, bodies


def _calls(client: Any) -> None:
    key = {"pk": {"S": "job-1"}}
    client.get_item(TableName="t", Key=key)
    client.get_item(TableName="t", Key=key, ProjectionExpression="m.inner, s")
    client.get_item(TableName="t", Key={"pk": {"S": "missing"}})
    client.query(
        TableName="t",
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": "job-2"}},
        ReturnConsumedCapacity="TOTAL",
    )
    client.scan(TableName="t", Limit=1)
    client.batch_get_item(
        RequestItems={"t": {"Keys": [key, {"pk": {"S": "job-2"}}, {"pk": {"S": "missing"}}]}}
    )
    client.transact_get_items(TransactItems=[{"Get": {"TableName": "t", "Key": key}}])
    client.update_item(
        TableName="t",
        Key=key,
        UpdateExpression="SET n = n + :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="ALL_NEW",
    )
    client.put_item(TableName="t", Item={**ITEM, "n": {"N": "0"}}, ReturnValues="ALL_OLD")
    client.delete_item(TableName="t", Key={"pk": {"S": "job-2"}}, ReturnValues="ALL_OLD")


def test_answers_are_what_the_generic_serializer_writes(ddb: tuple[Any, list[Any]]) -> None:
    client, bodies = ddb
    bodies.clear()
    _calls(client)
    generic = list(bodies)
    # the same calls again, from the same starting state, with the patch
    client.put_item(TableName="t", Item=ITEM)
    client.put_item(TableName="t", Item={**ITEM, "pk": {"S": "job-2"}, "n": {"N": "7"}})
    undo = moto_dynamodb_json.install()
    try:
        before = moto_dynamodb_json.stats["direct"]
        bodies.clear()
        _calls(client)
        assert moto_dynamodb_json.stats["direct"] > before
    finally:
        undo()
    assert len(bodies) == len(generic) == 10
    for direct, expected in zip(bodies, generic, strict=True):
        assert direct == expected
    assert generic[0]["Item"]["b"] == {"B": "AAH/YmluYXJ5"} and generic[0]["Item"]["null"] == {"NULL": True}


@pytest.mark.parametrize(
    "value",
    [{"X": "1"}, {"S": None}, {"N": True}, {"M": []}, {"L": {}}, {"S": "a", "N": "1"}, {"BOOL": "yes"}, "S"],
)
def test_an_attribute_value_it_does_not_know_is_left_to_the_generic_walk(value: Any) -> None:
    with pytest.raises(moto_dynamodb_json._Unknown):
        moto_dynamodb_json.attribute_value(value)


def test_install_is_idempotent_and_undone() -> None:
    from moto.dynamodb.responses import DynamoResult

    original = DynamoResult.execute_result
    undo = moto_dynamodb_json.install()
    try:
        assert getattr(DynamoResult.execute_result, "_berth_direct", False)
        moto_dynamodb_json.install()()  # a second install changes nothing and its undo is a no-op
        assert getattr(DynamoResult.execute_result, "_berth_direct", False)
    finally:
        undo()
    assert DynamoResult.execute_result is original
