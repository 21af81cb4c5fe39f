"""The local cloud's meter: AWS requests counted on the moto server and the in-process transport, billed."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from berth_tools.localcloud import aws_prices, metering
from berth_tools.localcloud.moto_server import MotoServer
from berth_tools.localcloud.moto_transport import InProcessTransport

TABLE = "meter-items"
RANGE_TABLE = "meter-events"


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    moto = MotoServer().start()
    yield moto
    moto.stop()


def _client(server: MotoServer, service: str, transport: InProcessTransport | None = None) -> Any:
    client = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).client(service, endpoint_url=server.endpoint_url)
    if transport is not None:
        client.meta.events.register("before-send", transport)
    return client


def _meter(server: MotoServer, reset: bool = False) -> dict[str, Any]:
    """The meter as a bench client reads it: over HTTP from the moto server's port."""
    return metering.read_meter(server.endpoint_url, reset=reset)


@pytest.fixture(scope="module")
def ddb(server: MotoServer) -> Any:
    client = _client(server, "dynamodb")
    client.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.create_table(
        TableName=RANGE_TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return client


def _item(pk: str, size: int) -> dict[str, Any]:
    """An item of exactly `size` bytes as DynamoDB counts them: "pk" + pk + "data" + the padding."""
    padding = size - (len("pk") + len(pk) + len("data"))
    assert padding >= 0
    return {"pk": {"S": pk}, "data": {"S": "x" * padding}}


def _units(server: MotoServer, table: str) -> tuple[float, float]:
    tables = _meter(server)["meter"]["dynamodb"]["tables"]
    entry = tables.get(table, {"write_units": 0.0, "read_units": 0.0})
    return entry["write_units"], entry["read_units"]


def _delta(server: MotoServer, call: Callable[[], Any], table: str = TABLE) -> tuple[float, float]:
    before = _units(server, table)
    call()
    after = _units(server, table)
    return after[0] - before[0], after[1] - before[1]


# -- item sizes --------------------------------------------------------------------------------------------
def test_item_size_follows_dynamodb_rules() -> None:
    assert metering.item_size({"pk": {"S": "abc"}}) == 5
    assert metering.item_size({"é": {"S": "é"}}) == 4  # UTF-8 bytes
    # numbers: 1 byte per two significant digits plus 1; leading and trailing zeroes do not count
    assert metering.item_size({"n": {"N": "123.4500"}}) == 1 + 4
    assert metering.item_size({"n": {"N": "1000"}}) == 1 + 2
    assert metering.item_size({"n": {"N": "-0.001"}}) == 1 + 2
    assert metering.item_size({"b": {"B": "AAEC"}}) == 1 + 3  # base64 of 3 bytes
    assert metering.item_size({"t": {"BOOL": True}, "z": {"NULL": True}}) == 4
    # maps and lists: 3 bytes plus 1 per element
    assert metering.item_size({"m": {"M": {"a": {"S": "xy"}}}}) == 1 + 3 + (1 + 2 + 1)
    assert metering.item_size({"l": {"L": [{"S": "xy"}, {"N": "1"}]}}) == 1 + 3 + (2 + 1) + (2 + 1)
    assert metering.item_size({"s": {"SS": ["ab", "c"]}}) == 1 + 3
    assert metering.write_units(1024) == 1 and metering.write_units(1025) == 2
    assert metering.read_units(4096, False) == 0.5 and metering.read_units(4097, True) == 2.0


# -- DynamoDB through the moto server ----------------------------------------------------------------------
def test_dynamodb_write_units_from_item_sizes(server: MotoServer, ddb: Any) -> None:
    assert _delta(server, lambda: ddb.put_item(TableName=TABLE, Item=_item("a", 1024))) == (1, 0)
    assert _delta(server, lambda: ddb.put_item(TableName=TABLE, Item=_item("b", 1025))) == (2, 0)
    # overwriting: the larger of the old and the new item
    assert _delta(server, lambda: ddb.put_item(TableName=TABLE, Item=_item("b", 100))) == (2, 0)
    assert _delta(server, lambda: ddb.put_item(TableName=TABLE, Item=_item("b", 100))) == (1, 0)
    # an update is sized by the item after it (here 100 + "more" + 2000 bytes = 2104: 3 WRU)
    update = {
        "TableName": TABLE,
        "Key": {"pk": {"S": "b"}},
        "UpdateExpression": "SET more = :v",
        "ExpressionAttributeValues": {":v": {"S": "y" * 2000}},
    }
    assert _delta(server, lambda: ddb.update_item(**update)) == (3, 0)
    # a failed conditional write is charged for the existing item
    failed = {
        "TableName": TABLE,
        "Item": _item("b", 50),
        "ConditionExpression": "attribute_not_exists(pk)",
    }

    def conditional() -> None:
        with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
            ddb.put_item(**failed)

    assert _delta(server, conditional) == (3, 0)
    # a delete: the deleted item's size
    assert _delta(server, lambda: ddb.delete_item(TableName=TABLE, Key={"pk": {"S": "b"}})) == (3, 0)
    # a delete of nothing: at least 1
    assert _delta(server, lambda: ddb.delete_item(TableName=TABLE, Key={"pk": {"S": "zz"}})) == (1, 0)

    # a validation error is not charged
    def invalid() -> None:
        with pytest.raises(ddb.exceptions.ClientError):
            ddb.put_item(TableName=TABLE, Item={"nokey": {"S": "x"}})

    assert _delta(server, invalid) == (0, 0)


def test_dynamodb_transactions_and_batches(server: MotoServer, ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item=_item("t1", 1500))
    transaction = [
        {"Put": {"TableName": TABLE, "Item": _item("t2", 100)}},  # 2 x 1
        {  # 2 x 2 (1500 bytes)
            "Update": {
                "TableName": TABLE,
                "Key": {"pk": {"S": "t1"}},
                "UpdateExpression": "SET n = :n",
                "ExpressionAttributeValues": {":n": {"N": "1"}},
            }
        },
    ]
    assert _delta(server, lambda: ddb.transact_write_items(TransactItems=transaction)) == (6, 0)
    batch = {TABLE: [{"PutRequest": {"Item": _item(f"w{i}", 2048)}} for i in range(3)]}
    assert _delta(server, lambda: ddb.batch_write_item(RequestItems=batch)) == (6, 0)
    # reads of the 1500-byte (t1, +n: 1504) and 100-byte items, in a transaction: 2 x 1 each
    keys = [{"Get": {"TableName": TABLE, "Key": {"pk": {"S": pk}}}} for pk in ("t1", "t2")]
    assert _delta(server, lambda: ddb.transact_get_items(TransactItems=keys)) == (0, 4)
    # batch get: 0.5 per item (eventually consistent), a missing key still 0.5
    request = {TABLE: {"Keys": [{"pk": {"S": pk}} for pk in ("w0", "w1", "missing")]}}
    assert _delta(server, lambda: ddb.batch_get_item(RequestItems=request)) == (0, 1.5)


def test_dynamodb_read_units(server: MotoServer, ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item=_item("r", 5000))
    get = {"TableName": TABLE, "Key": {"pk": {"S": "r"}}}
    assert _delta(server, lambda: ddb.get_item(**get)) == (0, 1.0)  # 2 x 4 KB, eventually consistent
    assert _delta(server, lambda: ddb.get_item(**get, ConsistentRead=True)) == (0, 2.0)
    assert _delta(server, lambda: ddb.get_item(TableName=TABLE, Key={"pk": {"S": "nope"}})) == (0, 0.5)
    # a query is sized by the items it returns together: 3 x 1500 bytes = 4500 bytes, 2 x 4 KB
    for sk in range(3):
        item = {"pk": {"S": "job"}, "sk": {"N": str(sk)}, "data": {"S": "x" * (1500 - 13)}}
        assert metering.item_size(item) == 1500
        assert _delta(
            server, lambda item=item: ddb.put_item(TableName=RANGE_TABLE, Item=item), RANGE_TABLE
        ) == (
            2,
            0,
        )
    query = {
        "TableName": RANGE_TABLE,
        "KeyConditionExpression": "pk = :p",
        "ExpressionAttributeValues": {":p": {"S": "job"}},
    }
    assert _delta(server, lambda: ddb.query(**query), RANGE_TABLE) == (0, 1.0)
    assert _delta(server, lambda: ddb.query(**query, ConsistentRead=True), RANGE_TABLE) == (0, 2.0)
    assert _delta(server, lambda: ddb.scan(TableName=RANGE_TABLE), RANGE_TABLE) == (0, 1.0)


def test_in_process_transport_is_metered_once(server: MotoServer, ddb: Any) -> None:
    transport = InProcessTransport(server.endpoint_url)
    local = _client(server, "dynamodb", transport)
    before = _meter(server)["meter"]["requests"]["dynamodb"].get("PutItem", 0)
    assert _delta(server, lambda: local.put_item(TableName=TABLE, Item=_item("local", 3000))) == (3, 0)
    assert _delta(server, lambda: local.get_item(TableName=TABLE, Key={"pk": {"S": "local"}})) == (0, 0.5)
    assert transport.served == 2
    assert _meter(server)["meter"]["requests"]["dynamodb"]["PutItem"] == before + 1
    # and a non-DynamoDB service through the transport's WSGI path
    sqs = _client(server, "sqs", transport)
    url = sqs.create_queue(QueueName="meter-local")["QueueUrl"]
    sent = _meter(server)["meter"]["sqs"]["billed_requests"]
    sqs.send_message(QueueUrl=url, MessageBody="z" * (64 * 1024 + 1))
    assert _meter(server)["meter"]["sqs"]["billed_requests"] == sent + 2


# -- SQS, EventBridge, Step Functions ------------------------------------------------------------------------
def test_sqs_requests_in_64_kb_chunks(server: MotoServer) -> None:
    sqs = _client(server, "sqs")
    url = sqs.create_queue(QueueName="meter-work")["QueueUrl"]
    start = _meter(server)["meter"]["sqs"]
    sqs.send_message(QueueUrl=url, MessageBody="a" * 100)  # 1
    sqs.send_message(  # 65,000 + "k" + "String" + 600 = 65,607 bytes: 2
        QueueUrl=url,
        MessageBody="b" * 65_000,
        MessageAttributes={"k": {"DataType": "String", "StringValue": "v" * 600}},
    )
    sqs.send_message_batch(  # 3 x 30,000 bytes together: 2
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "c" * 30_000} for i in range(3)]
    )
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"]  # 100 bytes: 1
    assert received[0]["Body"] == "a" * 100
    sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])  # 1
    end = _meter(server)["meter"]["sqs"]
    assert end["requests"] - start["requests"] == 5
    assert end["billed_requests"] - start["billed_requests"] == 1 + 2 + 2 + 1 + 1


def test_eventbridge_entries_in_64_kb_chunks(server: MotoServer) -> None:
    events = _client(server, "events")
    start = _meter(server)["meter"]["events"]
    detail = json.dumps({"pad": "d" * 70_000})
    events.put_events(
        Entries=[
            {"Source": "berth", "DetailType": "Berth Job State Change", "Detail": "{}"},  # 1
            {"Source": "berth", "DetailType": "Berth Job State Change", "Detail": detail},  # 2
        ]
    )
    end = _meter(server)["meter"]["events"]
    assert end["put_events"] - start["put_events"] == 1
    assert end["entries"] - start["entries"] == 2
    assert end["billed_events"] - start["billed_events"] == 3


def test_step_functions_state_transitions(server: MotoServer) -> None:
    sfn = _client(server, "stepfunctions")
    definition = {
        "StartAt": "One",
        "States": {
            "One": {"Type": "Pass", "Next": "Two"},
            "Two": {"Type": "Pass", "Next": "Choose"},
            "Choose": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.go", "IsPresent": True, "Next": "Two"}],
                "Default": "Done",
            },
            "Done": {"Type": "Succeed"},
        },
    }
    machine = sfn.create_state_machine(
        name="meter-machine",
        definition=json.dumps(definition),
        roleArn="arn:aws:iam::123456789012:role/sfn",
    )["stateMachineArn"]
    start = _meter(server)["meter"]["stepfunctions"]["state_transitions"]
    execution = sfn.start_execution(stateMachineArn=machine, input="{}")["executionArn"]
    deadline = time.monotonic() + 20
    while sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
        assert time.monotonic() < deadline, "the execution did not finish"
        time.sleep(0.05)
    assert sfn.describe_execution(executionArn=execution)["status"] == "SUCCEEDED"
    history = sfn.get_execution_history(executionArn=execution)["events"]
    entered = [e for e in history if e["type"].endswith("StateEntered")]
    meter = _meter(server)["meter"]["stepfunctions"]
    assert len(entered) == 4
    assert meter["state_transitions"] - start == 4
    assert meter["by_type"]["PassStateEntered"] >= 2


# -- the route and the bill ----------------------------------------------------------------------------------
def test_reset_and_requests_by_operation(server: MotoServer, ddb: Any) -> None:
    assert _meter(server, reset=True)["bill"]["total_usd"] == 0
    ddb.get_item(TableName=TABLE, Key={"pk": {"S": "x"}})
    report = _meter(server)
    assert report["meter"]["requests"] == {"dynamodb": {"GetItem": 1}}
    assert report["bill"]["per_service_usd"]["dynamodb"] == pytest.approx(0.5 * 0.125 / 1e6)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.endpoint_url + metering.METER_PATH + "/nope", timeout=10)
    assert refused.value.code == 404


def test_a_tagged_access_key_counts_an_http_callers_requests_and_units_under_its_tag(
    server: MotoServer, ddb: Any
) -> None:
    # A client in another thread (or process) reaches the server over HTTP, where its context
    # variable is not seen: the key it signs with names it (`berth bench pass` counts its pass so).
    _meter(server, reset=True)
    tagged = boto3.session.Session(
        aws_access_key_id="tagged-key", aws_secret_access_key="x", region_name="us-east-1"
    ).client("dynamodb", endpoint_url=server.endpoint_url)
    metering.METER.tag_access_key("tagged-key", "bench-pass")
    tagged.put_item(TableName=TABLE, Item=_item("tagged", 100))
    tagged.get_item(TableName=TABLE, Key={"pk": {"S": "tagged"}})
    ddb.get_item(TableName=TABLE, Key={"pk": {"S": "tagged"}})  # another key: not the tag's
    mine = _meter(server)["meter"]["by_caller"]["bench-pass"]
    assert mine["dynamodb:PutItem"] == 1 and mine["dynamodb:GetItem"] == 1
    assert mine["dynamodb_write_units"] == 1.0 and mine["dynamodb_read_units"] == 0.5
    assert mine["emulator_s"] > 0 and "in_flight" not in mine  # moto's wall time serving them


def test_calls_count_under_the_activity_their_sandbox_serves(server: MotoServer) -> None:
    # The Lambda runtime names what a sandbox serves (an API route) while it serves it; the sandbox's
    # calls meanwhile count under that activity too, and calls after it ends under none.
    _meter(server, reset=True)
    key = "sandbox-key"
    sandbox = boto3.session.Session(
        aws_access_key_id=key, aws_secret_access_key="x", region_name="us-east-1"
    ).client("dynamodb", endpoint_url=server.endpoint_url)
    metering.METER.name_caller(key, "Berth-ApiFunction685AAB5B-X")
    metering.METER.begin_activity(key, "GET /v1/jobs/{id}")
    sandbox.get_item(TableName=TABLE, Key={"pk": {"S": "a"}})
    sandbox.get_item(TableName=TABLE, Key={"pk": {"S": "b"}})
    metering.METER.end_activity(key)
    sandbox.get_item(TableName=TABLE, Key={"pk": {"S": "c"}})
    meter = _meter(server)["meter"]
    assert meter["requests_by_caller"]["Berth-ApiFunction685AAB5B-X"] == {"dynamodb": {"GetItem": 3}}
    assert meter["requests_by_activity"] == {
        "Berth-ApiFunction685AAB5B-X": {"GET /v1/jobs/{id}": {"dynamodb": {"GetItem": 2}}}
    }
    # each begin is one invocation of that activity (the bench leaves out its GETs' invocations)
    metering.METER.begin_activity(key, "GET /v1/jobs/{id}")
    metering.METER.end_activity(key)
    assert _meter(server)["meter"]["activities_by_caller"] == {
        "Berth-ApiFunction685AAB5B-X": {"GET /v1/jobs/{id}": 2}
    }


def test_the_emulators_busy_time_counts_overlapping_calls_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 3.0, 4.0, 10.0, 12.0])  # a in, b in, a out, b out; c in, c out
    monkeypatch.setattr(metering.time, "perf_counter", lambda: next(clock))
    meter = metering.Meter()
    for delta in (+1, +1, -1, -1, +1, -1):
        meter._busy("t", delta)
    assert meter.snapshot()["by_caller"]["t"] == {"emulator_s": 6.0}  # 0..4 and 10..12


def test_bill_at_list_prices() -> None:
    meter = metering.Meter()
    for _ in range(1000):
        meter.record_state_entered("TaskStateEntered")
    meter.record_lambda("api", 99.2, 1024)  # billed 100 ms at 1 GB: 0.1 GB-s
    meter.record_lambda("api", 0.3, 512)  # billed 1 ms at 0.5 GB
    meter.record_dynamodb("jobs", write_units=1_000_000, read_units=2_000_000)
    meter.record_sqs(1)
    meter.record_put_events([10, 70_000])
    meter.record_api_request()
    meter.record_log_bytes(1024**3)
    snapshot = meter.snapshot()
    assert snapshot["lambda"]["billed_ms"] == 101
    assert snapshot["lambda"]["gb_seconds"] == pytest.approx(0.1 + 0.0005)
    bill = aws_prices.bill(snapshot)
    usd = bill["per_service_usd"]
    assert usd["stepfunctions"] == pytest.approx(0.025)
    assert usd["lambda"] == pytest.approx(0.1005 * 0.0000166667 + 2 * 0.2e-6)
    assert usd["dynamodb"] == pytest.approx(0.625 + 0.25)
    assert usd["sqs"] == pytest.approx(0.4e-6)
    assert usd["eventbridge"] == pytest.approx(3e-6)
    assert usd["apigateway"] == pytest.approx(3.5e-6)
    assert usd["logs"] == pytest.approx(0.5)
    assert bill["total_usd"] == pytest.approx(sum(usd.values()))
    assert aws_prices.cost_per_1000_jobs({"total_usd": 0.02}, 50) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        aws_prices.cost_per_1000_jobs(bill, 0)


def test_step_functions_retries_are_transitions(server: MotoServer) -> None:
    sfn = _client(server, "stepfunctions")
    definition = {
        "StartAt": "Call",
        "States": {
            "Call": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:getItem",
                "Parameters": {"TableName": "meter-no-such-table", "Key": {"pk": {"S": "x"}}},
                "Retry": [
                    {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 2, "BackoffRate": 1}
                ],
                "End": True,
            }
        },
    }
    machine = sfn.create_state_machine(
        name="meter-retries", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/sfn"
    )["stateMachineArn"]
    start = _meter(server)["meter"]["stepfunctions"]
    execution = sfn.start_execution(stateMachineArn=machine, input="{}")["executionArn"]
    deadline = time.monotonic() + 30
    while sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
        assert time.monotonic() < deadline, "the execution did not finish"
        time.sleep(0.1)
    assert sfn.describe_execution(executionArn=execution)["status"] == "FAILED"
    end = _meter(server)["meter"]["stepfunctions"]
    assert end["state_transitions"] - start["state_transitions"] == 1 + 2  # entered once, retried twice
    assert end["by_type"][metering.RETRY_TRANSITION] - start["by_type"].get(metering.RETRY_TRANSITION, 0) == 2


def test_dynamodb_secondary_index_writes(server: MotoServer) -> None:
    ddb = _client(server, "dynamodb")
    table = "meter-jobs"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "status", "AttributeType": "S"},
            {"AttributeName": "team", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_status",
                "KeySchema": [{"AttributeName": "status", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": "by_team",
                "KeySchema": [{"AttributeName": "team", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
        BillingMode="PAY_PER_REQUEST",
    )

    def units() -> dict[str, float]:
        tables = _meter(server)["meter"]["dynamodb"]["tables"]
        return {
            name: tables.get(name, {}).get("write_units", 0.0)
            for name in (table, f"{table}/by_status", f"{table}/by_team")
        }

    def delta(call: Callable[[], Any]) -> tuple[float, ...]:
        before = units()
        call()
        after = units()
        return tuple(after[name] - before[name] for name in before)

    def update(expression: str, values: dict[str, Any]) -> Callable[[], Any]:
        names = {"#s": "status"} if "#s" in expression else {}
        return lambda: ddb.update_item(
            TableName=table,
            Key={"pk": {"S": "j"}},
            UpdateExpression=expression,
            ExpressionAttributeValues=values,
            **({"ExpressionAttributeNames": names} if names else {}),
        )

    # 2,000 bytes with both index keys: table 2, by_status (ALL) 2, by_team (keys only: 9 bytes) 1
    item = {"pk": {"S": "j"}, "status": {"S": "QUEUED"}, "team": {"S": "ab"}, "data": {"S": "x" * 1975}}
    assert metering.item_size(item) == 2000
    assert delta(lambda: ddb.put_item(TableName=table, Item=item)) == (2, 2, 1)
    # a non-key attribute: by_status rewrites its copy, by_team projects nothing that changed
    assert delta(update("SET note = :n", {":n": {"S": "n"}})) == (2, 2, 0)
    # the index key changes: a delete and a put in by_status
    assert delta(update("SET #s = :s", {":s": {"S": "RUNNING"}})) == (2, 4, 0)
    # the item leaves the sparse by_team index
    assert delta(
        lambda: ddb.update_item(TableName=table, Key={"pk": {"S": "j"}}, UpdateExpression="REMOVE team")
    ) == (
        2,
        2,
        1,
    )
    # an item without the index keys is in no index
    assert delta(lambda: ddb.put_item(TableName=table, Item={"pk": {"S": "k"}})) == (1, 0, 0)

    # a failed conditional write changes no index
    def conditional() -> None:
        with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
            ddb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")

    assert delta(conditional) == (2, 0, 0)
    assert delta(lambda: ddb.delete_item(TableName=table, Key={"pk": {"S": "j"}})) == (2, 2, 0)


def test_requests_are_named_by_service_and_operation() -> None:
    auth = (
        "AWS4-HMAC-SHA256 Credential=AKID/20261201/us-east-1/{}/aws4_request, SignedHeaders=host, Signature=x"
    )
    form = "Action=SendMessage&MessageBody=" + "q" * 70_000 + "&MessageAttribute.1.Name=k"
    query_protocol = metering.ObservedRequest(
        "POST",
        "/",
        "",
        [("Authorization", auth.format("sqs")), ("Content-Type", "application/x-www-form-urlencoded")],
        form.encode(),
    )
    assert (query_protocol.service, query_protocol.operation, query_protocol.region) == (
        "sqs",
        "SendMessage",
        "us-east-1",
    )
    invoke = metering.ObservedRequest(
        "POST",
        "/2015-03-31/functions/berth-api/invocations",
        "",
        [("Authorization", auth.format("lambda"))],
        b"{}",
    )
    assert (invoke.service, invoke.operation) == ("lambda", "Invoke")
    target = metering.ObservedRequest("POST", "/", "", [("X-Amz-Target", "AWSEvents.PutEvents")], b"{}")
    assert (target.service, target.operation) == ("events", "PutEvents")
    meter = metering.Meter()
    meter.observe(query_protocol, lambda: (200, [], b""))
    assert meter.snapshot()["sqs"] == {"requests": 1, "billed_requests": 2, "payload_bytes": 70_001}
    assert meter.snapshot()["requests"] == {"sqs": {"SendMessage": 1}}


def test_query_protocol_operations_through_the_server(server: MotoServer) -> None:
    sts = _client(server, "sts")
    before = _meter(server)["meter"]["requests"].get("sts", {}).get("GetCallerIdentity", 0)
    sts.get_caller_identity()
    assert _meter(server)["meter"]["requests"]["sts"]["GetCallerIdentity"] == before + 1
