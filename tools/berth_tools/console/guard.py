"""What the console's local server lets through. Pure.

The server listens on 127.0.0.1 and signs what it forwards with the user's credentials, so any page
the user's browser opens could try to use it: a hostile site by DNS rebinding (its own name resolved
to 127.0.0.1: the Host header gives it away) or by a cross-site request (the Origin header, or a form
post, which cannot set a custom header). So:

- every request must name the console itself in ``Host`` (``127.0.0.1:<port>`` or
  ``localhost:<port>``);
- a request with an ``Origin`` must come from the console's own origin, and one with
  ``Sec-Fetch-Site`` from the same origin (or be a navigation the user typed: ``none``);
- a request that changes something (POST, PUT) must carry ``Origin`` and ``X-Berth-Console: 1``
  (set by the console's script; a cross-site form cannot, and a cross-site script would need a CORS
  preflight the server never answers);
- only the API routes the pages use are forwarded: reads (GET) under ``/v1/`` except the agent API,
  cancel (POST ``/v1/jobs/{id}/cancel``) and drain (PUT ``/v1/hosts/{host}/drain``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Header the console's script sets on every request that changes something.
CSRF_HEADER = "X-Berth-Console"
#: The largest body the console forwards (a drain or a cancel is a few bytes).
MAX_BODY_BYTES = 16 * 1024

_READ = re.compile(r"^/v1/(?!agent(/|$))[A-Za-z0-9._~:@%/-]*$")
_WRITES = {
    "POST": re.compile(r"^/v1/jobs/j-[0-9a-z]{26}(:[0-9]{1,5})?/cancel$"),
    "PUT": re.compile(r"^/v1/hosts/[A-Za-z0-9][A-Za-z0-9._-]{0,62}/drain$"),
}


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    code: str
    message: str


def local_hosts(port: int) -> frozenset[str]:
    return frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})


def local_origins(port: int) -> frozenset[str]:
    return frozenset(f"http://{h}" for h in local_hosts(port))


def check_request(method: str, path: str, headers: dict[str, str], port: int) -> Refusal | None:
    """None when the request may be served; else why not. ``headers``: lower-case names."""
    host = headers.get("host", "")
    if host not in local_hosts(port):
        return Refusal(403, "ForeignHost", f"this console answers only to 127.0.0.1:{port}")
    origin = headers.get("origin")
    if origin is not None and origin not in local_origins(port):
        return Refusal(403, "ForeignOrigin", "requests from other sites are refused")
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return Refusal(403, "ForeignOrigin", "requests from other sites are refused")
    if method in ("GET", "HEAD"):
        return None
    if method not in _WRITES:
        return Refusal(405, "MethodNotAllowed", f"{method} is not used by the console")
    if origin is None or headers.get(CSRF_HEADER.lower()) != "1":
        return Refusal(403, "NotFromConsole", f"a change needs Origin and {CSRF_HEADER}: 1")
    return None


def api_path(method: str, path: str) -> str | None:
    """The Berth API path a console ``/api/...`` path forwards to (None: not one the console uses)."""
    if not path.startswith("/api/"):
        return None
    target = path[len("/api") :]
    if ".." in target.split("/"):
        return None
    if method in ("GET", "HEAD"):
        return target if _READ.match(target) else None
    rule = _WRITES.get(method)
    return target if rule is not None and rule.match(target) else None
