"""moto_dynamodb_conditions: a condition expression parsed once per (text, names, value names) gives
every request the answer moto as shipped gives: the same writes, the same ConditionalCheckFailed and
cancellation reasons, the same validation errors (a value not given, a value not used, bad syntax),
each request with its own values, also from many threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from berth_tools.localcloud import moto_compat, moto_dynamodb_conditions

Step = Callable[[Any], Any]


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


@pytest.fixture
def patched() -> Iterator[None]:
    undo = moto_dynamodb_conditions.install()
    try:
        yield
    finally:
        undo()


def _table(client: Any) -> None:
    client.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def _put(pk: str, cond: str, **item: Any) -> Step:
    def step(client: Any) -> Any:
        kwargs: dict[str, Any] = {
            "TableName": "t",
            "Item": {"pk": {"S": pk}, **item},
            "ConditionExpression": cond,
        }
        return client.put_item(**kwargs)

    return step


def _update(pk: str, cond: str, values: dict[str, Any], names: dict[str, str] | None = None) -> Step:
    def step(client: Any) -> Any:
        kwargs: dict[str, Any] = {
            "TableName": "t",
            "Key": {"pk": {"S": pk}},
            "UpdateExpression": "SET #n = #n + :one",
            "ConditionExpression": cond,
            "ExpressionAttributeNames": {"#n": "n", **(names or {})},
            "ExpressionAttributeValues": {":one": {"N": "1"}, **values},
            "ReturnValues": "ALL_NEW",
        }
        return client.update_item(**kwargs)["Attributes"]

    return step


def _set(pk: str, update: str, values: dict[str, Any], names: dict[str, str] | None = None) -> Step:
    """An unconditional UpdateItem of ``update`` (an update expression's own parse and checks)."""

    def step(client: Any) -> Any:
        kwargs: dict[str, Any] = {
            "TableName": "t",
            "Key": {"pk": {"S": pk}},
            "UpdateExpression": update,
            "ReturnValues": "ALL_NEW",
        }
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if values:
            kwargs["ExpressionAttributeValues"] = values
        return client.update_item(**kwargs)["Attributes"]

    return step


def _transact(*writes: dict[str, Any]) -> Step:
    return lambda client: client.transact_write_items(TransactItems=list(writes))


def _check_then_put(at_least: int, pk: str) -> Step:
    """A transaction: item a's n is at least ``at_least``, and ``pk`` is put if absent."""
    check = {
        "TableName": "t",
        "Key": {"pk": {"S": "a"}},
        "ConditionExpression": "#n >= :v",
        "ExpressionAttributeNames": {"#n": "n"},
        "ExpressionAttributeValues": {":v": {"N": str(at_least)}},
    }
    put = {
        "TableName": "t",
        "Item": {"pk": {"S": pk}, "n": {"N": "0"}},
        "ConditionExpression": "attribute_not_exists(pk)",
    }
    return _transact({"ConditionCheck": check}, {"Put": put})


def _scan(expr: str, values: dict[str, Any]) -> Step:
    def step(client: Any) -> Any:
        out = client.scan(TableName="t", FilterExpression=expr, ExpressionAttributeValues=values)
        return sorted(i["pk"]["S"] for i in out["Items"])

    return step


N = lambda v: {"N": str(v)}  # noqa: E731
S = lambda v: {"S": v}  # noqa: E731

IN_VALUES = {":x": N(4), ":y": N(5), ":p": S("he")}

STEPS: list[Step] = [
    _put("a", "attribute_not_exists(pk)", n=N(1), tags={"L": [S("x")]}, m={"M": {"k": S("v")}}),
    _put("a", "attribute_not_exists(pk)", n=N(9)),  # exists: ConditionalCheckFailed
    _put("b", "attribute_not_exists(pk)", n=N(5), s=S("hello")),
    # one expression, different values: each request is checked against its own
    _update("a", "#n = :v", {":v": N(1)}),
    _update("a", "#n = :v", {":v": N(1)}),  # n is 2 now: fails
    _update("a", "#n = :v", {":v": N(2)}),
    _update("a", "#n BETWEEN :lo AND :hi", {":lo": N(0), ":hi": N(2)}),  # n is 3: fails
    _update("a", "#n BETWEEN :lo AND :hi", {":lo": N(3), ":hi": N(9)}),
    _update("b", "#n IN (:x, :y) AND begins_with(#s, :p)", IN_VALUES, {"#s": "s"}),
    _update("b", "#n IN (:x, :y) AND begins_with(#s, :p)", IN_VALUES, {"#s": "s"}),  # n is 6: fails
    _update("b", "NOT (#n < :v) OR (size(#s) > :len)", {":v": N(100), ":len": N(3)}, {"#s": "s"}),
    _update("a", "m.k = :v AND tags[0] = :t", {":v": S("v"), ":t": S("x")}),
    _update("a", "m.k = :v AND tags[0] = :t", {":v": S("w"), ":t": S("x")}),
    # one shape, different names: each request's names are the ones looked at (Berth names each job's
    # attempt and each GPU through ExpressionAttributeNames)
    _update("a", "attribute_not_exists(#m.#k)", {}, {"#m": "m", "#k": "k"}),  # m.k exists: fails
    _update("a", "attribute_not_exists(#m.#k)", {}, {"#m": "m", "#k": "z"}),
    _update("a", "attribute_not_exists(#m.#k)", {}, {"#m": "m", "#k": "k"}),  # fails again
    _update("a", "#m.#k = :v", {":v": S("v")}, {"#m": "m", "#k": "k"}),
    _update("a", "#m.#k = :v", {":v": S("v")}, {"#m": "tags", "#k": "k"}),  # tags is a list: fails
    _update("a", "#m.#k = :v", {":v": S("v")}, {"#m": "m"}),  # #k not given: a validation error
    # update expressions: one text, each request's names, values and item
    _set(
        "a", "SET #m.#k = :v, #n = #n + :one", {":v": S("x"), ":one": N(1)}, {"#m": "m", "#k": "k", "#n": "n"}
    ),
    _set(
        "b", "SET #m.#k = :v, #n = #n + :one", {":v": S("y"), ":one": N(2)}, {"#m": "m", "#k": "k", "#n": "n"}
    ),
    _set("b", "SET #m = :v, #n = #n + :one", {":v": {"M": {}}, ":one": N(2)}, {"#m": "m", "#n": "n"}),
    _set(
        "b", "SET #m.#k = :v, #n = #n + :one", {":v": S("y"), ":one": N(2)}, {"#m": "m", "#k": "k", "#n": "n"}
    ),
    _set("a", "SET #n = #n + :one REMOVE tags[0]", {":one": N(1)}, {"#n": "n"}),
    _set("a", "SET #n = #n + :one REMOVE tags[0]", {":one": N(1)}, {"#n": "n"}),
    _set("a", "SET #n = = :one", {":one": N(1)}, {"#n": "n"}),  # bad syntax
    _set("a", "SET #n = = :one", {":one": N(1)}, {"#n": "n"}),  # raised again, never kept
    _set("a", "SET #n = :one, #n = :one", {":one": N(1)}, {"#n": "n"}),  # overlapping paths
    _set("a", "ADD #n :one", {":one": N(1)}, {"#n": "n", "#unused": "u"}),  # a name not used
    _transact(
        {
            "Update": {
                "TableName": "t",
                "Key": {"pk": {"S": "b"}},
                "UpdateExpression": "SET #m.#k = :v",
                "ConditionExpression": "attribute_exists(#m)",
                "ExpressionAttributeNames": {"#m": "m", "#k": "w"},
                "ExpressionAttributeValues": {":v": S("t")},
            }
        }
    ),
    # validation errors, as moto as shipped raises them
    _update("a", "#n = :missing", {}),
    _update("a", "#n = :v", {":v": N(1), ":unused": N(2)}),
    _update("a", "#n = = :v", {":v": N(1)}),
    _update("a", "#undeclared = :v", {":v": N(1)}),
    # transactions: the condition of each item, and the cancellation reasons
    _check_then_put(at_least=1, pk="c"),
    _check_then_put(at_least=1000, pk="d"),  # a's n is under 1000: cancelled, d not put
    _scan("n > :v", {":v": N(0)}),
    _scan("n > :v", {":v": N(4)}),
    _scan("n > :v AND n < :w", {":v": N(-1), ":w": N(1)}),
]


def _run(steps: list[Step]) -> list[Any]:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        _table(client)
        out: list[Any] = []
        for step in steps:
            try:
                answer = step(client)
            except ClientError as exc:
                error = exc.response["Error"]
                reasons = exc.response.get("CancellationReasons")
                out.append(("error", error["Code"], error["Message"], reasons))
            except Exception as exc:  # moto as shipped lets some mistakes through as they are
                out.append(("raised", type(exc).__name__, str(exc)))
            else:
                if isinstance(answer, dict):
                    answer = {k: v for k, v in answer.items() if k != "ResponseMetadata"}
                out.append(("ok", answer))
        out.append(("items", sorted(client.scan(TableName="t")["Items"], key=lambda i: i["pk"]["S"])))
        return out


@contextmanager
def _as_shipped() -> Iterator[None]:
    """moto's own parse, even where a local cloud in this process installed the patch for good."""
    parser = moto_compat.surface("moto.dynamodb.comparisons:ConditionExpressionParser")
    updates = moto_compat.surface("moto.dynamodb.parsing.expressions:UpdateExpressionParser")
    current, current_make = parser.parse, vars(updates)["make"]
    if not getattr(current, "_berth_cached", False):
        yield
        return
    parser.parse = current.__wrapped__
    updates.make = classmethod(updates.make.__wrapped__.__func__)
    try:
        yield
    finally:
        parser.parse = current
        updates.make = current_make


def test_every_request_gets_the_answer_moto_as_shipped_gives() -> None:
    with _as_shipped():
        shipped = _run(STEPS)
    kinds = [row[0] for row in shipped]
    assert kinds.count("error") + kinds.count("raised") >= 8, shipped  # the steps do exercise failures
    undo = moto_dynamodb_conditions.install()
    try:
        before = {**moto_dynamodb_conditions.stats, **moto_dynamodb_conditions.update_stats()}
        cached = _run(STEPS)
        after = {**moto_dynamodb_conditions.stats, **moto_dynamodb_conditions.update_stats()}
    finally:
        undo()
    assert cached == shipped
    assert after["reused"] > before["reused"]  # the repeated expressions were not parsed again
    # a shape seen with other names is not parsed again either: three parses of the two name shapes
    assert after["updates_reused"] > before["updates_reused"]


def test_a_shape_is_parsed_once_whatever_its_names_stand_for(patched: None) -> None:
    """Berth's placement conditions name each attempt and GPU through ExpressionAttributeNames: those
    must not make every placement's condition a new entry."""
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        _table(client)
        client.put_item(TableName="t", Item={"pk": S("h"), "holds": {"M": {}}})
        before = {**moto_dynamodb_conditions.stats, **moto_dynamodb_conditions.update_stats()}
        for i in range(5):
            client.update_item(
                TableName="t",
                Key={"pk": S("h")},
                UpdateExpression="SET #h.#a = :g",
                ConditionExpression="attribute_not_exists(#h.#a)",
                ExpressionAttributeNames={"#h": "holds", "#a": f"job-{i}#1"},
                ExpressionAttributeValues={":g": S(f"GPU-{i}")},
            )
        with pytest.raises(ClientError, match="ConditionalCheckFailed"):  # job-3's hold is there
            client.update_item(
                TableName="t",
                Key={"pk": S("h")},
                UpdateExpression="SET #h.#a = :g",
                ConditionExpression="attribute_not_exists(#h.#a)",
                ExpressionAttributeNames={"#h": "holds", "#a": "job-3#1"},
                ExpressionAttributeValues={":g": S("GPU-9")},
            )
        after = {**moto_dynamodb_conditions.stats, **moto_dynamodb_conditions.update_stats()}
        holds = client.get_item(TableName="t", Key={"pk": S("h")})["Item"]["holds"]["M"]
    assert {k: v["S"] for k, v in holds.items()} == {f"job-{i}#1": f"GPU-{i}" for i in range(5)}
    assert after["parsed"] - before["parsed"] == 1
    assert after["updates_parsed"] - before["updates_parsed"] == 1


def test_a_bad_expression_is_never_kept(patched: None) -> None:
    steps = [_update("a", "#n = = :v", {":v": N(1)})] * 3
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        _table(client)
        client.put_item(TableName="t", Item={"pk": S("a"), "n": N(1)})
        raised = []
        for step in steps:
            with pytest.raises(Exception) as caught:
                step(client)
            raised.append(str(caught.value))
    assert raised == ["Bad comparison #n = ="] * 3
    assert not any("= = :v" in str(key[0]) for key in moto_dynamodb_conditions._cache)


def test_concurrent_requests_each_get_their_own_values(patched: None) -> None:
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        _table(client)
        for i in range(16):
            client.put_item(TableName="t", Item={"pk": S(f"k{i}"), "n": N(i)})
        wrong: list[str] = []

        def worker(i: int) -> None:
            mine = boto3.client("dynamodb", region_name="us-east-1")
            for round_ in range(10):
                expected = i + round_
                for guess in (expected + 1, expected):  # the wrong value must fail, the right one pass
                    try:
                        mine.update_item(
                            TableName="t",
                            Key={"pk": S(f"k{i}")},
                            UpdateExpression="SET n = n + :one",
                            ConditionExpression="n = :v",
                            ExpressionAttributeValues={":one": N(1), ":v": N(guess)},
                        )
                    except ClientError as exc:
                        if (
                            guess == expected
                            or exc.response["Error"]["Code"] != "ConditionalCheckFailedException"
                        ):
                            wrong.append(f"k{i} round {round_} guess {guess}: {exc}")
                    else:
                        if guess != expected:
                            wrong.append(f"k{i} round {round_}: {guess} passed for {expected}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = {i["pk"]["S"]: int(i["n"]["N"]) for i in client.scan(TableName="t")["Items"]}
    assert wrong == []
    assert final == {f"k{i}": i + 10 for i in range(16)}
