"""Serve botocore requests addressed to the local moto server in the calling thread, without a socket.

The front door and local Batch run in the same process as moto (the Lambda handlers do not: they run in
worker processes and call the moto server over loopback, as they would call AWS). Each of their AWS
calls used to leave through urllib3, cross a loopback socket, wake a werkzeug server thread, be parsed as HTTP
again and only then reach moto's WSGI app; under load that plumbing cost as much CPU as moto's own
work, and every hop was a thread hand-off under the GIL. `InProcessTransport` is a botocore
`before-send` hook (the mechanism moto's own `mock_aws` uses) that hands the prepared request, as a
WSGI environ, straight to moto's WSGI app (the same app class the server runs, over the same
process-global backends) and returns its answer as botocore's `AWSResponse`. Everything else is
unchanged: the SDK still serialises, signs and parses exactly as against AWS, and moto still routes by
the signature's service, parses the request and serialises its answer; only the socket is gone.
Requests to any other URL are left alone (the hook returns None and botocore sends them as usual).

DynamoDB, the hot path of every API call, goes one step further: its requests are handed to moto's
DynamoDB response class exactly as the server's Flask view does (`normalize_request`, then
`DynamoHandler.dispatch(request, raw_url, headers)`, the call moto's `mock_aws` makes too), without
Flask's routing and request context around it. Every other service goes through the whole WSGI app.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import sys
import traceback
import urllib.parse
from collections.abc import Iterator
from typing import Any

from botocore.awsrequest import AWSPreparedRequest, AWSResponse, HTTPHeaders
from botocore.exceptions import ClientError
from botocore.session import Session
from werkzeug.test import EnvironBuilder, run_wsgi_app

from berth_tools.localcloud import faults, metering, moto_compat

_DYNAMODB_TARGET = "DynamoDB_20120810."


class _RawBody(io.BytesIO):
    """What botocore reads a response body from (`stream()`, like urllib3's response)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        chunk = self.read()
        while chunk:
            yield chunk
            chunk = self.read()


class InProcessTransport:
    """A botocore `before-send` hook answering requests for `endpoint_url` from moto's WSGI app."""

    def __init__(self, endpoint_url: str, app: Any = None, metered: bool = True) -> None:
        parts = urllib.parse.urlsplit(endpoint_url)
        self.base_url = f"{parts.scheme}://{parts.netloc}"
        self.app = app if app is not None else moto_compat.moto_wsgi_app()
        self.served = 0  # how many requests took the in-process path (for tests and diagnostics)
        #: False for AWS's own calls (local Batch's events and job logs): not the control plane's bill.
        self.metered = metered
        self._normalize = moto_compat.surface("moto.core.request:normalize_request")
        self._dynamodb_dispatch = moto_compat.surface("moto.dynamodb.responses:DynamoHandler.dispatch")

    def handles(self, url: str) -> bool:
        return url == self.base_url or url.startswith(self.base_url + "/")

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        if not self.handles(request.url):
            return None
        parts = urllib.parse.urlsplit(request.url)
        body = request.body
        if body is None:
            data = b""
        elif isinstance(body, bytes | bytearray):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode()
        else:  # a file-like streaming body
            content: bytes | str = body.read()
            data = content.encode() if isinstance(content, str) else content
        headers = [
            (name, value.decode() if isinstance(value, bytes) else str(value))
            for name, value in request.headers.items()
            if name.lower() not in ("content-length", "host")
        ]
        # moto runs here as it would in its own server thread: in a fresh context, nothing of the caller's.
        target = request.headers.get("X-Amz-Target") or ""
        if isinstance(target, bytes):
            target = target.decode()
        observed = metering.ObservedRequest(request.method, parts.path, parts.query, headers, data)

        def serve() -> metering.Answer:
            if target.startswith(_DYNAMODB_TARGET):
                return contextvars.Context().run(self._dynamodb, request, data)
            return contextvars.Context().run(self._wsgi, request, parts, headers, data)

        try:
            blocked = faults.fault_answer(observed)  # `berth local fault region-outage`, `ddb-throttle`
            if blocked is not None:
                code, pairs, payload = blocked
            elif self.metered:
                code, pairs, payload = metering.METER.observe(observed, serve)
            else:
                code, pairs, payload = serve()
        except Exception:  # a bug in moto: answer 500 as its server would, never raise into the SDK caller
            print(f"berth local: moto failed on {request.method} {request.url}:", file=sys.__stderr__)
            traceback.print_exc(file=sys.__stderr__)
            code, pairs, payload = 500, [("Content-Type", "text/plain")], b"Internal Server Error"
        self.served += 1
        answer = HTTPHeaders()
        for name, value in pairs:
            answer[name] = value
        return AWSResponse(request.url, code, answer, _RawBody(payload))

    def _wsgi(
        self,
        request: AWSPreparedRequest,
        parts: urllib.parse.SplitResult,
        headers: list[tuple[str, str]],
        data: bytes,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The request through moto's whole WSGI app, as its server thread would run it."""
        environ = EnvironBuilder(
            method=request.method,
            base_url=self.base_url,
            path=urllib.parse.unquote(parts.path) or "/",
            query_string=parts.query,
            headers=headers,
            data=data,
        ).get_environ()
        environ["RAW_URI"] = environ["REQUEST_URI"] = (parts.path or "/") + (
            f"?{parts.query}" if parts.query else ""
        )
        app_iter, status, response_headers = run_wsgi_app(self.app, environ, True)
        try:
            payload = b"".join(app_iter)
        finally:
            close = getattr(app_iter, "close", None)
            if close is not None:
                close()
        return int(status.split(" ", 1)[0]), list(response_headers.items()), payload

    def _dynamodb(self, request: AWSPreparedRequest, data: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """A DynamoDB request straight to moto's DynamoDB responses, as the server's Flask view calls them."""
        prepared = AWSPreparedRequest(
            request.method, request.url, request.headers, data, request.stream_output
        )
        normalized = self._normalize(prepared)
        try:
            status, headers, body = self._dynamodb_dispatch(
                normalized, normalized.raw_url, dict(normalized.headers)
            )
        except ClientError as exc:  # as moto's Flask view answers it
            status, headers, body = 400, {}, exc.response["Error"]["Message"]
        payload = body.encode() if isinstance(body, str) else bytes(body or b"")
        return int(status), [(str(k), str(v)) for k, v in headers.items()], payload


@contextlib.contextmanager
def in_process_clients(endpoint_url: str) -> Iterator[InProcessTransport]:
    """Every botocore client created meanwhile in this process for ``endpoint_url`` (boto3's and
    pynamodb's alike: both create theirs through ``botocore.session.Session.create_client``) is served
    in process. For a benchmark that runs production code in the local cloud's own process (``berth
    bench pass``): the code and its SDK calls are unchanged, only the loopback socket, the server thread
    each connection gets (moto's werkzeug server closes every connection) and Flask's routing are gone.
    Clients created before it, or in other processes, still use the socket."""
    transport = InProcessTransport(endpoint_url)
    original = Session.create_client

    @functools.wraps(original)
    def create_client(self: Session, *args: Any, **kwargs: Any) -> Any:
        client = original(self, *args, **kwargs)
        if transport.handles(str(client.meta.endpoint_url)):
            client.meta.events.register("before-send", transport)  # type: ignore[arg-type]
        return client

    Session.create_client = create_client  # type: ignore[method-assign]
    try:
        yield transport
    finally:
        Session.create_client = original  # type: ignore[method-assign]
