"""The console's local server without a browser: what it forwards (signed by the CLI's client) and what
its guards refuse (foreign Host: DNS rebinding; foreign Origin or no console header: CSRF; methods and
routes the pages do not use)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from berth_tools.client import ClientError
from berth_tools.console.guard import api_path, check_request
from berth_tools.console.server import ConsoleInfo, ConsoleServer


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any], Any]] = []

    def call(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw.get("query") or {}, kw.get("body")))
        if path == "/v1/jobs/j-00000000000000000000000000":
            raise ClientError(404, "NotFound", "job not found")
        return {"ok": True, "path": path}


@pytest.fixture
def console() -> Iterator[tuple[ConsoleServer, FakeApi]]:
    api = FakeApi()
    server = ConsoleServer(api, ConsoleInfo("http://api", "alice", "us-east-1"), port=0).start()
    try:
        yield server, api
    finally:
        server.stop()


def _req(
    server: ConsoleServer, method: str, path: str, headers: dict[str, str] | None = None, body: Any = None
) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    hdrs = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    raw = resp.read()
    got = dict(resp.getheaders())
    conn.close()
    try:
        return resp.status, json.loads(raw), got
    except ValueError:
        return resp.status, raw.decode(), got


def test_reads_are_forwarded_and_pages_served_with_a_strict_policy(
    console: tuple[ConsoleServer, FakeApi],
) -> None:
    server, api = console
    status, body, _ = _req(server, "GET", "/api/v1/jobs?status=QUEUED&limit=100")
    assert status == 200 and body["path"] == "/v1/jobs"
    assert api.calls[-1] == ("GET", "/v1/jobs", {"status": "QUEUED", "limit": "100"}, None)
    status, body, _ = _req(server, "GET", "/api/v1/jobs/j-00000000000000000000000000")
    assert status == 404 and body["error"]["code"] == "NotFound"
    status, page, headers = _req(server, "GET", "/")
    assert status == 200 and '<script src="/app.js"' in page
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    assert _req(server, "GET", "/console.json")[1] == {
        "api_url": "http://api",
        "profile": "alice",
        "region": "us-east-1",
    }
    assert _req(server, "GET", "/../pyproject.toml")[0] == 404


def test_a_foreign_host_is_refused_dns_rebinding(console: tuple[ConsoleServer, FakeApi]) -> None:
    server, api = console
    for host in ("evil.example:8765", f"evil.example:{server.port}", "127.0.0.1:1"):
        status, body, _ = _req(server, "GET", "/api/v1/jobs", {"Host": host})
        assert (status, body["error"]["code"]) == (403, "ForeignHost")
    assert _req(server, "GET", "/", {"Host": f"localhost:{server.port}"})[0] == 200
    assert api.calls == []


def test_changes_need_the_consoles_origin_and_header(console: tuple[ConsoleServer, FakeApi]) -> None:
    server, api = console
    cancel = "/api/v1/jobs/j-0123456789abcdefghjkmnpqrs/cancel"
    origin = f"http://127.0.0.1:{server.port}"
    ok = {"Origin": origin, "X-Berth-Console": "1"}
    cases = [
        ({"Origin": "https://evil.example", "X-Berth-Console": "1"}, 403, "ForeignOrigin"),
        ({"Origin": origin}, 403, "NotFromConsole"),  # a cross-site form cannot set the header
        ({"X-Berth-Console": "1"}, 403, "NotFromConsole"),
        ({**ok, "Sec-Fetch-Site": "cross-site"}, 403, "ForeignOrigin"),
    ]
    for headers, status, code in cases:
        got, body, _ = _req(server, "POST", cancel, headers)
        assert (got, body["error"]["code"]) == (status, code), headers
    assert api.calls == []
    assert _req(server, "POST", cancel, ok)[0] == 200
    assert api.calls[-1][:2] == ("POST", "/v1/jobs/j-0123456789abcdefghjkmnpqrs/cancel")
    assert _req(server, "PUT", "/api/v1/hosts/h-1/drain", ok, {"drain": True})[0] == 200
    assert api.calls[-1] == ("PUT", "/v1/hosts/h-1/drain", {}, {"drain": True})


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("DELETE", "/api/v1/circuits/us-east-1", 405),
        ("PATCH", "/api/v1/jobs", 405),
        ("POST", "/api/v1/jobs", 404),  # no submit from the console
        ("PUT", "/api/v1/policy", 404),
        ("GET", "/api/v1/agent/heartbeat", 404),
        ("POST", "/", 405),
    ],
)
def test_methods_and_routes_the_pages_do_not_use_are_refused(
    console: tuple[ConsoleServer, FakeApi], method: str, path: str, status: int
) -> None:
    server, api = console
    ok = {"Origin": f"http://127.0.0.1:{server.port}", "X-Berth-Console": "1"}
    assert _req(server, method, path, ok, {})[0] == status
    assert api.calls == []


def test_the_pure_rules() -> None:
    assert check_request("GET", "/", {"host": "127.0.0.1:9"}, 9) is None
    assert check_request("GET", "/", {"host": "127.0.0.1:9", "sec-fetch-site": "none"}, 9) is None
    assert api_path("GET", "/api/v1/jobs/x/../../agent") is None
    assert api_path("GET", "/v1/jobs") is None
    assert api_path("GET", "/api/v1/usage") == "/v1/usage"


def test_the_console_binds_loopback_only(console: tuple[ConsoleServer, FakeApi]) -> None:
    server, _ = console
    assert server.httpd.server_address[0] == "127.0.0.1"
