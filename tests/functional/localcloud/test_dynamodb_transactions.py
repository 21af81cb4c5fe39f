"""TransactWriteItems on moto with the local cloud's journal: all or nothing, and no table copies."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import Item

from berth_tools.localcloud import dynamodb_isolation, moto_compat

TABLE = "txn-test"
RANGE_TABLE = "txn-test-range"


@pytest.fixture
def ddb(aws: None) -> Iterator[Any]:
    undo = dynamodb_isolation.install()
    client = boto3.client("dynamodb", region_name="us-east-1")
    client.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.create_table(
        TableName=RANGE_TABLE,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    yield client
    undo()


def _items(client: Any, table: str) -> list[dict[str, Any]]:
    items = client.scan(TableName=table)["Items"]
    return sorted(items, key=lambda i: (i["pk"]["S"], i.get("sk", {}).get("N", "")))


def test_the_journal_replaces_moto_s_table_copy(ddb: Any) -> None:
    assert getattr(DynamoDBBackend.transact_write_items, "_berth_isolated", False)
    assert DynamoDBBackend.transact_write_items.__name__ == "transact_write_items"


def test_a_failed_condition_undoes_every_write_of_the_transaction(ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item={"pk": {"S": "counter"}, "n": {"N": "1"}})
    ddb.put_item(TableName=TABLE, Item={"pk": {"S": "doomed"}, "v": {"S": "keep me"}})
    ddb.put_item(TableName=RANGE_TABLE, Item={"pk": {"S": "job"}, "sk": {"N": "1"}})
    before = (_items(ddb, TABLE), _items(ddb, RANGE_TABLE))
    with pytest.raises(ClientError) as err:
        ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "new"}, "v": {"S": "x"}}}},
                {
                    "Update": {
                        "TableName": TABLE,
                        "Key": {"pk": {"S": "counter"}},
                        "UpdateExpression": "ADD n :one",
                        "ExpressionAttributeValues": {":one": {"N": "1"}},
                    }
                },
                {"Delete": {"TableName": TABLE, "Key": {"pk": {"S": "doomed"}}}},
                {"Put": {"TableName": RANGE_TABLE, "Item": {"pk": {"S": "job"}, "sk": {"N": "2"}}}},
                {
                    "ConditionCheck": {
                        "TableName": RANGE_TABLE,
                        "Key": {"pk": {"S": "job"}, "sk": {"N": "1"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
    assert err.value.response["Error"]["Code"] == "TransactionCanceledException"
    reasons = [r["Code"] for r in err.value.response["CancellationReasons"]]
    assert reasons == ["None", "None", "None", "None", "ConditionalCheckFailed"]
    assert (_items(ddb, TABLE), _items(ddb, RANGE_TABLE)) == before


def test_a_validation_error_mid_transaction_rolls_back_and_raises(ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item={"pk": {"S": "a"}, "n": {"N": "1"}})
    before = _items(ddb, TABLE)
    with pytest.raises(ClientError) as err:
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": TABLE,
                        "Key": {"pk": {"S": "a"}},
                        "UpdateExpression": "SET n = :two",
                        "ExpressionAttributeValues": {":two": {"N": "2"}},
                    }
                },
                {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "a"}}}},  # same item twice
            ]
        )
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert _items(ddb, TABLE) == before


def test_a_successful_transaction_applies_every_write(ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item={"pk": {"S": "counter"}, "n": {"N": "1"}})
    ddb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "job-1"}}}},
            {
                "Update": {
                    "TableName": TABLE,
                    "Key": {"pk": {"S": "counter"}},
                    "UpdateExpression": "ADD n :one",
                    "ConditionExpression": "n < :max",
                    "ExpressionAttributeValues": {":one": {"N": "1"}, ":max": {"N": "5"}},
                }
            },
        ]
    )
    assert _items(ddb, TABLE) == [
        {"pk": {"S": "counter"}, "n": {"N": "2"}},
        {"pk": {"S": "job-1"}},
    ]


def test_return_values_on_condition_check_failure_still_returns_the_item(ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item={"pk": {"S": "a"}, "v": {"S": "old"}})
    with pytest.raises(ClientError) as err:
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": TABLE,
                        "Item": {"pk": {"S": "a"}, "v": {"S": "new"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                }
            ]
        )
    assert err.value.response["CancellationReasons"][0]["Item"] == {"pk": {"S": "a"}, "v": {"S": "old"}}


def test_transactions_leave_no_model_instances_behind(ddb: Any) -> None:
    """moto kept every item it ever created (and every deep copy of one) in Item.instances_tracked."""
    moto_compat.untrack_instances()
    for i in range(200):
        ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": TABLE, "Item": {"pk": {"S": f"job-{i}"}}}},
                {
                    "Update": {
                        "TableName": TABLE,
                        "Key": {"pk": {"S": "counter"}},
                        "UpdateExpression": "ADD n :one",
                        "ExpressionAttributeValues": {":one": {"N": "1"}},
                    }
                },
            ]
        )
    gc.collect()
    stored = ddb.describe_table(TableName=TABLE)["Table"]["ItemCount"]
    assert stored == 201
    live = len(list(Item.instances_tracked))  # type: ignore[attr-defined]
    assert live <= 2 * stored, f"{live} Item instances alive for {stored} stored items"


def test_queries_and_scans_never_see_a_table_change_under_them(ddb: Any) -> None:
    """moto walks a table's live item dict in Query and Scan; a write landing meanwhile made them fail
    with "dictionary changed size during iteration" (a 500 under load). They wait for the write lock."""
    import threading

    ddb.put_item(TableName=RANGE_TABLE, Item={"pk": {"S": "p"}, "sk": {"N": "1"}})
    results: dict[str, int] = {}

    def read(kind: str) -> None:
        if kind == "query":
            answer = ddb.query(
                TableName=RANGE_TABLE,
                KeyConditionExpression="pk = :p",
                ExpressionAttributeValues={":p": {"S": "p"}},
            )
        else:
            answer = ddb.scan(TableName=RANGE_TABLE)
        results[kind] = answer["Count"]

    with dynamodb_isolation.WRITE_LOCK:  # a write in progress
        readers = [threading.Thread(target=read, args=(k,)) for k in ("query", "scan")]
        for r in readers:
            r.start()
        for r in readers:
            r.join(0.5)
        assert results == {}  # both wait for it
    for r in readers:
        r.join(10)
    assert results == {"query": 1, "scan": 1}


def test_single_item_answers_are_built_under_the_lock(ddb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto builds UpdateItem's and GetItem's answers from the live item after its backend returns; an
    update of the same item meanwhile made them fail with "dictionary changed size during iteration"
    (a 500 although the write happened). Every read of an item into an answer runs under the lock."""
    outside: list[str] = []
    to_json, describe_attrs = Item.to_json, Item.describe_attrs

    def probe(original: Any, name: str) -> Any:
        def probed(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not dynamodb_isolation.WRITE_LOCK._is_owned():  # type: ignore[attr-defined]
                outside.append(name)
            return original(self, *args, **kwargs)

        return probed

    monkeypatch.setattr(Item, "to_json", probe(to_json, "to_json"))
    monkeypatch.setattr(Item, "describe_attrs", probe(describe_attrs, "describe_attrs"))
    key = {"pk": {"S": "k"}}
    ddb.put_item(TableName=TABLE, Item={**key, "n": {"N": "0"}})
    ddb.update_item(
        TableName=TABLE,
        Key=key,
        UpdateExpression="SET n = n + :one, m = :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="ALL_NEW",
    )
    assert ddb.get_item(TableName=TABLE, Key=key)["Item"]["n"] == {"N": "1"}
    assert ddb.batch_get_item(RequestItems={TABLE: {"Keys": [key]}})["Responses"][TABLE]
    assert ddb.transact_get_items(TransactItems=[{"Get": {"TableName": TABLE, "Key": key}}])["Responses"]
    ddb.delete_item(TableName=TABLE, Key=key, ReturnValues="ALL_OLD")
    assert outside == []


def test_racing_updates_of_one_item_all_answer(ddb: Any) -> None:
    """Eight threads update and read one item at once: every request answers, and every update counts."""
    import threading

    key = {"pk": {"S": "hot"}}
    ddb.put_item(TableName=TABLE, Item={**key, "n": {"N": "0"}})
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def hammer(i: int) -> None:
        barrier.wait()
        try:
            for j in range(40):
                ddb.update_item(
                    TableName=TABLE,
                    Key=key,
                    UpdateExpression=f"SET n = n + :one, a{i}_{j} = :one",
                    ExpressionAttributeValues={":one": {"N": "1"}},
                    ReturnValues="ALL_NEW",
                )
                ddb.get_item(TableName=TABLE, Key=key)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ddb.get_item(TableName=TABLE, Key=key)["Item"]["n"] == {"N": "320"}
