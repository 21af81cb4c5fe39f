"""Added AWS latency: every control-plane AWS call served by the local cloud waits L ms more.

The emulator answers in microseconds of wall time but milliseconds of CPU, all under one GIL; AWS
answers in 5-20 ms of wall time and no CPU of ours. So figures taken on the local cloud show the
emulator's cost, not the design's: a pass that applies its placements one call at a time looks no
slower than a parallel one. With `--aws-latency-ms L` (`berth bench pass`, `berth bench e2e`,
`berth local up`) each call first sleeps L ms in the calling thread (`time.sleep` releases the GIL, as
waiting on a socket does), so concurrent callers overlap their waits as they would against AWS.

The one place every control-plane call passes is `metering.Meter.observe` (the in-process transport
and the moto server's middleware both meter through it; AWS's own calls, local Batch's, are
unmetered and not delayed); it calls `wait()` before serving the request and outside every lock.
Production code (`functions/`) knows nothing of it.

`POST /_berth/latency` `{"ms": L}` on the moto endpoint (127.0.0.1 only, like `/_berth/meter`) sets it
in a running local cloud; `GET` answers it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

LATENCY_PATH = "/_berth/latency"
#: The most a call may be delayed (a typo must not make the local cloud unusable).
MAX_MS = 1000.0

_lock = threading.Lock()
_ms = 0.0


def set_ms(ms: float) -> float:
    """Delay every control-plane call by `ms` from now on (0: none); the previous value."""
    global _ms
    if not 0 <= ms <= MAX_MS:
        raise ValueError(f"AWS latency is between 0 and {MAX_MS:g} ms, not {ms}")
    with _lock:
        previous, _ms = _ms, float(ms)
    return previous


def get_ms() -> float:
    return _ms


def wait() -> None:
    """Sleep the configured latency (called once per metered request, holding no lock)."""
    ms = _ms
    if ms > 0:
        time.sleep(ms / 1000)


def handle_http(method: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """`GET|POST /_berth/latency`: (status, JSON answer)."""
    if method == "POST":
        try:
            ms = float(json.loads(body or b"{}")["ms"])
            set_ms(ms)
        except (ValueError, KeyError, TypeError) as exc:
            return 400, {"message": f'send {{"ms": L}} with 0 <= L <= {MAX_MS:g} ({exc})'}
    elif method != "GET":
        return 405, {"message": f"no {method} {LATENCY_PATH}"}
    return 200, {"ms": get_ms()}


def set_remote(endpoint_url: str, ms: float, timeout: float = 10.0) -> float:
    """Set the latency of the running local cloud whose AWS endpoint is `endpoint_url`; the new value."""
    request = urllib.request.Request(
        endpoint_url.rstrip("/") + LATENCY_PATH,
        data=json.dumps({"ms": ms}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return float(json.loads(response.read())["ms"])


def get_remote(endpoint_url: str, timeout: float = 10.0) -> float:
    """The latency the running local cloud at `endpoint_url` adds now."""
    with urllib.request.urlopen(endpoint_url.rstrip("/") + LATENCY_PATH, timeout=timeout) as response:
        return float(json.loads(response.read())["ms"])
