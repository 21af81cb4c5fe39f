"""Micro-benchmarks of the local cloud's emulator hot paths, moto as shipped vs. with the local cloud's fixes.

    python -m berth_tools.bench.emulator_bench [sqs|events|sfn|dynamodb|all] [--output json]

Each case runs in-process on moto (``mock_aws``) through boto3, first with moto 5.2.5 as shipped, then
with the fix installed (``install()`` of its module, undone afterwards), and prints the CPU time of
the measured call (``time.process_time``, so other processes on the machine do not count) beside the
load average. CPU ms are medians of the repeats.
"""

from __future__ import annotations

import argparse
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
    with mock_aws():
        yield


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


CASES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "sqs": lambda: run_sqs([50, 200, 800]),
}


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
