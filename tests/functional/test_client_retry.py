"""The CLI's client retries exactly what docs/api.md says: connection failures, 502/503/504 and 429
except QuotaExceeded; nothing else. Against a scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from berth_tools.client import BerthClient, ClientConfig, ClientError

Script = list[tuple[int, dict[str, Any]]]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Script, list[str]]]:
    for k, v in {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    script: Script = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            status, body = script.pop(0) if script else (200, {"ok": True})
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script, seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def _err(code: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": code, "details": None}}


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (429, "RequestInProgress"),
        (429, "TooManyRequests"),
        (502, "BadGateway"),
        (503, "ServiceUnavailable"),
        (504, "x"),
    ],
)
def test_transient_answers_are_retried(server: tuple[str, Script, list[str]], status: int, code: str) -> None:
    url, script, seen = server
    script += [(status, _err(code)), (status, _err(code))]
    client = BerthClient(ClientConfig(api_url=url, region="us-east-1"))
    assert client.call("GET", "/v1/jobs") == {"ok": True}
    assert len(seen) == 3


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (429, "QuotaExceeded"),
        (500, "InternalServerError"),
        (400, "BadRequest"),
        (409, "Conflict"),
        (404, "NotFound"),
    ],
)
def test_other_answers_are_not_retried(server: tuple[str, Script, list[str]], status: int, code: str) -> None:
    url, script, seen = server
    script += [(status, _err(code))]
    client = BerthClient(ClientConfig(api_url=url, region="us-east-1"))
    with pytest.raises(ClientError) as exc:
        client.call("GET", "/v1/jobs")
    assert exc.value.status == status and exc.value.code == code
    assert len(seen) == 1


def test_retries_stop_after_four_tries_with_the_last_error(server: tuple[str, Script, list[str]]) -> None:
    url, script, seen = server
    script += [(503, _err("ServiceUnavailable"))] * 6
    client = BerthClient(ClientConfig(api_url=url, region="us-east-1"))
    with pytest.raises(ClientError) as exc:
        client.call("GET", "/v1/jobs")
    assert exc.value.status == 503 and len(seen) == 4


def test_connection_failures_are_retried_then_reported_unreachable(
    server: tuple[str, Script, list[str]],
) -> None:
    client = BerthClient(ClientConfig(api_url="http://127.0.0.1:9", region="us-east-1"), timeout_s=1)
    with pytest.raises(ClientError) as exc:
        client.call("GET", "/v1/jobs")
    assert exc.value.code == "Unreachable"
