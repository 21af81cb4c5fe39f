"""Per-tenant request rate limit: one tenant cannot spend the stage's throttle for everyone."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from berth.domain.errors import RateLimited
from berth.domain.ports import RateCounter


@dataclass(frozen=True)
class RateLimiter:
    """At most ``requests`` per ``window_s`` seconds per tenant (fixed windows, counted in the store,
    so the limit holds across every concurrent Lambda instance)."""

    counter: RateCounter
    requests: int
    window_s: int
    clock: Callable[[], datetime]

    def check(self, tenant: str) -> None:
        now = self.clock().timestamp()
        window = int(now // self.window_s)
        ends = (window + 1) * self.window_s
        # Keep the counter one extra window, then let the table's TTL drop it.
        if self.counter.take(tenant, window, self.requests, expires_at=ends + self.window_s):
            return
        retry_after = max(1, math.ceil(ends - now))
        raise RateLimited(
            f"tenant {tenant!r} sent more than {self.requests} requests in {self.window_s} s; "
            f"retry after {retry_after} s",
            retry_after_s=retry_after,
            details={"limit": self.requests, "window_s": self.window_s, "retry_after_s": retry_after},
        )
