"""Run moto's Lambda functions in-process: import the function's `Handler` and call it.

moto's Lambda needs docker to run code; with `lambda.use_docker: false` it answers a canned payload.
This module replaces the model's invoke path (`LambdaFunction.invoke`, its docker-based helper
`LambdaFunction._invoke_lambda`, and the docker-less `LambdaSimpleBackend.invoke`) with an in-process
runtime. Every way moto invokes a function (the Invoke API, SQS/DynamoDB/Kinesis event sources, SNS,
EventBridge, CloudWatch Logs subscriptions) then runs our code.

Environment isolation. `os.environ` is process-global, and Lambda gives each sandbox its own. A global
lock around "apply env, call, restore" would serialise every invocation and deadlock as soon as a handler
triggers another invocation synchronously (an SQS send whose event source mapping invokes a function
runs inside moto's request thread, while the first invocation still holds the lock). Instead
`os.environ` is replaced, once, by a mapping that serves a per-invocation environment whenever one is
active in the current `contextvars` context, and the real process environment otherwise. Each function
runs on its own small thread pool (its "sandboxes": thread-local clients such as pynamodb's connection
are reused across invocations like a warm Lambda), each call in a copy of a context carrying that
function's environment: the configured `Environment.Variables`, Lambda's reserved variables,
`AWS_ENDPOINT_URL` pointing at moto, and the execution role's temporary credentials from moto's STS.
Limits: a thread the handler starts itself does not inherit the environment (contextvars are not
inherited by new threads), and C code calling getenv(3) sees the process environment.

Logs. `sys.stdout`/`sys.stderr` are replaced by streams that route writes made during an invocation to
that invocation's buffer (Powertools' Logger writes to `sys.stdout`); with Lambda's START/END/REPORT
lines they are written to the function's CloudWatch Logs group in moto, and returned base64 in
`X-Amz-Log-Result` for `LogType=Tail` callers.

Powertools. Its event handler keeps the request being resolved in a class attribute shared by all
resolvers; `powertools_isolation` makes it per invocation, like the process-per-function Lambda gives.

Timeout. The call runs on a worker thread; after the configured `Timeout` the caller gets Lambda's
`Task timed out after N seconds` error. Python cannot kill a thread, so the handler keeps running in the
background until it returns (documented limitation).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import contextvars
import importlib
import io
import json
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

import botocore.handlers

from berth_tools.localcloud import metering, moto_compat, powertools_isolation
from berth_tools.localcloud.moto_transport import InProcessTransport

if TYPE_CHECKING:
    from moto.awslambda.models import LambdaFunction

#: The environment of the invocation running in the current context (None: the process environment).
_SANDBOX_ENV: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "berth_lambda_env", default=None
)
#: Where print()/logging output of the current invocation goes (None: the real stream).
_SANDBOX_LOG: contextvars.ContextVar[io.StringIO | None] = contextvars.ContextVar(
    "berth_lambda_log", default=None
)

#: Variables copied from the process into every sandbox (the Lambda runtime has PATH, LANG and TZ).
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")


class SandboxEnviron(os._Environ[str]):
    """`os.environ` replacement: the active invocation's environment, else the process environment."""

    def __init__(self, base: os._Environ[str]) -> None:
        super().__init__(base._data, base.encodekey, base.decodekey, base.encodevalue, base.decodevalue)  # type: ignore[attr-defined]
        self.base = base

    def __getitem__(self, key: str) -> str:
        env = _SANDBOX_ENV.get()
        return env[key] if env is not None else super().__getitem__(key)

    def __setitem__(self, key: str, value: str) -> None:
        env = _SANDBOX_ENV.get()
        if env is None:
            super().__setitem__(key, value)
        else:
            env[key] = str(value)

    def __delitem__(self, key: str) -> None:
        env = _SANDBOX_ENV.get()
        if env is None:
            super().__delitem__(key)
        else:
            del env[key]

    def __iter__(self) -> Iterator[str]:
        env = _SANDBOX_ENV.get()
        return iter(list(env)) if env is not None else super().__iter__()

    def __len__(self) -> int:
        env = _SANDBOX_ENV.get()
        return len(env) if env is not None else super().__len__()

    def copy(self) -> dict[str, str]:
        return dict(self)


class _RoutingStream(io.TextIOBase):
    """A text stream that writes to the active invocation's log buffer, else to the real stream."""

    def __init__(self, real: TextIO) -> None:
        self.real = real

    def write(self, text: str) -> int:
        buffer = _SANDBOX_LOG.get()
        if buffer is None:
            return self.real.write(text)
        return buffer.write(text)

    def flush(self) -> None:
        if _SANDBOX_LOG.get() is None:
            self.real.flush()

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")


@contextlib.contextmanager
def sandbox_environment(env: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Run the block with `os.environ` showing exactly `env` (needs `install()` first)."""
    own = dict(env)
    token = _SANDBOX_ENV.set(own)
    try:
        yield own
    finally:
        _SANDBOX_ENV.reset(token)


class LambdaContext:
    """The `context` object of the Python Lambda runtime."""

    def __init__(self, fn: LambdaFunction, request_id: str, log_stream: str, deadline: float) -> None:
        self.function_name: str = fn.function_name
        self.function_version: str = str(fn.version)
        self.invoked_function_arn: str = fn.function_arn
        self.memory_limit_in_mb: int = int(fn.memory_size)
        self.aws_request_id = request_id
        self.log_group_name: str = fn.logs_group_name
        self.log_stream_name = log_stream
        self.identity = None
        self.client_context = None
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@dataclass
class InvocationResult:
    payload: bytes
    function_error: str | None  # "Unhandled" like Lambda when the handler raised or timed out
    log_tail: str


@dataclass
class _RoleCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_at: float


@dataclass
class InProcessLambdaRuntime:
    """Runs Lambda handlers in this process against the moto server at `endpoint_url`."""

    endpoint_url: str
    # One event at a time per function, as in one Lambda sandbox: handler frameworks (Powertools'
    # resolver among them) keep the current request in module or class state.
    max_concurrency_per_function: int = 1
    #: Handlers that keep no request state in module or class state, with the sandboxes they may run
    #: at once (never above the function's reserved concurrency).
    handler_concurrency: dict[str, int] = field(default_factory=dict)
    echo_logs: TextIO | None = None  # also copy handler logs here (e.g. the console of `berth local up`)
    # Serve the handlers' SDK calls to moto in their own thread (no loopback socket); see moto_transport.
    in_process_transport: bool = True
    transport: InProcessTransport | None = None
    _pools: dict[str, concurrent.futures.ThreadPoolExecutor] = field(default_factory=dict)
    _streams: dict[str, str] = field(default_factory=dict)
    _credentials: dict[str, _RoleCredentials] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _handlers: dict[str, Callable[..., Any]] = field(default_factory=dict)

    # -- the environment of one function ---------------------------------------------------------
    def function_environment(self, fn: LambdaFunction) -> dict[str, str]:
        creds = self._role_credentials(fn)
        base = _base_environ()
        env = {key: base[key] for key in _INHERITED if key in base}
        env.update(
            {
                "_HANDLER": fn.handler or "",
                "AWS_EXECUTION_ENV": f"AWS_Lambda_{fn.run_time}",
                "AWS_LAMBDA_FUNCTION_NAME": fn.function_name,
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(fn.memory_size),
                "AWS_LAMBDA_FUNCTION_VERSION": str(fn.version),
                "AWS_LAMBDA_FUNCTION_TIMEOUT": str(fn.timeout),
                "AWS_LAMBDA_LOG_GROUP_NAME": fn.logs_group_name,
                "AWS_LAMBDA_LOG_STREAM_NAME": self._log_stream(fn),
                "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001",
                "LAMBDA_TASK_ROOT": "/var/task",
                "LAMBDA_RUNTIME_DIR": "/var/runtime",
                "AWS_REGION": fn.region,
                "AWS_DEFAULT_REGION": fn.region,
                "AWS_ACCESS_KEY_ID": creds.access_key_id,
                "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
                "AWS_SESSION_TOKEN": creds.session_token,
                "AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
                "MOTO_PORT": _base_environ().get("MOTO_PORT", ""),
                "TZ": ":UTC",
                # There is no X-Ray daemon locally: the SDK is switched off rather than sending to nowhere.
                "AWS_XRAY_SDK_ENABLED": "false",
                "AWS_XRAY_CONTEXT_MISSING": "IGNORE_ERROR",
            }
        )
        env.update({str(k): str(v) for k, v in (fn.environment_vars or {}).items()})
        return env

    def _role_credentials(self, fn: LambdaFunction) -> _RoleCredentials:
        """Temporary credentials of the execution role, from moto's STS (like the Lambda service does)."""
        with self._lock:
            cached = self._credentials.get(fn.function_arn)
            if cached is not None and cached.expires_at - time.time() > 300:
                return cached
            duration = 3600
            assumed = moto_compat.assume_role(
                fn.account_id, fn.region, fn.function_name[:64], fn.role, duration
            )
            creds = _RoleCredentials(
                access_key_id=assumed.access_key_id,
                secret_access_key=assumed.secret_access_key,
                session_token=assumed.session_token,
                expires_at=time.time() + duration,
            )
            self._credentials[fn.function_arn] = creds
            return creds

    # -- logs ----------------------------------------------------------------------------------
    def _log_stream(self, fn: LambdaFunction) -> str:
        with self._lock:
            stream = self._streams.get(fn.function_arn)
            if stream is None:
                today = datetime.now(UTC)
                stream = f"{today:%Y/%m/%d}/[{fn.version}]{uuid.uuid4().hex}"
                fn.logs_backend.ensure_log_group(fn.logs_group_name)
                fn.logs_backend.create_log_stream(fn.logs_group_name, stream)
                self._streams[fn.function_arn] = stream
            return stream

    def record_invocation(self, fn: LambdaFunction, duration_ms: float) -> None:
        """The metering hook: each invocation's duration and configured MemorySize (see `metering`)."""
        metering.METER.record_lambda(fn.function_name, duration_ms, int(fn.memory_size or 128))

    def _ship_logs(self, fn: LambdaFunction, stream: str, text: str) -> None:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return
        metering.METER.record_log_bytes(
            sum(len(line.encode()) + metering.LOG_EVENT_OVERHEAD_BYTES for line in lines)
        )
        now_ms = int(time.time() * 1000)
        events = [{"timestamp": now_ms, "message": line} for line in lines]
        try:
            fn.logs_backend.put_log_events(fn.logs_group_name, stream, events)
        except Exception as exc:  # never fail an invocation because its logs could not be stored
            print(f"berth local: could not store logs of {fn.function_name}: {exc}", file=sys.__stderr__)
        if self.echo_logs is not None:
            for line in lines:
                print(f"[{fn.function_name}] {line}", file=self.echo_logs)

    # -- invocation ----------------------------------------------------------------------------
    def _handler(self, fn: LambdaFunction) -> Callable[..., Any]:
        spec = fn.handler or ""
        handler = self._handlers.get(spec)
        if handler is None:
            module_name, _, attr = spec.rpartition(".")
            if not module_name:
                raise ImportError(f"Bad handler '{spec}': expected module.function")
            module = importlib.import_module(module_name)
            handler = getattr(module, attr)
            self._handlers[spec] = handler
        return handler

    def _pool(self, fn: LambdaFunction) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            pool = self._pools.get(fn.function_arn)
            if pool is None:
                workers = self.handler_concurrency.get(fn.handler or "", self.max_concurrency_per_function)
                reserved = fn.reserved_concurrency  # declared in moto_compat.SURFACES
                if reserved:
                    workers = min(workers, int(reserved))
                pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=max(1, workers),
                    thread_name_prefix=f"lambda-{fn.function_name[:40]}",
                )
                self._pools[fn.function_arn] = pool
            return pool

    def invoke(self, fn: LambdaFunction, event: Any) -> InvocationResult:
        request_id = str(uuid.uuid4())
        stream = self._log_stream(fn)
        env = self.function_environment(fn)
        timeout_s = float(fn.timeout or 3)
        started = time.monotonic()
        context = LambdaContext(fn, request_id, stream, started + timeout_s)
        buffer = io.StringIO()
        ran: dict[str, float] = {}  # when the handler started and ended in its sandbox (billed duration)

        env["_X_AMZN_TRACE_ID"] = _trace_header(event)

        def run() -> Any:
            ran["start"] = time.monotonic()
            try:
                _SANDBOX_ENV.set(env)
                _SANDBOX_LOG.set(buffer)
                handler = self._handler(fn)  # imported inside the sandbox: module-level os.environ reads work
                return handler(event, context)
            finally:
                ran["end"] = time.monotonic()

        _route_std_streams()  # something (a test runner, a REPL) may have replaced sys.stdout since install
        sandbox = contextvars.Context()  # a fresh context: nothing of the caller's leaks in
        future = self._pool(fn).submit(sandbox.run, run)
        payload: Any
        function_error: str | None = None
        try:
            result = future.result(timeout=timeout_s)
            payload = json.dumps(result).encode()
        except concurrent.futures.TimeoutError:
            function_error = "Unhandled"
            stamp = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"
            message = f"{stamp} {request_id} Task timed out after {timeout_s:.2f} seconds"
            buffer.write(message + "\n")
            payload = json.dumps({"errorMessage": message, "errorType": "Sandbox.Timedout"}).encode()
        except Exception as exc:
            function_error = "Unhandled"
            trace = traceback.format_exception(exc)
            error = {
                "errorMessage": str(exc),
                "errorType": type(exc).__name__,
                "requestId": request_id,
                "stackTrace": [line.rstrip("\n") for line in trace[1:]],
            }
            buffer.write(f"[ERROR] {type(exc).__name__}: {exc}\n{''.join(trace)}")
            payload = json.dumps(error).encode()
        elapsed_ms = (time.monotonic() - started) * 1000
        # Billed: the handler's own run in its sandbox (not the wait for a free sandbox); a timeout bills
        # the whole timeout, as Lambda does.
        if function_error is not None and "end" not in ran:
            billed_ms = timeout_s * 1000
        else:
            billed_ms = (ran.get("end", started) - ran.get("start", started)) * 1000
        self.record_invocation(fn, billed_ms)
        handler_output = buffer.getvalue()
        text = (
            f"START RequestId: {request_id} Version: {fn.version}\n{handler_output}"
            f"END RequestId: {request_id}\n"
            f"REPORT RequestId: {request_id}\tDuration: {elapsed_ms:.2f} ms\t"
            f"Billed Duration: {max(1, round(elapsed_ms))} ms\tMemory Size: {fn.memory_size} MB\n"
        )
        self._ship_logs(fn, stream, text)
        return InvocationResult(payload=payload, function_error=function_error, log_tail=text[-4096:])

    def sandbox_request(self, request: Any) -> Any:
        """botocore `before-send` for calls made inside a sandbox: moto's answer, or None to send it."""
        if not self.in_process_transport:
            return None
        if self.transport is None:
            self.transport = InProcessTransport(self.endpoint_url)
        return self.transport(request)

    def shutdown(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)


def _trace_header(event: Any) -> str:
    """Lambda's per-invocation `_X_AMZN_TRACE_ID`: the caller's trace (API Gateway's header) or a new one."""
    headers = event.get("headers") if isinstance(event, dict) else None
    if isinstance(headers, dict):
        for name, value in headers.items():
            if name.lower() == "x-amzn-trace-id" and isinstance(value, str):
                return value if "Sampled=" in value else f"{value};Sampled=0"
    return f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0"


def _base_environ() -> Mapping[str, str]:
    environ = os.environ
    return environ.base if isinstance(environ, SandboxEnviron) else environ


# -- patching moto ------------------------------------------------------------------------------
_ORIGINALS: dict[str, Any] = {}
_PATCHES: list[moto_compat.Patch] = []
_ACTIVE: list[InProcessLambdaRuntime] = []


def _patched_function_invoke(
    self: LambdaFunction, body: str, request_headers: Any, response_headers: Any
) -> bytes:
    if not _ACTIVE:
        raise RuntimeError("berth in-process Lambda runtime is not installed")
    event = json.loads(body) if body else {}
    result = _ACTIVE[-1].invoke(self, event)
    if result.function_error:
        response_headers["x-amz-function-error"] = result.function_error
    if (request_headers or {}).get("x-amz-log-type") == "Tail":
        response_headers["x-amz-log-result"] = base64.b64encode(result.log_tail.encode()).decode()
    return result.payload


def _patched_invoke_lambda(self: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
    """The docker helper's signature, served in-process (kept for any moto path calling it directly)."""
    parsed = json.loads(event) if isinstance(event, str) and event else (event or {})
    result = _ACTIVE[-1].invoke(self, parsed)
    return result.payload.decode(), result.function_error is not None, result.log_tail


def _sandbox_before_send(request: Any, **_: Any) -> Any:
    """Registered on every botocore session: in-process transport for SDK calls made by a handler."""
    if _SANDBOX_ENV.get() is None or not _ACTIVE:
        return None
    return _ACTIVE[-1].sandbox_request(request)


_BUILTIN_HOOK = ("before-send", _sandbox_before_send)


def _route_std_streams() -> None:
    """Make sys.stdout/sys.stderr route invocation output to the invocation's log buffer."""
    if not isinstance(sys.stdout, _RoutingStream):
        sys.stdout = _RoutingStream(sys.stdout)
    if not isinstance(sys.stderr, _RoutingStream):
        sys.stderr = _RoutingStream(sys.stderr)


_LAMBDA_FUNCTION = "moto.awslambda.models:LambdaFunction"


def install(runtime: InProcessLambdaRuntime) -> None:
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
        # Every botocore session created from now on (the handlers' clients are created in the sandbox)
        # offers its requests to the in-process transport first.
        botocore.handlers.BUILTIN_HANDLERS.append(_BUILTIN_HOOK)
        _ORIGINALS["environ"] = os.environ
        os.environ = SandboxEnviron(os.environ)  # noqa: B003 - replaced on purpose, never cleared
        _route_std_streams()
        powertools_isolation.install()
    _ACTIVE.append(runtime)


def uninstall(runtime: InProcessLambdaRuntime) -> None:
    """Undo `install` once the last runtime is gone (stdout/environ are restored only if still ours)."""
    if runtime in _ACTIVE:
        _ACTIVE.remove(runtime)
    runtime.shutdown()
    if _ACTIVE or not _PATCHES:
        return
    while _PATCHES:
        _PATCHES.pop().undo()
    if _BUILTIN_HOOK in botocore.handlers.BUILTIN_HANDLERS:
        botocore.handlers.BUILTIN_HANDLERS.remove(_BUILTIN_HOOK)
    environ = _ORIGINALS.pop("environ")
    if isinstance(os.environ, SandboxEnviron):
        os.environ = environ  # noqa: B003
    if isinstance(sys.stdout, _RoutingStream):
        sys.stdout = sys.stdout.real
    if isinstance(sys.stderr, _RoutingStream):
        sys.stderr = sys.stderr.real
