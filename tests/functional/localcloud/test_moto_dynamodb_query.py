"""moto_dynamodb_query: a Query that reads only its partition answers exactly what moto's whole-table
walk answers (table and GSIs, range conditions, both directions, pages, filters, projections), also
while other threads write."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.models.table import SecondaryIndex, Table

from berth_tools.localcloud import dynamodb_isolation, moto_dynamodb_query


@pytest.fixture
def ddb(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName="jobs",
            KeySchema=[
                {"AttributeName": "tenant", "KeyType": "HASH"},
                {"AttributeName": "job", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "tenant", "AttributeType": "S"},
                {"AttributeName": "job", "AttributeType": "S"},
                {"AttributeName": "status", "AttributeType": "S"},
                {"AttributeName": "prio", "AttributeType": "N"},
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": "by_status",
                    "KeySchema": [{"AttributeName": "status", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "ALL"},
                },
                {
                    "IndexName": "by_status_prio",
                    "KeySchema": [
                        {"AttributeName": "status", "KeyType": "HASH"},
                        {"AttributeName": "prio", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                {
                    "IndexName": "by_status_include",
                    "KeySchema": [
                        {"AttributeName": "status", "KeyType": "HASH"},
                        {"AttributeName": "job", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["doc", "tags", "blob"]},
                },
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        client.create_table(
            TableName="hosts",
            KeySchema=[{"AttributeName": "host", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "host", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for i in range(120):
            item = {
                "tenant": {"S": f"t{i % 4}"},
                "job": {"S": f"j{i:04d}"},
                "n": {"N": str(i)},
            }
            if i % 7:  # some items have no status: they are not in either index
                item["status"] = {"S": ("RUNNING", "QUEUED", "COMPLETED")[i % 3]}
            if i % 5:
                item["prio"] = {"N": str(i % 6) if i % 2 else f"{i % 6}.0"}  # numbers written two ways
            if i % 3 == 1:  # projected by by_status_include (with "n", which it does not project)
                item["doc"] = {"M": {"gpus": {"N": str(i % 8)}, "hosts": {"L": [{"S": f"h{i % 5}"}]}}}
                item["tags"] = {"SS": [f"t{i % 4}", "x"]}
                item["blob"] = {"B": bytes([i, 0, 255])}
            client.put_item(TableName="jobs", Item=item)
        for h in range(5):
            client.put_item(TableName="hosts", Item={"host": {"S": f"h{h}"}, "gpus": {"N": "8"}})
        yield client


@contextlib.contextmanager
def _as_shipped() -> Iterator[None]:
    """moto's own Query and projections, even where a local cloud in this process installed the patch
    for good (so that the answers compared against are moto's, not the patch's)."""
    owners = [
        (Table, "query"),
        (SecondaryIndex, "project"),
        (Item, "project"),
    ]
    replaced = []
    for owner, name in owners:
        current = vars(owner)[name]
        if getattr(current, "_berth_narrowing", False) or getattr(current, "_berth_projection", False):
            replaced.append((owner, name, current))
            setattr(owner, name, current.__wrapped__)
    try:
        yield
    finally:
        for owner, name, current in replaced:
            setattr(owner, name, current)


QUERIES: list[dict[str, Any]] = [
    {"KeyConditionExpression": "tenant = :t", "ExpressionAttributeValues": {":t": {"S": "t1"}}},
    {"KeyConditionExpression": "tenant = :t", "ExpressionAttributeValues": {":t": {"S": "nobody"}}},
    {
        "KeyConditionExpression": "tenant = :t AND job BETWEEN :a AND :b",
        "ExpressionAttributeValues": {":t": {"S": "t2"}, ":a": {"S": "j0010"}, ":b": {"S": "j0060"}},
        "ScanIndexForward": False,
    },
    {
        "KeyConditionExpression": "tenant = :t AND begins_with(job, :p)",
        "ExpressionAttributeValues": {":t": {"S": "t3"}, ":p": {"S": "j00"}},
        "FilterExpression": "n > :n",
        "ExpressionAttributeValues_extra": {":n": {"N": "20"}},
    },
    {
        "IndexName": "by_status",
        "KeyConditionExpression": "#s = :s",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "RUNNING"}},
    },
    {
        "IndexName": "by_status_prio",
        "KeyConditionExpression": "#s = :s AND prio >= :p",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "QUEUED"}, ":p": {"N": "2"}},
        "ScanIndexForward": False,
    },
    {
        "IndexName": "by_status_prio",
        "KeyConditionExpression": "#s = :s AND prio = :p",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "COMPLETED"}, ":p": {"N": "3"}},
    },
    {
        "IndexName": "by_status",
        "KeyConditionExpression": "#s = :s",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "QUEUED"}},
        "ProjectionExpression": "job, tenant",
    },
    {
        "IndexName": "by_status_include",
        "KeyConditionExpression": "#s = :s",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "QUEUED"}},
    },
    {
        "IndexName": "by_status_include",
        "KeyConditionExpression": "#s = :s AND job > :j",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "QUEUED"}, ":j": {"S": "j0030"}},
        "FilterExpression": "attribute_exists(doc)",
        "ScanIndexForward": False,
    },
    {
        "IndexName": "by_status_include",
        "KeyConditionExpression": "#s = :s",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": "QUEUED"}},
        "ProjectionExpression": "job, doc.gpus",
    },
]


#: GetItem and Scan with projections (Item.project): top-level names, missing ones, nested paths.
GETS: list[dict[str, Any]] = [
    {
        "Key": {"tenant": {"S": "t1"}, "job": {"S": "j0001"}},
        "ProjectionExpression": "job, doc, tags, #b",
        "ExpressionAttributeNames": {"#b": "blob"},
    },
    {"Key": {"tenant": {"S": "t1"}, "job": {"S": "j0001"}}, "ProjectionExpression": "nothing, n"},
    {
        "Key": {"tenant": {"S": "t1"}, "job": {"S": "j0001"}},
        "ProjectionExpression": "doc.hosts[0], #s",
        "ExpressionAttributeNames": {"#s": "status"},
    },
]
SCANS: list[dict[str, Any]] = [
    {"ProjectionExpression": "job, prio, #b", "ExpressionAttributeNames": {"#b": "blob"}},
    {"ProjectionExpression": "job, doc.gpus", "Limit": 9},
]


def _canonical(value: Any) -> Any:
    """An answer with each set's members sorted (DynamoDB sets are unordered, and moto's own projection
    rebuilds them through a Python set, whose order changes from one process to the next)."""
    if isinstance(value, dict):
        return {
            k: sorted(v) if k in ("SS", "NS", "BS") and isinstance(v, list) else _canonical(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_canonical(v) for v in value)
    return value


def _pages(client: Any, query: dict[str, Any], limit: int | None, table: str = "jobs") -> list[Any]:
    args = {k: v for k, v in query.items() if k != "ExpressionAttributeValues_extra"}
    args["ExpressionAttributeValues"] = {
        **query["ExpressionAttributeValues"],
        **query.get("ExpressionAttributeValues_extra", {}),
    }
    if limit:
        args["Limit"] = limit
    pages, start = [], None
    while True:
        answer = client.query(TableName=table, **args, **({"ExclusiveStartKey": start} if start else {}))
        pages.append((_canonical(answer["Items"]), answer["Count"], answer.get("LastEvaluatedKey")))
        start = answer.get("LastEvaluatedKey")
        if not start:
            return pages
        assert len(pages) < 200


@pytest.mark.parametrize("isolated", [False, True], ids=["writes-not-counted", "candidates-kept"])
def test_every_query_answers_as_moto_does(ddb: Any, isolated: bool) -> None:
    """Without ``dynamodb_isolation`` no write is counted, so each page narrows afresh; with it, an
    index's candidates are kept between pages and a forward page starts by bisection."""
    with _as_shipped():
        expected = {
            (i, limit): _pages(ddb, q, limit) for i, q in enumerate(QUERIES) for limit in (None, 1, 7)
        }
        expected["hosts"] = _pages(
            ddb,
            {"KeyConditionExpression": "host = :h", "ExpressionAttributeValues": {":h": {"S": "h3"}}},
            None,
            "hosts",
        )
        for args in GETS:
            expected[("get", str(args))] = _canonical(ddb.get_item(TableName="jobs", **args).get("Item"))
        for args in SCANS:
            expected[("scan", str(args))] = _canonical(ddb.scan(TableName="jobs", **args)["Items"])
    undo_isolation = dynamodb_isolation.install() if isolated else (lambda: None)
    if not isolated and dynamodb_isolation.generation() is not None:
        pytest.skip("a local cloud earlier in this process installed the isolation for good")
    undo = moto_dynamodb_query.install()
    kept, sliced = moto_dynamodb_query.stats["kept"], moto_dynamodb_query.stats["sliced"]
    grouped = moto_dynamodb_query.stats["grouped"]
    try:
        before = moto_dynamodb_query.stats["narrowed"]
        for (i, limit), pages in [(k, v) for k, v in expected.items() if isinstance(k[0], int)]:
            assert _pages(ddb, QUERIES[i], limit) == pages, (QUERIES[i], limit)
        hosts = {"KeyConditionExpression": "host = :h", "ExpressionAttributeValues": {":h": {"S": "h3"}}}
        assert _pages(ddb, hosts, None, "hosts") == expected["hosts"]
        assert moto_dynamodb_query.stats["narrowed"] > before
        assert moto_dynamodb_query.stats["projected"] > 0  # the INCLUDE and KEYS_ONLY queries
        for args in GETS:
            assert (
                _canonical(ddb.get_item(TableName="jobs", **args).get("Item")) == expected[("get", str(args))]
            )
        for args in SCANS:
            assert _canonical(ddb.scan(TableName="jobs", **args)["Items"]) == expected[("scan", str(args))]
        assert sum(len(items) for items, _, _ in expected[(4, None)]) > 10  # the GSI query found something
        if isolated:
            assert moto_dynamodb_query.stats["kept"] > kept and moto_dynamodb_query.stats["sliced"] > sliced
            assert moto_dynamodb_query.stats["grouped"] > grouped  # other partitions, one walk
        else:
            assert moto_dynamodb_query.stats["kept"] == kept
            assert moto_dynamodb_query.stats["grouped"] == grouped
    finally:
        undo()
        undo_isolation()


def test_an_index_entry_shares_nothing_with_the_stored_item(ddb: Any) -> None:
    """The projected answer is a copy: the stored item is unchanged, and reads after a write see it."""
    undo = moto_dynamodb_query.install()
    try:
        query = QUERIES[8]
        first = _pages(ddb, query, None)
        ddb.update_item(
            TableName="jobs",
            Key={"tenant": {"S": "t1"}, "job": {"S": "j0001"}},
            UpdateExpression="SET doc.gpus = :g ADD tags :t",
            ExpressionAttributeValues={":g": {"N": "99"}, ":t": {"SS": ["new"]}},
        )
        after = {i["job"]["S"]: i for items, _, _ in _pages(ddb, query, None) for i in items}
        before = {i["job"]["S"]: i for items, _, _ in first for i in items}
        assert before["j0001"]["doc"]["M"]["gpus"] == {"N": "1"}
        assert after["j0001"]["doc"]["M"]["gpus"] == {"N": "99"}
        assert set(after["j0001"]["tags"]["SS"]) == {"t1", "x", "new"}
        assert "n" not in after["j0001"] and after["j0001"]["blob"] == {"B": bytes([1, 0, 255])}
        assert {k: v for k, v in after.items() if k != "j0001"} == {
            k: v for k, v in before.items() if k != "j0001"
        }
        stored = ddb.get_item(TableName="jobs", Key={"tenant": {"S": "t1"}, "job": {"S": "j0001"}})["Item"]
        assert stored["n"] == {"N": "1"} and stored["doc"]["M"]["gpus"] == {"N": "99"}
    finally:
        undo()


def test_a_scan_in_another_thread_sees_the_whole_table_while_a_query_runs(ddb: Any) -> None:
    undo = moto_dynamodb_query.install()
    try:
        scanned: list[int] = []
        workers: list[threading.Thread] = []
        original = Table.all_items

        def slow_all_items(self: Any) -> list[Any]:  # a scan starts while the query is narrowed
            if threading.current_thread() is threading.main_thread() and not workers:
                worker = threading.Thread(target=lambda: scanned.append(ddb.scan(TableName="jobs")["Count"]))
                workers.append(worker)
                worker.start()
                # Where dynamodb_isolation is installed (a local cloud ran earlier in this process) the
                # scan waits for the query's lock: then it runs after it, which must see the table too.
                worker.join(timeout=2)
            return list(original(self))

        Table.all_items = slow_all_items  # type: ignore[method-assign]
        try:
            q = QUERIES[0]
            ddb.query(
                TableName="jobs",
                KeyConditionExpression=q["KeyConditionExpression"],
                ExpressionAttributeValues=q["ExpressionAttributeValues"],
            )
        finally:
            Table.all_items = original  # type: ignore[method-assign]
        for worker in workers:
            worker.join(timeout=60)
        assert scanned == [120]
    finally:
        undo()


def test_queries_stay_correct_while_other_threads_write(ddb: Any) -> None:
    undo_isolation = dynamodb_isolation.install()
    undo = moto_dynamodb_query.install()
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        i = 0
        while not stop.is_set():
            key = {"tenant": {"S": "t9"}, "job": {"S": f"w{w}-{i % 50:03d}"}}
            try:
                if i % 3 == 2:
                    ddb.delete_item(TableName="jobs", Key=key)
                else:
                    ddb.put_item(
                        TableName="jobs", Item={**key, "status": {"S": "RUNNING"}, "n": {"N": str(i)}}
                    )
                    ddb.update_item(
                        TableName="jobs",
                        Key=key,
                        UpdateExpression="SET #s = :s",
                        ExpressionAttributeNames={"#s": "status"},
                        ExpressionAttributeValues={":s": {"S": "QUEUED"}},
                    )
            except BaseException as exc:
                errors.append(exc)
                return
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(40):
            for q in (QUERIES[0], QUERIES[4]):
                for items, _, _ in _pages(ddb, q, 9):
                    for item in items:  # what a page holds matches its key condition, whatever is written
                        if "IndexName" in q:
                            assert item["status"] == {"S": "RUNNING"}
                        else:
                            assert item["tenant"] == {"S": "t1"}
    finally:
        stop.set()
        for t in threads:
            t.join()
        undo()
        undo_isolation()
    assert not errors, errors
    assert _pages(ddb, QUERIES[0], None) == _pages(ddb, QUERIES[0], None)  # still answers after the writes


def _index_pages(client: Any, status: str, limit: int) -> list[str]:
    """The jobs of ``status`` on by_status_include, page by page (a queue-shaped query: no range
    condition, forward, a limit)."""
    query = {
        "IndexName": "by_status_include",
        "KeyConditionExpression": "#s = :s",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": status}},
    }
    return [i["job"]["S"] for items, _, _ in _pages(client, query, limit) for i in items]


WRITES: list[tuple[str, Any]] = [
    ("put", lambda c: c.put_item(TableName="jobs", Item={**KEY, "status": {"S": "QUEUED"}, "n": {"N": "1"}})),
    (
        "update",
        lambda c: c.update_item(
            TableName="jobs",
            Key=KEY,
            UpdateExpression="SET #s = :s",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":s": {"S": "RUNNING"}},
        ),
    ),
    ("delete", lambda c: c.delete_item(TableName="jobs", Key=KEY)),
    (
        "transaction",
        lambda c: c.transact_write_items(
            TransactItems=[{"Put": {"TableName": "jobs", "Item": {**KEY, "status": {"S": "QUEUED"}}}}]
        ),
    ),
    (
        "batch",
        lambda c: c.batch_write_item(RequestItems={"jobs": [{"DeleteRequest": {"Key": KEY}}]}),
    ),
]
KEY = {"tenant": {"S": "t0"}, "job": {"S": "j0000-new"}}


def test_kept_candidates_follow_every_kind_of_write(ddb: Any) -> None:
    """Each write (put, update, delete, transaction, batch) ends the kept candidates: the next page
    and the next query see it, exactly as moto's own walk does."""
    undo_isolation = dynamodb_isolation.install()
    undo = moto_dynamodb_query.install()
    try:
        for name, write in WRITES:
            first = _index_pages(ddb, "QUEUED", 3)
            kept = moto_dynamodb_query.stats["kept"]
            assert _index_pages(ddb, "QUEUED", 3) == first  # kept, page after page
            assert moto_dynamodb_query.stats["kept"] > kept
            write(ddb)
            grouped = moto_dynamodb_query.stats["grouped"]
            queued = _index_pages(ddb, "QUEUED", 3)  # the first index query since the write walks
            running = _index_pages(ddb, "RUNNING", 5)  # the second groups the table in one walk
            assert moto_dynamodb_query.stats["grouped"] > grouped, name
            stored = ddb.get_item(TableName="jobs", Key=KEY).get("Item")
            status = None if stored is None else stored["status"]["S"]
            assert ("j0000-new" in queued) is (status == "QUEUED"), name
            assert ("j0000-new" in running) is (status == "RUNNING"), name
            undo()
            try:  # moto's own walk agrees
                assert _index_pages(ddb, "QUEUED", 3) == queued, name
                assert _index_pages(ddb, "RUNNING", 5) == running, name
            finally:
                undo = moto_dynamodb_query.install()
    finally:
        undo()
        undo_isolation()


def test_a_write_between_two_pages_shows_on_the_next_page(ddb: Any) -> None:
    undo_isolation = dynamodb_isolation.install()
    undo = moto_dynamodb_query.install()
    try:
        args = {
            "TableName": "jobs",
            "IndexName": "by_status_include",
            "KeyConditionExpression": "#s = :s",
            "ExpressionAttributeNames": {"#s": "status"},
            "ExpressionAttributeValues": {":s": {"S": "QUEUED"}},
            "Limit": 4,
        }
        page = ddb.query(**args)
        last = page["LastEvaluatedKey"]["job"]["S"]
        late = {"tenant": {"S": "t0"}, "job": {"S": last + "-late"}}  # sorts right after the page
        ddb.put_item(TableName="jobs", Item={**late, "status": {"S": "QUEUED"}})
        following = ddb.query(**args, ExclusiveStartKey=page["LastEvaluatedKey"])
        assert following["Items"][0]["job"]["S"] == last + "-late"
    finally:
        undo()
        undo_isolation()
