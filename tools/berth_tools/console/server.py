"""The console's local server: the pages (package data, nothing fetched at run time) and ``/api/...``
forwarded to the Berth API, signed with SigV4 by the CLI's own client (``berth_tools.client``), like
``kubectl proxy``. The browser never sees a credential; ``guard`` decides what is let through."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from berth_tools.console.guard import MAX_BODY_BYTES, Refusal, api_path, check_request

#: The files the console serves, by URL path: (package file, content type). Nothing else is served.
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/pages.js": ("pages.js", "text/javascript; charset=utf-8"),
}
#: Only the console's own files, no inline script or style, no frames, no other site.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Api(Protocol):
    """The signing client (``BerthClient.call``): a parsed JSON answer, or ``ClientError``."""

    def call(self, method: str, path: str, **kw: Any) -> Any: ...


@dataclass(frozen=True)
class ConsoleInfo:
    """What the header shows: where requests go and as whom (no secret)."""

    api_url: str
    profile: str | None
    region: str


def static_file(name: str) -> bytes:
    return (resources.files("berth_tools.console") / "static" / name).read_bytes()


def make_handler(api: Api, info: ConsoleInfo, port_of: Any) -> type[BaseHTTPRequestHandler]:
    """The request handler class; ``port_of()`` is the port the server listens on."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "berth-ui"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the CLI prints the URL
            return

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in SECURITY_HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, payload: Any) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _refuse(self, r: Refusal) -> None:
            self._json(r.status, {"error": {"code": r.code, "message": r.message, "details": None}})

        def _serve(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            refusal = check_request(self.command, self.path, headers, port_of())
            if refusal is not None:
                return self._refuse(refusal)
            url = urlsplit(self.path)
            if url.path.startswith("/api/"):
                return self._forward(url.path, url.query)
            if self.command not in ("GET", "HEAD"):
                return self._refuse(Refusal(405, "MethodNotAllowed", "pages are read with GET"))
            if url.path == "/console.json":
                return self._json(200, info.__dict__)
            found = STATIC.get(url.path)
            if found is None:
                return self._refuse(Refusal(404, "NotFound", "no such page"))
            self._send(200, static_file(found[0]), found[1])

        def _forward(self, path: str, query: str) -> None:
            target = api_path(self.command, path)
            if target is None:
                return self._refuse(Refusal(404, "NotFound", "not an API route the console uses"))
            body = None
            if self.command in ("POST", "PUT"):
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    return self._refuse(Refusal(413, "TooLarge", "the body is too large"))
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    return self._refuse(Refusal(400, "BadJson", "the body is not JSON"))
            from berth_tools.client import ClientError

            try:
                answer = api.call(self.command, target, query=dict(parse_qsl(query)), body=body)
            except ClientError as exc:
                status = exc.status if 400 <= exc.status < 600 else 502
                return self._json(
                    status, {"error": {"code": exc.code, "message": exc.message, "details": exc.details}}
                )
            self._json(200, answer)

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _serve

    return Handler


class ConsoleServer:
    """The console on 127.0.0.1 (``port`` 0: any free port), served from a thread or the foreground."""

    def __init__(self, api: Api, info: ConsoleInfo, port: int = 8765) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), make_handler(api, info, lambda: self.port))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> ConsoleServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="berth-ui", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
