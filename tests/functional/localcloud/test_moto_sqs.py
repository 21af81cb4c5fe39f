"""moto_sqs: SQS without walks of the whole queue keeps SQS's semantics (visibility, delay, FIFO groups,
DLQ redrive, retention, receipt handles, attribute counts)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from berth_tools.localcloud import moto_sqs


@pytest.fixture
def sqs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    undo = moto_sqs.install()
    try:
        with mock_aws():
            yield boto3.client("sqs", region_name="us-east-1")
    finally:
        undo()


def counts(sqs: Any, url: str) -> tuple[int, int, int]:
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(a["ApproximateNumberOfMessages"]),
        int(a["ApproximateNumberOfMessagesNotVisible"]),
        int(a["ApproximateNumberOfMessagesDelayed"]),
    )


def receive(sqs: Any, url: str, n: int = 10, **kw: Any) -> list[dict[str, Any]]:
    return list(
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=n, AttributeNames=["All"], **kw).get(
            "Messages", []
        )
    )


_INSTALL_UNDO = """
from moto.sqs.models import Queue, SQSBackend
from berth_tools.localcloud import moto_sqs
original = SQSBackend.receive_message
undo = moto_sqs.install()
assert SQSBackend.receive_message is not original
assert moto_sqs.install()() is None  # a second install is a no-op
undo()
assert SQSBackend.receive_message is original
assert isinstance(vars(Queue)["attributes"], property)
"""


def test_install_replaces_and_undo_restores() -> None:
    # In a fresh interpreter: a local cloud started earlier in this process keeps the patches in place.
    done = subprocess.run([sys.executable, "-c", _INSTALL_UNDO], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_visibility_timeout_hides_then_returns_a_message(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    assert counts(sqs, url) == (3, 0, 0)
    first = receive(sqs, url, 2)
    assert [m["Body"] for m in first] == ["m0", "m1"]
    assert counts(sqs, url) == (1, 2, 0)
    assert [m["Body"] for m in receive(sqs, url)] == ["m2"]
    assert receive(sqs, url) == []
    deadline = time.monotonic() + 10
    again: list[dict[str, Any]] = []
    while not again and time.monotonic() < deadline:
        time.sleep(0.2)
        again = receive(sqs, url)
    assert sorted(m["Body"] for m in again) == ["m0", "m1", "m2"]
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}


def test_delete_by_current_or_old_handle_and_twice(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a")
    sqs.send_message(QueueUrl=url, MessageBody="b")
    a, b = receive(sqs, url)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"], VisibilityTimeout=0)
    (a2,) = receive(sqs, url)
    assert a2["Body"] == "a" and a2["ReceiptHandle"] != a["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"])  # an older handle still deletes
    sqs.delete_message(QueueUrl=url, ReceiptHandle=a2["ReceiptHandle"])  # deleting again succeeds
    sqs.delete_message(QueueUrl=url, ReceiptHandle=b["ReceiptHandle"])
    assert counts(sqs, url) == (0, 0, 0)
    with pytest.raises(ClientError) as err:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert err.value.response["Error"]["Code"] == "ReceiptHandleIsInvalid"
    with pytest.raises(ClientError) as err:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle="not-a-handle", VisibilityTimeout=1)
    assert err.value.response["Error"]["Code"] == "ReceiptHandleIsInvalid"


def test_change_visibility_beyond_12_hours_is_refused(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a")
    (a,) = receive(sqs, url)
    with pytest.raises(ClientError) as err:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"], VisibilityTimeout=43201)
    assert err.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_delayed_messages_wait_and_are_counted(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
    sqs.send_message(QueueUrl=url, MessageBody="now")
    assert counts(sqs, url) == (1, 0, 1)
    assert [m["Body"] for m in receive(sqs, url)] == ["now"]
    got = receive(sqs, url, WaitTimeSeconds=5)  # long polling wakes once the delay is over
    assert [m["Body"] for m in got] == ["later"]


def test_fifo_groups_are_held_while_in_flight(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName="q.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    for body, group in [("a1", "a"), ("b1", "b"), ("a2", "a")]:
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a")  # deduplicated by content
    (first,) = receive(sqs, url, 1)
    assert first["Body"] == "a1"
    assert [m["Body"] for m in receive(sqs, url)] == ["b1"]  # group a is held by a1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert [m["Body"] for m in receive(sqs, url)] == ["a2"]
    with pytest.raises(ClientError):
        sqs.send_message(QueueUrl=url, MessageBody="x")  # MessageGroupId is required


def test_redrive_moves_a_message_to_the_dlq_after_max_receives(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName="dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(
        QueueName="q",
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):
        (m,) = receive(sqs, url)
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    assert receive(sqs, url) == []
    (moved,) = receive(sqs, dlq)
    assert moved["Body"] == "poison"
    sqs.delete_message(QueueUrl=dlq, ReceiptHandle=moved["ReceiptHandle"])
    assert counts(sqs, dlq) == (0, 0, 0)


def test_retention_drops_expired_messages_on_receive_and_send(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q", Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    for i in range(5):
        sqs.send_message(QueueUrl=url, MessageBody=f"old{i}")
    queue = next(iter(q for q in _queues() if q.name == "q"))
    for message in queue._messages[:3]:
        message.sent_timestamp -= 61_000  # three of them are past the retention period
    sqs.send_message(QueueUrl=url, MessageBody="new")
    assert len(queue._messages) == 3  # dropped from the head on send: a queue nobody reads stays bounded
    for message in queue._messages[:1]:
        message.sent_timestamp -= 61_000
    assert [m["Body"] for m in receive(sqs, url)] == ["old4", "new"]
    assert counts(sqs, url) == (0, 2, 0)


def test_purge_empties_the_queue_and_forgets_handles(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a")
    (a,) = receive(sqs, url)
    sqs.purge_queue(QueueUrl=url)
    assert counts(sqs, url) == (0, 0, 0)
    with pytest.raises(ClientError):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"])


def test_message_attributes_are_filtered_on_the_copy_only(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    attrs = {
        "Keep": {"DataType": "String", "StringValue": "1"},
        "Drop": {"DataType": "String", "StringValue": "2"},
    }
    sqs.send_message(QueueUrl=url, MessageBody="a", MessageAttributes=attrs)
    (m,) = receive(sqs, url, MessageAttributeNames=["Keep"])
    assert set(m["MessageAttributes"]) == {"Keep"}
    (m,) = receive(sqs, url, MessageAttributeNames=["All"])
    assert set(m["MessageAttributes"]) == {"Keep", "Drop"}


def _queues() -> list[Any]:
    from moto.sqs.models import sqs_backends

    return list(sqs_backends["123456789012"]["us-east-1"].queues.values())


def test_concurrent_senders_and_consumers_lose_nothing_and_get_nothing_twice(sqs: Any) -> None:
    import threading

    url = sqs.create_queue(QueueName="busy", Attributes={"VisibilityTimeout": "300"})["QueueUrl"]
    sent = [f"m{i}" for i in range(300)]
    got: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def send(part: list[str]) -> None:
        try:
            for body in part:
                sqs.send_message(QueueUrl=url, MessageBody=body)
        except BaseException as exc:
            errors.append(exc)

    def consume(stop: threading.Event) -> None:
        try:
            while not stop.is_set() or counts(sqs, url)[0]:
                for m in receive(sqs, url):
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    with lock:
                        got.append(m["Body"])
        except BaseException as exc:
            errors.append(exc)

    done = threading.Event()
    senders = [threading.Thread(target=send, args=(sent[i::3],)) for i in range(3)]
    consumers = [threading.Thread(target=consume, args=(done,)) for _ in range(3)]
    for t in senders + consumers:
        t.start()
    for t in senders:
        t.join()
    done.set()
    for t in consumers:
        t.join()
    assert not errors, errors
    assert sorted(got) == sorted(sent)  # each message once: none lost, none delivered twice
    assert counts(sqs, url) == (0, 0, 0)


def test_deleted_handles_are_remembered_but_not_forever(sqs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moto_sqs, "DELETED_HANDLES_KEPT", 3)
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    handles = []
    for i in range(5):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    for m in receive(sqs, url):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        handles.append(m["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles[-1])  # a recent one: success again
    queue = next(q for q in _queues() if q.name == "q")
    assert len(queue._berth_deleted) == 3 and not queue.deleted_messages
    with pytest.raises(ClientError):  # the oldest is forgotten: invalid, as an unknown handle
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handles[0])


def test_sqs_duplicate_delivers_the_fraction_of_received_messages_again(sqs: Any) -> None:
    """`berth local fault sqs-duplicate`: a message received is visible again at once, and the next
    receive delivers it with a new receipt handle; either handle deletes it; FIFO queues are left alone."""
    from berth_tools.localcloud import faults

    url = sqs.create_queue(QueueName="dup", Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
    fifo = sqs.create_queue(
        QueueName="dup.fifo", Attributes={"FifoQueue": "true", "VisibilityTimeout": "60"}
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="once")
    sqs.send_message(QueueUrl=fifo, MessageBody="fifo", MessageGroupId="g", MessageDeduplicationId="d")
    faults.FAULTS.apply({"kind": "sqs-duplicate", "fraction": 1, "seed": 3})
    try:
        (first,) = receive(sqs, url)
        deadline = time.monotonic() + 10
        while not (again := receive(sqs, url)):  # visible again once the clock moves on (1 ms)
            assert time.monotonic() < deadline, "the duplicate was never delivered"
        (second,) = again
        assert second["MessageId"] == first["MessageId"] and second["Body"] == "once"
        assert second["ReceiptHandle"] != first["ReceiptHandle"]
        assert int(second["Attributes"]["ApproximateReceiveCount"]) == 2
        (fifo_message,) = receive(sqs, fifo)
        assert receive(sqs, fifo) == []  # in flight: a FIFO message is not duplicated
        assert faults.FAULTS.snapshot()["sqs_duplicate"]["hits"] >= 2
    finally:
        faults.FAULTS.clear()
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])  # the older handle deletes it
    assert receive(sqs, url) == [] and counts(sqs, url) == (0, 0, 0)
    sqs.send_message(QueueUrl=url, MessageBody="after clear")
    assert len(receive(sqs, url)) == 1 and receive(sqs, url) == []  # cleared: delivered once
    assert fifo_message["Body"] == "fifo"
