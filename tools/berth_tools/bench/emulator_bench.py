"""Micro-benchmarks of the local cloud's emulator hot paths, moto as shipped vs. with the local cloud's fixes.

    python -m berth_tools.bench.emulator_bench [sqs|events|sfn|dynamodb|queue|conditions|all] [--output json]

Each case runs in-process on moto (``mock_aws``) through boto3, first with moto 5.2.5 as shipped, then
with the fix installed (``install()`` of its module, undone afterwards), and prints the CPU time of
the measured call (``time.process_time``, so other processes on the machine do not count) beside the
load average. CPU ms are medians of the repeats.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3

REGION = "us-east-1"


def _cpu_ms(fn: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        samples.append((time.process_time() - t0) * 1000)
    return round(statistics.median(samples), 2)


@contextmanager
def _aws() -> Iterator[None]:
    from moto import mock_aws

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield


@contextmanager
def _patched(install: Callable[[], Callable[[], None]]) -> Iterator[None]:
    undo = install()
    try:
        yield
    finally:
        undo()


def _before_after(
    case: Callable[[], dict[str, float]], install: Callable[[], Callable[[], None]]
) -> dict[str, Any]:
    before = case()
    with _patched(install):
        after = case()
    return {"before": before, "after": after}


def sqs_case(backlog: int, repeats: int = 5) -> dict[str, float]:
    """CPU ms of a send, and of a receive of 10 (+ their delete), at `backlog` messages in the queue."""
    with _aws():
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="bench")["QueueUrl"]
        for start in range(0, backlog, 10):
            sqs.send_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(min(10, backlog - start))
                ],
            )
        send = _cpu_ms(lambda: sqs.send_message(QueueUrl=url, MessageBody="x"), repeats)

        def receive_and_delete() -> None:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])[
                "Messages"
            ]
            # put the backlog back as it was: the next repeat sees the same queue
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
            )
            sqs.send_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "r"} for i in range(len(got))]
            )

        receive = _cpu_ms(
            lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]),
            1,
        )
        cycle = _cpu_ms(receive_and_delete, repeats)
        attrs = _cpu_ms(lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]), repeats)
    return {
        "send_ms": send,
        "receive10_ms": receive,
        "receive_delete_resend_ms": cycle,
        "get_attributes_ms": attrs,
    }


def run_sqs(backlogs: list[int]) -> list[dict[str, Any]]:
    from berth_tools.localcloud import moto_sqs

    rows = []
    for backlog in backlogs:
        before = sqs_case(backlog)
        undo = moto_sqs.install()
        try:
            after = sqs_case(backlog)
        finally:
            undo()
        rows.append({"case": "sqs", "backlog": backlog, "before": before, "after": after})
    return rows


def events_case(repeats: int = 5) -> dict[str, float]:
    """CPU ms of a PutEvents of 10 events that one rule routes to an SQS target (Berth's example rule)."""
    with _aws():
        events = boto3.client("events", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="events")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="r", EventPattern=json.dumps({"detail-type": ["Berth Job State Change"]}))
        events.put_targets(Rule="r", Targets=[{"Id": "q", "Arn": arn}])
        entries = [
            {
                "Source": "berth",
                "DetailType": "Berth Job State Change",
                "Detail": json.dumps({"job_id": str(i)}),
            }
            for i in range(10)
        ]
        put = _cpu_ms(lambda: events.put_events(Entries=entries), repeats)
    return {"put_events10_ms": put}


#: A workflow-sized state machine: a chain of Pass and Choice states (the ASL is parsed per execution).
def _definition(states: int = 30) -> str:
    chain: dict[str, Any] = {}
    for i in range(states):
        nxt = f"S{i + 1}" if i + 1 < states else "Done"
        chain[f"S{i}"] = {
            "Type": "Choice",
            "Choices": [{"Variable": "$.n", "NumericGreaterThan": 1000, "Next": "Done"}],
            "Default": f"P{i}",
        }
        chain[f"P{i}"] = {"Type": "Pass", "Result": {"i": i}, "ResultPath": "$.last", "Next": nxt}
    chain["Done"] = {"Type": "Succeed"}
    return json.dumps({"StartAt": "S0", "States": chain})


def sfn_case(repeats: int = 5) -> dict[str, float]:
    """CPU ms of starting an execution of a 61-state machine and running it to SUCCEEDED."""
    with _aws():
        sfn = boto3.client("stepfunctions", region_name=REGION)
        machine = sfn.create_state_machine(
            name="m", definition=_definition(), roleArn="arn:aws:iam::123456789012:role/sfn"
        )["stateMachineArn"]

        counter = itertools.count()

        def run() -> None:
            name = f"e{next(counter)}"  # moto collides executions started without a name
            execution = sfn.start_execution(stateMachineArn=machine, name=name, input='{"n": 1}')[
                "executionArn"
            ]
            while sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
                time.sleep(0.01)

        execution = _cpu_ms(run, repeats)
    return {"execution_ms": execution}


def dynamodb_case(items: int, repeats: int = 5) -> dict[str, float]:
    """CPU ms of a Query page (Limit 25) of one partition of the table and of a GSI, at `items` items
    spread over 50 partitions (a jobs table: hash tenant, range job; GSI by status)."""
    with _aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(
            TableName="t",
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk", "status")],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": "by_status",
                    "KeySchema": [
                        {"AttributeName": "status", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                }
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        for start in range(0, items, 25):
            ddb.batch_write_item(
                RequestItems={
                    "t": [
                        {
                            "PutRequest": {
                                "Item": {
                                    "pk": {"S": f"p{i % 50}"},
                                    "sk": {"S": f"{i:08d}"},
                                    "status": {"S": "RUNNING" if i % 10 == 0 else "COMPLETED"},
                                    "pad": {"S": "x" * 200},
                                }
                            }
                        }
                        for i in range(start, min(items, start + 25))
                    ]
                }
            )
        table = _cpu_ms(
            lambda: ddb.query(
                TableName="t",
                KeyConditionExpression="pk = :p",
                ExpressionAttributeValues={":p": {"S": "p7"}},
                Limit=25,
            ),
            repeats,
        )
        gsi = _cpu_ms(
            lambda: ddb.query(
                TableName="t",
                IndexName="by_status",
                KeyConditionExpression="#s = :s",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":s": {"S": "RUNNING"}},
                Limit=25,
            ),
            repeats,
        )
    return {"query_table_page_ms": table, "query_gsi_page_ms": gsi}


def queue_page_case(
    items: int, repeats: int = 5, every: int = 10, whole_partition: bool = False
) -> dict[str, float]:
    """CPU ms of one page of 1,000 entries of a sparse INCLUDE GSI read with a ProjectionExpression of
    top-level names (the scheduler's queue index: ``queue_pk``, ``queue_sk``, three projected
    attributes), at ``items`` items of about 2 KB, one in ``every`` of them queued.
    ``whole_partition``: instead, CPU ms of reading every queued entry, 1,000 a page (a deep tenant's
    queue as a pass reads it)."""
    with _aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        ddb.create_table(
            TableName="q",
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[
                {"AttributeName": n, "AttributeType": "S"} for n in ("job_id", "queue_pk", "queue_sk")
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": "by_queue",
                    "KeySchema": [
                        {"AttributeName": "queue_pk", "KeyType": "HASH"},
                        {"AttributeName": "queue_sk", "KeyType": "RANGE"},
                    ],
                    "Projection": {
                        "ProjectionType": "INCLUDE",
                        "NonKeyAttributes": ["version", "reason", "entry"],
                    },
                }
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        for start in range(0, items, 25):
            rows: list[Any] = []
            for i in range(start, min(items, start + 25)):
                item: dict[str, Any] = {
                    "job_id": {"S": f"j{i:08d}"},
                    "version": {"N": "1"},
                    "reason": {"S": "waiting for placement"},
                    "entry": {"S": "e" * 250},
                    "spec": {"M": {f"k{k}": {"S": "x" * 40} for k in range(40)}},
                }
                if i % every == 0:
                    item["queue_pk"], item["queue_sk"] = {"S": "t#0"}, {"S": f"1#{i:08d}"}
                rows.append({"PutRequest": {"Item": item}})
            ddb.batch_write_item(RequestItems={"q": rows})
        if whole_partition:

            def every_page() -> None:
                start: dict[str, Any] | None = None
                while True:
                    args: dict[str, Any] = {
                        "TableName": "q",
                        "IndexName": "by_queue",
                        "KeyConditionExpression": "queue_pk = :p",
                        "ExpressionAttributeValues": {":p": {"S": "t#0"}},
                        "ProjectionExpression": "job_id, queue_pk, queue_sk, version, reason, entry",
                        "Limit": 1000,
                    }
                    if start:
                        args["ExclusiveStartKey"] = start
                    answer = ddb.query(**args)
                    start = answer.get("LastEvaluatedKey")
                    if not start:
                        return

            return {"queue_pages_ms": _cpu_ms(every_page, repeats)}
        page = _cpu_ms(
            lambda: ddb.query(
                TableName="q",
                IndexName="by_queue",
                KeyConditionExpression="queue_pk = :p",
                ExpressionAttributeValues={":p": {"S": "t#0"}},
                ProjectionExpression="job_id, queue_pk, queue_sk, version, reason, entry",
                Limit=1000,
            ),
            repeats,
        )
    return {"queue_page_ms": page}


def conditions_case(repeats: int = 20) -> dict[str, float]:
    """CPU ms of one TransactWriteItems shaped like a scheduling pass's placements on one host: the
    host's GPU holds under a condition naming each GPU, three queued jobs moved on under a status and
    version condition, three events put if absent (each round on fresh keys)."""
    with _aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        for name in ("hosts", "jobs", "events"):
            ddb.create_table(
                TableName=name,
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
        rounds = itertools.count()

        def one() -> None:
            r = next(rounds)
            gpus = {f"#g{i}": f"GPU-{r}-{i}" for i in range(3)}
            ddb.put_item(TableName="hosts", Item={"pk": {"S": f"h{r}"}, "v": {"N": "1"}, "holds": {"M": {}}})
            for j in range(3):
                ddb.put_item(
                    TableName="jobs",
                    Item={"pk": {"S": f"j{r}-{j}"}, "status": {"S": "QUEUED"}, "version": {"N": "4"}},
                )
            host: Any = {
                "Update": {
                    "TableName": "hosts",
                    "Key": {"pk": {"S": f"h{r}"}},
                    "UpdateExpression": "SET #v = #v + :one, " + ", ".join(f"#h.{g} = :job" for g in gpus),
                    "ConditionExpression": "attribute_exists(pk) AND #v = :hv AND "
                    + " AND ".join(f"attribute_not_exists(#h.{g})" for g in gpus),
                    "ExpressionAttributeNames": {"#v": "v", "#h": "holds", **gpus},
                    "ExpressionAttributeValues": {
                        ":one": {"N": "1"},
                        ":hv": {"N": "1"},
                        ":job": {"S": f"j{r}"},
                    },
                }
            }
            jobs: list[Any] = [
                {
                    "Update": {
                        "TableName": "jobs",
                        "Key": {"pk": {"S": f"j{r}-{j}"}},
                        "UpdateExpression": "SET #s = :starting, #ver = #ver + :one",
                        "ConditionExpression": "#s IN (:queued, :waiting) AND #ver = :ver"
                        " AND attribute_not_exists(#p)",
                        "ExpressionAttributeNames": {"#s": "status", "#ver": "version", "#p": "placement"},
                        "ExpressionAttributeValues": {
                            ":starting": {"S": "STARTING"},
                            ":queued": {"S": "QUEUED"},
                            ":waiting": {"S": "WAITING"},
                            ":ver": {"N": "4"},
                            ":one": {"N": "1"},
                        },
                    }
                }
                for j in range(3)
            ]
            events: list[Any] = [
                {
                    "Put": {
                        "TableName": "events",
                        "Item": {"pk": {"S": f"e{r}-{j}"}, "kind": {"S": "PLACED"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
                for j in range(3)
            ]
            ddb.transact_write_items(TransactItems=[host, *jobs, *events])

        one()  # the first round parses every expression: not a repeat
        tx = _cpu_ms(one, repeats)
    return {"placement_transaction_ms": tx}


CASES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "sqs": lambda: run_sqs([50, 200, 800]),
    "events": lambda: [{"case": "events", **_before_after(events_case, _install("moto_events"))}],
    "sfn": lambda: [{"case": "sfn", **_before_after(sfn_case, _install("moto_asl"))}],
    "dynamodb": lambda: [
        {
            "case": "dynamodb",
            "items": n,
            **_before_after(functools.partial(dynamodb_case, n), _install("moto_dynamodb_query")),
        }
        for n in (1000, 5000)
    ],
    "queue": lambda: [{"case": "queue", "items": 10_000, **_queue_patches(10_000)}],
    "queue-pages": lambda: [{"case": "queue-pages", "items": 50_000, "queued": 10_000, **_queue_pages()}],
    "conditions": lambda: [
        {"case": "conditions", **_before_after(conditions_case, _install("moto_dynamodb_conditions"))}
    ],
}


def _install(module: str) -> Callable[[], Callable[[], None]]:
    import importlib

    return lambda: importlib.import_module(f"berth_tools.localcloud.{module}").install()


def _queue_patches(items: int) -> dict[str, Any]:
    """The queue page as shipped, with each of the two patches alone, and with both (they compound: each
    removes half of what the other leaves)."""
    case = functools.partial(queue_page_case, items)
    out: dict[str, Any] = {"moto": case()}
    for name, modules in (
        ("moto_dynamodb_query", ["moto_dynamodb_query"]),
        ("moto_dynamodb_json", ["moto_dynamodb_json"]),
        ("both", ["moto_dynamodb_query", "moto_dynamodb_json"]),
    ):
        undos = [_install(m)() for m in modules]
        try:
            out[name] = case()
        finally:
            for undo in reversed(undos):
                undo()
    return out


def _queue_pages() -> dict[str, Any]:
    """A deep partition read page by page with both query patches, each page narrowed afresh (no
    write counting: as before candidates were kept) and with ``dynamodb_isolation`` counting writes
    (the local cloud's setting: candidates kept between pages, each page found by bisection)."""
    case = functools.partial(queue_page_case, 50_000, 3, 5, True)
    undos = [_install(m)() for m in ("moto_dynamodb_query", "moto_dynamodb_json")]
    try:
        out: dict[str, Any] = {"narrowed_per_page": case()}
        undo_isolation = _install("dynamodb_isolation")()
        try:
            out["kept"] = case()
        finally:
            undo_isolation()
    finally:
        for undo in reversed(undos):
            undo()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", default="all", choices=["all", *CASES])
    args = parser.parse_args(argv)
    names = list(CASES) if args.case == "all" else [args.case]
    load_before = os.getloadavg()
    rows = [row for name in names for row in CASES[name]()]
    print(
        json.dumps(
            {"results": rows, "load_avg_before": load_before, "load_avg_after": os.getloadavg()}, indent=1
        )
    )


if __name__ == "__main__":
    main()
