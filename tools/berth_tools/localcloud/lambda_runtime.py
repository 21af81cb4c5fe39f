"""Run moto's Lambda functions as Lambda does: each in warm worker processes of its own.

moto's Lambda needs docker to run code; with `lambda.use_docker: false` it answers a canned payload.
This module replaces the model's invoke path (`LambdaFunction.invoke`, its docker-based helper
`LambdaFunction._invoke_lambda`, and the docker-less `LambdaSimpleBackend.invoke`). Every way moto
invokes a function (the Invoke API, SQS/DynamoDB/Kinesis event sources, SNS, EventBridge, CloudWatch
Logs subscriptions) then runs our code.

Sandboxes. Each function has its own pool of worker processes (`lambda_workers`, `lambda_worker`):
at most its reserved concurrency, capped by a local maximum (`max_sandboxes_per_function`, per handler
in `concurrency`), started on demand and reused while warm. A sandbox is started with the function's
own environment, built as the Lambda service builds it: the configured `Environment.Variables`,
Lambda's reserved variables, the execution role's temporary credentials from moto's STS, and
`AWS_ENDPOINT_URL` pointing at the moto server over loopback, which the handler's SDK calls reach as
they would reach AWS. A change of the function's configuration retires its sandboxes (new ones start
with the new configuration); a sandbox is also retired before its credentials expire.

Timeouts. After the configured `Timeout` the sandbox is killed and the caller gets Lambda's
`Task timed out after N seconds`; a sandbox that exits (a crash, `os._exit`) gives `Runtime.ExitError`;
a handler that cannot be imported gives `Runtime.ImportModuleError`. Either way the next invocation runs
in a fresh process.

Logs. A sandbox's stdout and stderr are its logs: with Lambda's INIT_START/START/END/REPORT lines (the
REPORT line with the duration, the sandbox's peak memory and, on a cold start, its init duration) they
go to the function's CloudWatch Logs group in moto, one stream per sandbox, and are returned base64 in
`X-Amz-Log-Result` for `LogType=Tail` callers.

Metering. Each invocation's duration and memory go to the meter (`metering.record_lambda`); the
access key of each function's role credentials is named after the function, so the meter attributes
the AWS calls its sandboxes make to it (`metering.Meter.name_caller`).
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from berth_tools.localcloud import metering, moto_compat, moto_logs
from berth_tools.localcloud.lambda_workers import (
    Answer,
    SandboxGone,
    SandboxPool,
    SandboxTimeout,
    WorkerProcess,
)

if TYPE_CHECKING:
    from moto.awslambda.models import LambdaFunction

#: Variables copied from the local cloud's process into every sandbox (Lambda's runtime has PATH, LANG).
_INHERITED = ("PATH", "LANG", "LC_ALL", "VIRTUAL_ENV", "TMPDIR")
#: Each sandbox's role credentials last this long; the sandbox is retired after `SANDBOX_MAX_AGE_S`.
CREDENTIALS_S = 3600
SANDBOX_MAX_AGE_S = 3000


class SandboxInitError(RuntimeError):
    def __init__(self, error: dict[str, Any], output: str) -> None:
        super().__init__(error.get("errorMessage", "init failed"))
        self.error = error
        self.output = output


@dataclass
class InvocationResult:
    payload: bytes
    function_error: str | None  # "Unhandled" like Lambda when the handler raised, crashed or timed out
    log_tail: str


@dataclass
class _RoleCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_at: float


@dataclass
class _FunctionPool:
    fingerprint: str
    pool: SandboxPool


@dataclass
class ProcessLambdaRuntime:
    """Runs Lambda handlers in worker processes against the moto server at `endpoint_url`."""

    endpoint_url: str
    #: At most this many sandboxes per function (the function's reserved concurrency may lower it).
    max_sandboxes_per_function: int = 2
    #: Per handler (``module.function``): its local maximum, instead of `max_sandboxes_per_function`.
    concurrency: dict[str, int] = field(default_factory=dict)
    echo_logs: TextIO | None = None  # also copy handler logs here (e.g. the console of `berth local up`)
    #: ``("module:callable", [args])`` each sandbox calls before importing its handler (e.g. a botocore
    #: hook that adds per-call latency); they run in the sandbox, so they reach its SDK calls.
    worker_hooks: list[tuple[str, list[Any]]] = field(default_factory=list)
    _pools: dict[str, _FunctionPool] = field(default_factory=dict)
    _retired: list[_FunctionPool] = field(default_factory=list)  # replaced by a configuration change
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    # -- the environment of one sandbox ------------------------------------------------------------
    def function_environment(self, fn: LambdaFunction, log_stream: str = "") -> dict[str, str]:
        creds = self._role_credentials(fn)
        env = {key: os.environ[key] for key in _INHERITED if key in os.environ}
        env.update(
            {
                "_HANDLER": fn.handler or "",
                "AWS_EXECUTION_ENV": f"AWS_Lambda_{fn.run_time}",
                "AWS_LAMBDA_FUNCTION_NAME": fn.function_name,
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(fn.memory_size),
                "AWS_LAMBDA_FUNCTION_VERSION": str(fn.version),
                "AWS_LAMBDA_LOG_GROUP_NAME": fn.logs_group_name,
                "AWS_LAMBDA_LOG_STREAM_NAME": log_stream,
                "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
                "LAMBDA_TASK_ROOT": "/var/task",
                "LAMBDA_RUNTIME_DIR": "/var/runtime",
                "AWS_REGION": fn.region,
                "AWS_DEFAULT_REGION": fn.region,
                "AWS_ACCESS_KEY_ID": creds.access_key_id,
                "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
                "AWS_SESSION_TOKEN": creds.session_token,
                "AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
                # No shared config or credentials files (the user's ~/.aws must not leak in).
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "TZ": ":UTC",
                # There is no X-Ray daemon locally: the SDK is switched off rather than sending to nowhere.
                "AWS_XRAY_SDK_ENABLED": "false",
                "AWS_XRAY_CONTEXT_MISSING": "IGNORE_ERROR",
                # The function's code: whatever the local cloud itself imports Berth from.
                "PYTHONPATH": _code_path(),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        env.update({str(k): str(v) for k, v in (fn.environment_vars or {}).items()})
        return env

    def _role_credentials(self, fn: LambdaFunction) -> _RoleCredentials:
        """Fresh temporary credentials of the execution role for one sandbox, from moto's STS (as the
        Lambda service gives each sandbox); the sandbox is retired before they expire."""
        assumed = moto_compat.assume_role(
            fn.account_id, fn.region, fn.function_name[:64], fn.role, CREDENTIALS_S
        )
        creds = _RoleCredentials(
            access_key_id=assumed.access_key_id,
            secret_access_key=assumed.secret_access_key,
            session_token=assumed.session_token,
            expires_at=time.time() + CREDENTIALS_S,
        )
        metering.METER.name_caller(creds.access_key_id, fn.function_name)
        return creds

    # -- sandboxes -----------------------------------------------------------------------------------
    def limit(self, fn: LambdaFunction) -> int:
        limit = self.concurrency.get(fn.handler or "", self.max_sandboxes_per_function)
        reserved = fn.reserved_concurrency  # declared in moto_compat.SURFACES
        if reserved:
            limit = min(limit, int(reserved))
        return max(1, limit)

    def _function_pool(self, fn: LambdaFunction) -> _FunctionPool:
        fingerprint = json.dumps(
            [fn.handler, fn.environment_vars, fn.timeout, fn.memory_size, fn.role, str(fn.version)],
            sort_keys=True,
            default=str,
        )
        retired: _FunctionPool | None = None
        with self._lock:
            if self._closed:
                raise SandboxGone("the local cloud is stopping")
            entry = self._pools.get(fn.function_arn)
            if entry is None or entry.fingerprint != fingerprint:
                retired = entry
                if entry is not None:
                    self._retired = [old for old in self._retired if old.pool.size()] + [entry]
                entry = _FunctionPool(fingerprint, SandboxPool(self.limit(fn), lambda: self._spawn(fn)))
                self._pools[fn.function_arn] = entry
        if retired is not None:  # a configuration change: new sandboxes; running events finish first
            for worker in retired.pool.close(busy_too=False):
                worker.join()
        return entry

    def _spawn(self, fn: LambdaFunction) -> WorkerProcess:
        stream = f"{datetime.now(UTC):%Y/%m/%d}/[{fn.version}]{uuid.uuid4().hex}"
        fn.logs_backend.ensure_log_group(fn.logs_group_name)
        fn.logs_backend.create_log_stream(fn.logs_group_name, stream)
        worker = WorkerProcess(
            handler=fn.handler or "",
            env=self.function_environment(fn, stream),
            hooks=[(target, list(args)) for target, args in self.worker_hooks],
            log_stream=stream,
        )
        try:
            answer = worker.start()
        except (SandboxGone, SandboxTimeout) as exc:
            output = worker.kill()
            error = {"errorMessage": f"the sandbox did not start: {exc}", "errorType": "Runtime.Unknown"}
            raise SandboxInitError(error, output) from exc
        if not answer.message.get("ready"):
            output = answer.output + worker.kill()
            raise SandboxInitError(answer.message.get("error") or {}, output)
        return worker

    def pids(self) -> list[int]:
        """The worker processes alive now (tests, diagnostics)."""
        with self._lock:
            pools = list(self._pools.values())
        return [pid for entry in pools for pid in entry.pool.pids()]

    def kill_sandbox(self, name_part: str) -> tuple[str, int] | None:
        """`berth local fault lambda-kill`: SIGKILL one sandbox of a function whose name contains
        `name_part`, one running an event if any (that invocation ends in `Runtime.ExitError`, as Lambda's
        does when its sandbox dies). (function name, pid), or None when no such sandbox is alive."""
        with self._lock:
            by_name = {arn.rsplit(":function:", 1)[-1]: entry.pool for arn, entry in self._pools.items()}
        chosen = functions_named(list(by_name), name_part)
        pools = [(name, by_name[name]) for name in chosen]
        pools.sort(key=lambda named: -named[1].busy())  # one running an event first
        for name, pool in pools:
            pid = pool.kill_one()
            if pid is not None:
                return name, pid
        return None

    def busy(self, function_name: str) -> int:
        """How many sandboxes of the function run an event now (tests, diagnostics)."""
        with self._lock:
            entry = next(
                (e for arn, e in self._pools.items() if arn.endswith(f":function:{function_name}")), None
            )
        return entry.pool.busy() if entry is not None else 0

    # -- invocation ----------------------------------------------------------------------------------
    def invoke(self, fn: LambdaFunction, event: Any) -> InvocationResult:
        request_id = str(uuid.uuid4())
        timeout_s = float(fn.timeout or 3)
        try:
            entry = self._function_pool(fn)
            worker, cold = entry.pool.acquire()
        except SandboxInitError as exc:
            return self._finish(fn, "", request_id, "", exc.output, exc.error, 0.0, None, None)
        except SandboxGone as exc:
            error = {
                "errorMessage": f"RequestId: {request_id} Error: {exc}",
                "errorType": "Runtime.Unavailable",
            }
            return self._finish(fn, "", request_id, "", "", error, 0.0, None, None)
        init_output, worker.init_output = worker.init_output, ""
        message = {
            "request_id": request_id,
            "event": event,
            "deadline": time.time() + timeout_s,
            "trace_id": _trace_header(event),
            "function_arn": fn.function_arn,
            "function_name": fn.function_name,
            "function_version": str(fn.version),
            "memory_mb": int(fn.memory_size or 128),
            "log_group": fn.logs_group_name,
            "log_stream": worker.log_stream,
        }
        init_ms = worker.init_ms if cold else None
        access_key = worker.env.get("AWS_ACCESS_KEY_ID", "")
        activity = activity_of(event)
        if activity:
            metering.METER.begin_activity(access_key, activity)
        try:
            answer: Answer = worker.invoke(message, timeout_s)
        except SandboxTimeout:
            rss = worker.max_rss_mb()
            output = worker.kill()
            entry.pool.discard(worker)
            stamp = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"
            text = f"{stamp} {request_id} Task timed out after {timeout_s:.2f} seconds"
            error = {"errorMessage": text, "errorType": "Sandbox.Timedout"}
            return self._finish(
                fn, worker.log_stream, request_id, init_output, output + text + "\n", error,
                timeout_s * 1000, rss, init_ms,
            )  # fmt: skip
        except SandboxGone as gone:
            rss = worker.max_rss_mb()
            output = worker.kill()
            entry.pool.discard(worker)
            text = f"RequestId: {request_id} Error: Runtime exited with error: {gone.status}"
            error = {"errorMessage": text, "errorType": "Runtime.ExitError"}
            return self._finish(
                fn, worker.log_stream, request_id, init_output, output + text + "\nRuntime.ExitError\n",
                error, 0.0, rss, init_ms,
            )  # fmt: skip
        finally:
            if activity:
                metering.METER.end_activity(access_key)
        # Retired before its credentials expire: the next invocation gets a fresh sandbox.
        entry.pool.release(worker, retire=time.time() - worker.started_at > SANDBOX_MAX_AGE_S)
        reply = answer.message
        return self._finish(
            fn, worker.log_stream, request_id, init_output, answer.output, reply.get("error"),
            float(reply.get("duration_ms") or 0.0), reply.get("max_rss_mb"), init_ms,
            payload=str(reply.get("payload", "null")).encode(),
        )  # fmt: skip

    def _finish(
        self,
        fn: LambdaFunction,
        stream: str,
        request_id: str,
        init_output: str,
        output: str,
        error: dict[str, Any] | None,
        duration_ms: float,
        max_rss_mb: int | None,
        init_ms: float | None,
        payload: bytes = b"null",
    ) -> InvocationResult:
        metering.METER.record_lambda(fn.function_name, duration_ms, int(fn.memory_size or 128))
        report = (
            f"REPORT RequestId: {request_id}\tDuration: {duration_ms:.2f} ms\t"
            f"Billed Duration: {max(1, round(duration_ms + 0.4999))} ms\tMemory Size: {fn.memory_size} MB"
        )
        if max_rss_mb is not None:
            report += f"\tMax Memory Used: {max_rss_mb} MB"
        if init_ms is not None:
            report += f"\tInit Duration: {init_ms:.2f} ms"
        head = f"INIT_START Runtime Version: python:{sys.version_info.major}.{sys.version_info.minor}\n"
        text = (
            (head + init_output if init_ms is not None else init_output)
            + f"START RequestId: {request_id} Version: {fn.version}\n{output}"
            f"END RequestId: {request_id}\n{report}\n"
        )
        self._ship_logs(fn, stream, text)
        if error is not None:
            return InvocationResult(json.dumps(error).encode(), "Unhandled", text[-4096:])
        return InvocationResult(payload, None, text[-4096:])

    def _ship_logs(self, fn: LambdaFunction, stream: str, text: str) -> None:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return
        metering.METER.record_log_bytes(
            sum(len(line.encode()) + metering.LOG_EVENT_OVERHEAD_BYTES for line in lines)
        )
        now_ms = int(time.time() * 1000)
        events = [{"timestamp": now_ms, "message": line} for line in lines]
        moto_logs.function_group(fn.logs_group_name)  # its streams keep their newest events only
        try:
            if not stream:  # no sandbox started (init failed): a stream of its own, as Lambda's would be
                stream = f"{datetime.now(UTC):%Y/%m/%d}/[{fn.version}]{uuid.uuid4().hex}"
                fn.logs_backend.ensure_log_group(fn.logs_group_name)
                fn.logs_backend.create_log_stream(fn.logs_group_name, stream)
            fn.logs_backend.put_log_events(fn.logs_group_name, stream, events)
        except Exception as exc:  # never fail an invocation because its logs could not be stored
            print(f"berth local: could not store logs of {fn.function_name}: {exc}", file=sys.__stderr__)
        if self.echo_logs is not None:
            for line in lines:
                print(f"[{fn.function_name}] {line}", file=self.echo_logs)

    def shutdown(self) -> None:
        """Stop every sandbox (all at once) and wait for them to exit; no invocation starts after."""
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()) + self._retired, {}
            self._retired = []
        workers = [worker for entry in pools for worker in entry.pool.close()]
        for worker in workers:
            worker.join()


def functions_named(names: list[str], part: str) -> list[str]:
    """The functions `lambda-kill PART` means: of those whose name contains `part`, the narrowest
    non-empty set of: those with `-<part>Function` in their name (right after the stack's name), those
    with `<part>Function`, all of them. CDK's names make that what one means: `Workflow` is
    `Berth-WorkflowWorkflowFunction…`, not every function of the Workflow construct; `Api` is
    `Berth-ApiFunction…`, not `Berth-WorkflowAgentApiFunction…`."""
    for needle in (f"-{part}Function", f"{part}Function", part):
        found = [name for name in names if needle in name]
        if found:
            return found
    return []


def activity_of(event: Any) -> str:
    """What an invocation serves, for the meter: an API Gateway proxy event's method and resource
    (``GET /v1/jobs/{id}``); "" for any other event."""
    if isinstance(event, dict) and isinstance(event.get("httpMethod"), str) and event.get("resource"):
        return f"{event['httpMethod']} {event['resource']}"
    return ""


def _trace_header(event: Any) -> str:
    """Lambda's per-invocation `_X_AMZN_TRACE_ID`: the caller's trace (API Gateway's header) or a new one."""
    headers = event.get("headers") if isinstance(event, dict) else None
    if isinstance(headers, dict):
        for name, value in headers.items():
            if name.lower() == "x-amzn-trace-id" and isinstance(value, str):
                return value if "Sampled=" in value else f"{value};Sampled=0"
    return f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0"


def _code_path() -> str:
    """The import path of the local cloud's own code (its ``sys.path`` outside the interpreter's)."""
    prefixes = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    entries: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if path.startswith(prefixes) or path in entries or not os.path.isdir(path):
            continue
        entries.append(path)
    return os.pathsep.join(entries)


# -- patching moto ------------------------------------------------------------------------------
_PATCHES: list[moto_compat.Patch] = []
_ACTIVE: list[ProcessLambdaRuntime] = []


def _active() -> ProcessLambdaRuntime:
    if not _ACTIVE:
        raise RuntimeError("berth Lambda runtime is not installed")
    return _ACTIVE[-1]


def _patched_function_invoke(
    self: LambdaFunction, body: str, request_headers: Any, response_headers: Any
) -> bytes:
    event = json.loads(body) if body else {}
    result = _active().invoke(self, event)
    if result.function_error:
        response_headers["x-amz-function-error"] = result.function_error
    if (request_headers or {}).get("x-amz-log-type") == "Tail":
        response_headers["x-amz-log-result"] = base64.b64encode(result.log_tail.encode()).decode()
    return result.payload


def _patched_invoke_lambda(self: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
    """The docker helper's signature, served by the worker processes (for any moto path calling it)."""
    parsed = json.loads(event) if isinstance(event, str) and event else (event or {})
    result = _active().invoke(self, parsed)
    return result.payload.decode(), result.function_error is not None, result.log_tail


_LAMBDA_FUNCTION = "moto.awslambda.models:LambdaFunction"


def install(runtime: ProcessLambdaRuntime) -> None:
    """Route every moto Lambda invocation in this process to `runtime` (idempotent; last one wins).

    Raises `moto_compat.MotoCompatError` when moto's invoke path is not the one this module replaces."""
    if not _PATCHES:
        moto_compat.check()
        _PATCHES.append(moto_compat.replace(f"{_LAMBDA_FUNCTION}.invoke", _patched_function_invoke))
        _PATCHES.append(moto_compat.replace(f"{_LAMBDA_FUNCTION}._invoke_lambda", _patched_invoke_lambda))
        # The docker-less backend answers canned payloads; make it run the function like the real one.
        _PATCHES.append(
            moto_compat.replace(
                "moto.awslambda_simple.models:LambdaSimpleBackend.invoke",
                moto_compat.surface("moto.awslambda.models:LambdaBackend.invoke"),
            )
        )
    _ACTIVE.append(runtime)


def uninstall(runtime: ProcessLambdaRuntime) -> None:
    """Stop `runtime`'s sandboxes; undo `install` once the last runtime is gone."""
    if runtime in _ACTIVE:
        _ACTIVE.remove(runtime)
    runtime.shutdown()
    if _ACTIVE:
        return
    while _PATCHES:
        _PATCHES.pop().undo()


@atexit.register
def _stop_all() -> None:
    """No sandbox outlives the process that started it, even when the local cloud was not stopped."""
    for runtime in list(_ACTIVE):
        runtime.shutdown()
