"""AWS adapters of the workflow's ports: Step Functions task tokens and executions, the per-host SQS
work queues, the scheduler's trigger queue, and the EventBridge bus. AWS errors become domain errors
(or a False answer where the caller may go on)."""

from __future__ import annotations

import json
import re
from functools import cached_property
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from berth.dal import aws
from berth.domain.errors import StoreUnavailable

#: Errors meaning "this token is no longer waited on": the caller goes on.
_STALE_TOKEN = {"TaskTimedOut", "InvalidToken", "TaskDoesNotExist", "ExecutionDoesNotExist"}
_QUEUE_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")
#: EventBridge's limit per PutEvents call.
PUT_EVENTS_BATCH = 10
DETAIL_TYPE = "Berth Job State Change"
EVENT_SOURCE = "berth"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class SfnTaskTokens:
    @cached_property
    def _sfn(self) -> Any:
        return aws.client("stepfunctions")

    def _call(self, what: str, **kwargs: Any) -> bool:
        try:
            getattr(self._sfn, what)(**kwargs)
        except ClientError as exc:
            if _code(exc) in _STALE_TOKEN:
                return False
            raise StoreUnavailable(f"Step Functions {what} failed: {_code(exc)}") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(f"Step Functions {what} failed: {exc}") from exc
        return True

    def succeed(self, token: str, output: dict[str, Any]) -> bool:
        return self._call("send_task_success", taskToken=token, output=json.dumps(output))

    def fail(self, token: str, error: str, cause: str) -> bool:
        return self._call("send_task_failure", taskToken=token, error=error[:256], cause=cause[:32768])

    def heartbeat(self, token: str) -> bool:
        return self._call("send_task_heartbeat", taskToken=token)


class SfnExecutions:
    def __init__(self, state_machine_arn: str) -> None:
        self.state_machine_arn = state_machine_arn

    @cached_property
    def _sfn(self) -> Any:
        return aws.client("stepfunctions")

    def start(self, job_id: str, payload: dict[str, Any]) -> None:
        try:
            self._sfn.start_execution(
                stateMachineArn=self.state_machine_arn,
                # execution names refuse ':' (an array task's id): it becomes '_'
                name=job_id.replace(":", "_"),
                input=json.dumps(payload),
            )
        except ClientError as exc:
            if _code(exc) == "ExecutionAlreadyExists":
                return  # named after the job: a second start is harmless
            raise StoreUnavailable(f"could not start the workflow of {job_id}: {_code(exc)}") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(f"could not start the workflow of {job_id}: {exc}") from exc


def host_queue_name(prefix: str, host_id: str) -> str:
    """``<prefix><host id>``: host ids use only queue-name characters (``fleet.HOST_ID_RE``), so the
    name is exactly what a host's IAM policy names through its ``berth:host`` tag."""
    if _QUEUE_NAME_RE.search(host_id) or len(prefix + host_id) > 80:
        raise ValueError(f"host id {host_id!r} cannot name a queue")
    return prefix + host_id


class SqsWorkQueues:
    """``<prefix><host_id>``: one queue per host, created when the host registers."""

    def __init__(self, prefix: str, visibility_timeout_s: int = 60) -> None:
        self.prefix = prefix
        self.visibility_timeout_s = visibility_timeout_s
        self._urls: dict[str, str] = {}

    @cached_property
    def _sqs(self) -> Any:
        return aws.client("sqs")

    def ensure(self, host_id: str) -> str:
        url = self._urls.get(host_id)
        if url is not None:
            return url
        try:
            url = self._sqs.create_queue(
                QueueName=host_queue_name(self.prefix, host_id),
                Attributes={
                    "VisibilityTimeout": str(self.visibility_timeout_s),
                    "MessageRetentionPeriod": str(4 * 24 * 3600),
                    "SqsManagedSseEnabled": "true",
                },
                tags={"berth:host": host_id},
            )["QueueUrl"]
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"could not create the work queue of host {host_id}: {exc}") from exc
        self._urls[host_id] = url
        return str(url)

    def send(self, host_id: str, body: str) -> None:
        url = self.ensure(host_id)
        try:
            self._sqs.send_message(QueueUrl=url, MessageBody=body)
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable(f"could not send work to host {host_id}: {exc}") from exc


class SqsPassTrigger:
    """A message on the scheduler's queue; the event source mapping batches them into one pass."""

    def __init__(self, queue_url: str) -> None:
        self.queue_url = queue_url

    @cached_property
    def _sqs(self) -> Any:
        return aws.client("sqs")

    def request(self, reason: str, delay_s: int = 0) -> None:
        if not self.queue_url:
            return
        try:
            self._sqs.send_message(
                QueueUrl=self.queue_url,
                MessageBody=json.dumps({"reason": reason}),
                DelaySeconds=max(0, min(900, int(delay_s))),
            )
        except (ClientError, BotoCoreError) as exc:
            # The timer runs a pass anyway; a lost poke only delays placement.
            raise StoreUnavailable(f"could not request a scheduling pass: {exc}") from exc


class EventBridgePublisher:
    def __init__(self, bus_name: str) -> None:
        self.bus_name = bus_name

    @cached_property
    def _events(self) -> Any:
        return aws.client("events")

    def publish(self, details: list[dict[str, Any]]) -> None:
        for i in range(0, len(details), PUT_EVENTS_BATCH):
            chunk = details[i : i + PUT_EVENTS_BATCH]
            entries = [
                {
                    "Source": EVENT_SOURCE,
                    "DetailType": DETAIL_TYPE,
                    "Detail": json.dumps(d),
                    "EventBusName": self.bus_name,
                    "Resources": [f"berth:job/{d['job_id']}"],
                }
                for d in chunk
            ]
            try:
                result = self._events.put_events(Entries=entries)
            except (ClientError, BotoCoreError) as exc:
                raise StoreUnavailable(f"could not publish job events: {exc}") from exc
            if result.get("FailedEntryCount"):
                raise StoreUnavailable(f"EventBridge refused {result['FailedEntryCount']} job events")
