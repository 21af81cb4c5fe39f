"""Handlers and adapters against moto (in-process), with the tables the CDK app defines."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.client
import pytest
from moto import mock_aws

EVENTS = Path(__file__).resolve().parents[2] / "events"
ACCOUNT = "123456789012"
TABLES = {
    "BERTH_JOBS_TABLE": "berth-jobs",
    "BERTH_JOB_EVENTS_TABLE": "berth-job-events",
    "BERTH_TENANTS_TABLE": "berth-tenants",
    "BERTH_IDEMPOTENCY_TABLE": "berth-idempotency",
    "BERTH_HOSTS_TABLE": "berth-hosts",
    "BERTH_JOB_METRICS_TABLE": "berth-job-metrics",
    "BERTH_USAGE_TABLE": "berth-usage",
}
BUCKETS = {"BERTH_ARTIFACTS_BUCKET": "berth-artifacts", "BERTH_DATA_BUCKET": "berth-data"}


def _s(name: str) -> dict[str, str]:
    return {"AttributeName": name, "AttributeType": "S"}


def create_tables(ddb: Any) -> None:
    """The key schemas of infra/berth_infra (tests/infra asserts the template has the same)."""
    pay = {"BillingMode": "PAY_PER_REQUEST"}

    def index(name: str, hk: str, rk: str, projection: dict[str, Any]) -> dict[str, Any]:
        return {
            "IndexName": name,
            "KeySchema": [
                {"AttributeName": hk, "KeyType": "HASH"},
                {"AttributeName": rk, "KeyType": "RANGE"},
            ],
            "Projection": projection,
        }

    keys_only = {"ProjectionType": "KEYS_ONLY"}
    gsi = [
        index("by_tenant", "tenant", "created_key", keys_only),
        index("by_tenant_status", "tenant_status", "created_key", keys_only),
        index(
            "by_queue",
            "queue_pk",
            "queue_sk",
            {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["version", "reason", "queue_entry"]},
        ),
        index("by_placed", "placed_status", "created_key", {"ProjectionType": "ALL"}),
    ]
    ddb.create_table(
        TableName=TABLES["BERTH_JOBS_TABLE"],
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        AttributeDefinitions=[
            _s("job_id"),
            _s("tenant"),
            _s("tenant_status"),
            _s("created_key"),
            _s("queue_pk"),
            _s("queue_sk"),
            _s("placed_status"),
        ],
        GlobalSecondaryIndexes=gsi,
        **pay,
    )
    ddb.create_table(
        TableName=TABLES["BERTH_JOB_EVENTS_TABLE"],
        KeySchema=[
            {"AttributeName": "job_id", "KeyType": "HASH"},
            {"AttributeName": "seq", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[_s("job_id"), {"AttributeName": "seq", "AttributeType": "N"}],
        **pay,
    )
    ddb.create_table(
        TableName=TABLES["BERTH_TENANTS_TABLE"],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[_s("pk"), _s("directory")],
        GlobalSecondaryIndexes=[index("by_directory", "directory", "pk", keys_only)],
        **pay,
    )
    ddb.create_table(
        TableName=TABLES["BERTH_HOSTS_TABLE"],
        KeySchema=[{"AttributeName": "host_id", "KeyType": "HASH"}],
        AttributeDefinitions=[_s("host_id")],
        **pay,
    )
    ddb.create_table(
        TableName=TABLES["BERTH_JOB_METRICS_TABLE"],
        KeySchema=[
            {"AttributeName": "job_id", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[_s("job_id"), _s("sk")],
        **pay,
    )
    ddb.create_table(
        TableName=TABLES["BERTH_USAGE_TABLE"],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[_s("pk"), _s("sk")],
        **pay,
    )
    ddb.create_table(
        TableName=TABLES["BERTH_IDEMPOTENCY_TABLE"],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[_s("id")],
        **pay,
    )


def cold_start() -> None:
    """Like a fresh Lambda sandbox: drop what the handlers built from the environment (each factory is
    cached per process, as on Lambda) and the adapters' SDK session. Call it after changing the
    environment a handler reads."""
    import sys

    for name, module in list(sys.modules.items()):
        if module is not None and (name.startswith("berth.handlers") or name == "berth.dal.aws"):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "POWERTOOLS_SERVICE_NAME": "berth-api",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "POWERTOOLS_METRICS_NAMESPACE": "Berth",
        # Tests that are not about the rate limit must never meet it (tests/functional/test_security.py).
        "BERTH_RATE_LIMIT_REQUESTS": "1000000",
        **TABLES,
        **BUCKETS,
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    cold_start()
    with mock_aws():
        create_tables(boto3.client("dynamodb", region_name="us-east-1"))
        s3 = boto3.client("s3", region_name="us-east-1")
        for bucket in BUCKETS.values():
            s3.create_bucket(Bucket=bucket)
        yield


def arn(user: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:user/{user}"


def unique_id(user: str) -> str:
    """The IAM user's unique id (identity.user), as AWS makes them: AIDA + 17 characters."""
    return f"AIDA{user.upper()}".ljust(21, "7")


@pytest.fixture
def seeded(aws: None) -> None:
    from berth.dal.tenants import DynamoTenantRepository

    repo = DynamoTenantRepository(TABLES["BERTH_TENANTS_TABLE"])
    repo.put_member(arn("alice"), "vision", "member", unique_id("alice"))
    repo.put_member(arn("bob"), "nlp", "member", unique_id("bob"))
    repo.put_member(arn("admin"), "platform", "admin", unique_id("admin"))


class FakeContext:
    function_name = "berth-api"
    memory_limit_in_mb = 512
    invoked_function_arn = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:berth-api"
    aws_request_id = "req-1"
    log_group_name = "/aws/lambda/berth-api"
    log_stream_name = "stream"

    def get_remaining_time_in_millis(self) -> int:
        return 29_000


Invoke = Callable[..., tuple[int, Any]]


@pytest.fixture
def api(seeded: None) -> Invoke:
    """Call the API Lambda with a proxy event built from events/apigw_submit_job.json."""
    from berth.handlers import api as api_module

    cold_start()
    base = json.loads((EVENTS / "apigw_submit_job.json").read_text())

    def invoke(
        method: str,
        path: str,
        *,
        user: str = "alice",
        body: Any = None,
        raw_body: str | None = None,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        identity: dict[str, Any] | None = None,
        full: bool = False,
        raw: bool = False,
    ) -> tuple[int, Any]:
        event = copy.deepcopy(base)
        event["httpMethod"] = method
        event["path"] = path
        event["resource"] = path
        event["requestContext"]["httpMethod"] = method
        event["requestContext"]["identity"]["userArn"] = arn(user) if user else None
        event["requestContext"]["identity"]["user"] = unique_id(user) if user else None
        event["requestContext"]["identity"]["caller"] = unique_id(user) if user else None
        event["requestContext"]["identity"].update(identity or {})
        event["queryStringParameters"] = query
        event["multiValueQueryStringParameters"] = {k: [v] for k, v in query.items()} if query else None
        event["headers"] = {**event["headers"], **(headers or {})}
        event["multiValueHeaders"] = {k: [v] for k, v in event["headers"].items()}
        event["body"] = raw_body if raw_body is not None else (None if body is None else json.dumps(body))
        resp = api_module.lambda_handler(event, FakeContext())  # type: ignore[arg-type]
        if raw:  # the proxy result itself, as Lambda returns it (for tests about its size)
            return resp["statusCode"], resp
        body = json.loads(resp["body"]) if resp.get("body") else None
        if not full:
            return resp["statusCode"], body
        # full=True: the headers too, for tests about them (Retry-After).
        head = {k: v[-1] for k, v in (resp.get("multiValueHeaders") or {}).items()}
        return resp["statusCode"], {"headers": {**head, **(resp.get("headers") or {})}, "body": body}

    return invoke


@pytest.fixture
def spec() -> dict[str, Any]:
    return {
        "name": "resnet50",
        "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "command": ["python", "train.py", "--epochs", "10"],
        "resources": {"gpu_type": "V100", "gpus": 4},
    }


os.environ.setdefault("POWERTOOLS_DEV", "false")


class Calls:
    """Every AWS call made through botocore (pynamodb's and Powertools' clients alike): its operation
    and the first value of its item key, if any (the ``calls`` fixture records them)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def record(self, operation: str, params: dict[str, Any]) -> None:
        key = params.get("Key") or {}
        first = next(iter(key.values()), {}) if isinstance(key, dict) else {}
        with self.lock:
            self.log.append((operation, str(first.get("S", "")) if isinstance(first, dict) else ""))

    def clear(self) -> None:
        self.log.clear()

    def ops(self) -> Counter[str]:
        return Counter(op for op, _ in self.log)

    def operations(self) -> list[str]:
        """The operations in the order they were called."""
        return [op for op, _ in self.log]

    def keys(self, operation: str) -> list[str]:
        return [k for op, k in self.log if op == operation]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    seen = Calls()
    make = botocore.client.BaseClient._make_api_call

    def counted(self: Any, operation: str, params: dict[str, Any]) -> Any:
        seen.record(operation, params)
        return make(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", counted)
    yield seen
