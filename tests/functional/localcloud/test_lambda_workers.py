"""The local cloud's Lambda runtime: one worker process per sandbox (`lambda_runtime`, `lambda_workers`)."""

from __future__ import annotations

import base64
import io
import json
import os
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from berth_tools.localcloud import metering
from berth_tools.localcloud.cloud import LocalCloud, load_template

from .conftest import MINI_TEMPLATE

HANDLERS = "localcloud_worker_handlers"


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("index.py", "# the code runs from the local cloud's import path\n")
    return buffer.getvalue()


def _lambda(cloud: LocalCloud) -> Any:
    return cloud.session().client("lambda", endpoint_url=cloud.endpoint_url)


def _role(cloud: LocalCloud) -> str:
    config = _lambda(cloud).get_function_configuration(FunctionName=cloud.output("ApiFunctionName"))
    return str(config["Role"])


@pytest.fixture
def make_function(cloud: LocalCloud) -> Iterator[Any]:
    client = _lambda(cloud)
    created: list[str] = []

    def make(handler: str, timeout: int = 10, env: dict[str, str] | None = None, reserved: int = 0) -> str:
        name = f"worker-test-{uuid.uuid4().hex[:8]}"
        client.create_function(
            FunctionName=name,
            Runtime="python3.12",
            Role=_role(cloud),
            Handler=handler,
            Code={"ZipFile": _zip()},
            Timeout=timeout,
            MemorySize=256,
            Environment={"Variables": env or {}},
        )
        if reserved:
            client.put_function_concurrency(FunctionName=name, ReservedConcurrentExecutions=reserved)
        created.append(name)
        return name

    yield make
    for name in created:
        client.delete_function(FunctionName=name)


def _invoke(cloud: LocalCloud, name: str, event: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    payload = json.dumps(event or {}).encode()
    result = _lambda(cloud).invoke(FunctionName=name, Payload=payload, LogType="Tail")
    return result, json.loads(result["Payload"].read())


def _tail(result: dict[str, Any]) -> str:
    return base64.b64decode(result["LogResult"]).decode()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_invoke_runs_in_a_process_of_its_own_with_the_functions_environment(
    cloud: LocalCloud, make_function: Any
) -> None:
    os.environ["BERTH_PARENT_ONLY"] = "1"
    try:
        name = make_function(f"{HANDLERS}.echo", env={"GREETING": "hello"})
        result, payload = _invoke(cloud, name, {"say": "hi"})
    finally:
        del os.environ["BERTH_PARENT_ONLY"]
    assert "FunctionError" not in result
    assert payload["pid"] != os.getpid()
    assert payload["event"] == {"say": "hi"}
    env = payload["env"]
    assert env["GREETING"] == "hello"
    assert env["AWS_LAMBDA_FUNCTION_NAME"] == name
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "256"
    assert env["AWS_ENDPOINT_URL"] == cloud.endpoint_url
    assert env["AWS_ACCESS_KEY_ID"].startswith("ASIA") and env["AWS_SESSION_TOKEN"]
    assert env["_HANDLER"] == f"{HANDLERS}.echo"
    assert env["_X_AMZN_TRACE_ID"].startswith("Root=1-")
    assert "BERTH_PARENT_ONLY" not in env  # nothing of the local cloud's environment leaks in
    assert env["AWS_CONFIG_FILE"] == os.devnull
    assert 0 < payload["remaining_ms"] <= 10_000
    tail = _tail(result)
    assert "echo hi" in tail and "to stderr" in tail
    assert "Max Memory Used: " in tail


def test_a_warm_sandbox_is_reused_and_only_a_cold_start_reports_its_init(
    cloud: LocalCloud, make_function: Any
) -> None:
    name = make_function(f"{HANDLERS}.echo")
    first, one = _invoke(cloud, name)
    second, two = _invoke(cloud, name)
    assert one["pid"] == two["pid"] and one["started"] == two["started"]
    assert one["request_id"] != two["request_id"]
    assert "Init Duration: " in _tail(first) and "INIT_START" in _tail(first)
    assert "Init Duration: " not in _tail(second)


def test_a_timeout_kills_the_sandbox_and_the_next_invoke_gets_a_fresh_one(
    cloud: LocalCloud, make_function: Any
) -> None:
    name = make_function(f"{HANDLERS}.echo", timeout=1)
    _, warm = _invoke(cloud, name)
    result, payload = _invoke(cloud, name, {"sleep": 30, "say": "slow"})
    assert result["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Sandbox.Timedout"
    assert "Task timed out after 1.00 seconds" in payload["errorMessage"]
    assert "echo slow" in _tail(result)  # what it printed before it was killed
    assert not _alive(warm["pid"])
    _, fresh = _invoke(cloud, name)
    assert fresh["pid"] != warm["pid"]


def test_a_crashing_sandbox_is_a_lambda_error_and_is_replaced(cloud: LocalCloud, make_function: Any) -> None:
    name = make_function(f"{HANDLERS}.crash")
    result, payload = _invoke(cloud, name, {"code": 3})
    assert result["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Runtime.ExitError"
    assert "Runtime exited with error: exit status 3" in payload["errorMessage"]
    assert "about to exit" in _tail(result)
    assert cloud.runtime is not None
    # The next invocation starts a new sandbox (and crashes again, in a new process).
    again, payload = _invoke(cloud, name, {"code": 4})
    assert "exit status 4" in payload["errorMessage"]
    assert "Init Duration: " in _tail(again)


def test_an_unimportable_handler_is_an_import_error(cloud: LocalCloud, make_function: Any) -> None:
    name = make_function("localcloud_broken_handler.lambda_handler")
    result, payload = _invoke(cloud, name)
    assert result["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Runtime.ImportModuleError"
    assert "broken on purpose" in payload["errorMessage"]


def test_an_unserialisable_result_is_a_marshal_error(cloud: LocalCloud, make_function: Any) -> None:
    name = make_function(f"{HANDLERS}.not_serialisable")
    result, payload = _invoke(cloud, name)
    assert result["FunctionError"] == "Unhandled"
    assert payload["errorType"] == "Runtime.MarshalError"
    _, payload = _invoke(cloud, name)  # the sandbox survives it
    assert payload["errorType"] == "Runtime.MarshalError"


@pytest.mark.parametrize("reserved", [1, 2])
def test_sandboxes_are_bounded_by_reserved_concurrency(
    cloud: LocalCloud, make_function: Any, reserved: int
) -> None:
    name = make_function(f"{HANDLERS}.echo", reserved=reserved)
    payloads: list[dict[str, Any]] = []
    lock = threading.Lock()

    def call() -> None:
        _, payload = _invoke(cloud, name, {"sleep": 0.3})
        with lock:
            payloads.append(payload)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(payloads) == 6 and all("pid" in p for p in payloads)
    assert 1 <= len({p["pid"] for p in payloads}) <= reserved


def test_a_configuration_change_starts_new_sandboxes(cloud: LocalCloud, make_function: Any) -> None:
    name = make_function(f"{HANDLERS}.echo", env={"GREETING": "hello"})
    _, before = _invoke(cloud, name)
    _lambda(cloud).update_function_configuration(
        FunctionName=name, Environment={"Variables": {"GREETING": "bonjour"}}
    )
    _, after = _invoke(cloud, name)
    assert after["env"]["GREETING"] == "bonjour"
    assert after["pid"] != before["pid"] and not _alive(before["pid"])


def test_sdk_calls_reach_moto_over_loopback_as_the_role_and_are_metered_per_function(
    cloud: LocalCloud, make_function: Any
) -> None:
    name = make_function(f"{HANDLERS}.call_aws")
    metering.METER.reset()
    result, payload = _invoke(cloud, name)
    assert "FunctionError" not in result, payload
    assert ":assumed-role/" in payload["arn"]
    by_caller = metering.METER.snapshot()["requests_by_caller"]
    assert by_caller[name]["sts"]["GetCallerIdentity"] == 1


def test_handler_logs_reach_the_functions_log_group_one_stream_per_sandbox(
    cloud: LocalCloud, make_function: Any
) -> None:
    name = make_function(f"{HANDLERS}.echo", reserved=2)
    _invoke(cloud, name, {"say": "first"})
    logs = cloud.session().client("logs", endpoint_url=cloud.endpoint_url)
    events = logs.filter_log_events(logGroupName=f"/aws/lambda/{name}")["events"]
    messages = [e["message"] for e in events]
    assert "echo first" in messages and "to stderr" in messages
    assert any(m.startswith("REPORT RequestId") for m in messages)
    streams = {e["logStreamName"] for e in events}
    assert len(streams) == 1


def test_a_configuration_change_lets_a_running_invocation_finish(
    cloud: LocalCloud, make_function: Any
) -> None:
    name = make_function(f"{HANDLERS}.echo", env={"GREETING": "hello"})
    _invoke(cloud, name)  # warm
    results: list[dict[str, Any]] = []
    running = threading.Thread(target=lambda: results.append(_invoke(cloud, name, {"sleep": 2})[1]))
    running.start()
    assert cloud.runtime is not None
    deadline = time.monotonic() + 30
    while cloud.runtime.busy(name) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cloud.runtime.busy(name) == 1
    _lambda(cloud).update_function_configuration(
        FunctionName=name, Environment={"Variables": {"GREETING": "bonjour"}}
    )
    _, after = _invoke(cloud, name)
    running.join()
    assert after["env"]["GREETING"] == "bonjour"
    assert results and results[0]["env"]["GREETING"] == "hello"  # not killed by the change
    assert not _alive(results[0]["pid"])  # retired once it returned


# Last: another LocalCloud resets moto's process-global backends (the module's cloud is gone after it).
def test_stopping_the_local_cloud_leaves_no_worker_process(tmp_path: Any) -> None:
    with LocalCloud(template=load_template(MINI_TEMPLATE), state_dir=tmp_path / "state") as cloud:
        status, _ = cloud.request("GET", "/v1/jobs", profile="alice")
        assert status == 200
        assert cloud.runtime is not None
        pids = cloud.runtime.pids()
        assert pids and all(_alive(pid) for pid in pids)
    assert not any(_alive(pid) for pid in pids)
