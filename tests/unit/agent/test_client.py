"""The agent API client against a fake agent API on 127.0.0.1 that verifies SigV4 like the gateway."""

from __future__ import annotations

import hmac
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

from berth_agent.client import AgentApiError, AgentClient, AlreadyClaimed, Canceled, Fenced, Unreachable

CREDS = Credentials("AKIDHOST01", "host-secret", "host-session-token")
AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/]+)/\d{8}/([^/]+)/execute-api/aws4_request, "
    r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$"
)


class _Exact(SigV4Auth):
    def __init__(self, signed: list[str]) -> None:
        super().__init__(CREDS, "execute-api", "eu-west-1")
        self._signed = signed

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        out = HTTPHeaders()
        for name in self._signed:
            out[name] = request.headers[name]
        return out


def signature_ok(method: str, url: str, headers: dict[str, str], body: bytes) -> bool:
    m = AUTH.match(headers.get("Authorization", ""))
    if not m or m.group(1) != CREDS.access_key or m.group(2) != "eu-west-1":
        return False
    signed = m.group(3).split(";")
    if "x-amz-date" not in signed or "x-amz-security-token" not in signed:
        return False
    req = AWSRequest(method=method, url=url, data=body, headers={k: v for k, v in headers.items()})
    req.context["timestamp"] = headers["X-Amz-Date"]
    signer = _Exact(signed)
    expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
    return hmac.compare_digest(expected, m.group(4))


class FakeApi:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.script: list[tuple[int, Any, dict[str, str]]] = []  # answers to hand out first
        self.lock = threading.Lock()


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            url = f"http://{self.headers['Host']}{self.path}"
            if not signature_ok("POST", url, dict(self.headers.items()), body):
                self._send(403, {"error": {"code": "InvalidSignature", "message": "bad signature"}})
                return
            with fake.lock:
                fake.requests.append((self.path, json.loads(body)))
                status, payload, headers = fake.script.pop(0) if fake.script else (200, {"ok": self.path}, {})
            if status == 0:  # drop the connection without an answer
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self._send(status, payload, headers)

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}/prod"
    server.shutdown()
    server.server_close()


def _client(url: str, **kw: Any) -> tuple[AgentClient, list[float]]:
    sleeps: list[float] = []
    return AgentClient(url, "eu-west-1", CREDS, sleep=sleeps.append, timeout_s=5, **kw), sleeps


def test_protocol_calls_are_signed_and_shaped(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    client, _ = _client(url)
    inv = {
        "host_id": "gpu-01",
        "pool": "lab",
        "gpu_type": "H100",
        "gpu_ids": ["GPU-a"],
        "cpu": 32,
        "memory_gib": 256,
    }
    assert client.register(inv, agent_version="0.1.0") == {"ok": "/prod/v1/agent/register"}
    client.heartbeat(
        healthy=True, draining=False, attempts=[{"job_id": "j", "attempt": 1, "fencing_token": "t"}]
    )
    client.claim("j", 1, "t")
    client.report("j", 1, "t", "failed", exit_code=3, failure="nonzero_exit", message="x" * 5000)
    client.credentials("j", 1, "t")
    paths = [p for p, _ in fake.requests]
    assert paths == [
        f"/prod/v1/agent/{p}" for p in ("register", "heartbeat", "claim", "report", "credentials")
    ]
    bodies = [b for _, b in fake.requests]
    assert bodies[0] == {"inventory": inv, "agent_version": "0.1.0"}
    assert bodies[2] == {"job_id": "j", "attempt": 1, "fencing_token": "t"}
    assert (
        bodies[3]["event"] == "failed" and bodies[3]["exit_code"] == 3 and len(bodies[3]["message"]) == 2000
    )


def test_a_wrong_secret_is_refused_by_the_fake(api: tuple[FakeApi, str]) -> None:
    _, url = api
    client = AgentClient(url, "eu-west-1", Credentials("AKIDHOST01", "wrong", "host-session-token"))
    with pytest.raises(AgentApiError) as e:
        client.claim("j", 1, "t")
    assert e.value.status == 403 and e.value.code == "InvalidSignature"


@pytest.mark.parametrize(
    ("code", "cls"), [("Fenced", Fenced), ("AlreadyClaimed", AlreadyClaimed), ("Canceled", Canceled)]
)
def test_conflicts_are_typed_and_not_retried(
    api: tuple[FakeApi, str], code: str, cls: type[Exception]
) -> None:
    fake, url = api
    fake.script = [(409, {"error": {"code": code, "message": "no", "details": {"attempt": 2}}}, {})]
    client, sleeps = _client(url)
    with pytest.raises(cls) as e:
        client.claim("j", 1, "t")
    assert isinstance(e.value, AgentApiError) and e.value.details == {"attempt": 2}
    assert len(fake.requests) == 1 and sleeps == []


def test_transient_answers_are_retried_with_backoff(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    fake.script = [
        (503, {"error": {"code": "ServiceUnavailable", "message": "x"}}, {}),
        (429, {"error": {"code": "TooManyRequests", "message": "x"}}, {"Retry-After": "2"}),
        (0, None, {}),  # connection dropped
        (200, {"lease_expires_at": "t"}, {}),
    ]
    client, sleeps = _client(url, backoff_base_s=0.1, backoff_max_s=3)
    assert client.heartbeat(healthy=True, draining=False, attempts=[]) == {"lease_expires_at": "t"}
    assert len(fake.requests) == 4 and len(sleeps) == 3
    assert sleeps[1] == 2.0 and 0.05 <= sleeps[0] <= 0.1


def test_retries_run_out(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    fake.script = [(502, {"error": {"code": "BadGateway", "message": "x"}}, {})] * 3
    client, sleeps = _client(url, max_attempts=3)
    with pytest.raises(Unreachable) as e:
        client.report("j", 1, "t", "started")
    assert e.value.status == 502 and len(sleeps) == 2


def test_bad_request_is_not_retried(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    fake.script = [(400, {"error": {"code": "BadRequest", "message": "event"}}, {})]
    client, sleeps = _client(url)
    with pytest.raises(AgentApiError) as e:
        client.report("j", 1, "t", "exploded")
    assert type(e.value) is AgentApiError and e.value.code == "BadRequest" and sleeps == []


def test_nothing_listening() -> None:
    client, sleeps = _client("http://127.0.0.1:9", max_attempts=2)
    with pytest.raises(Unreachable):
        client.claim("j", 1, "t")
    assert len(sleeps) == 1
