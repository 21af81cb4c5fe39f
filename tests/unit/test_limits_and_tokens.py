"""Pure parts of issue 12: the rate limiter's windows and Retry-After, and page-token signing."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from berth.dal.page_tokens import PageTokenCodec
from berth.domain.errors import InvalidRequest, RateLimited
from berth.logic.ratelimit import RateLimiter


class FakeCounter:
    def __init__(self) -> None:
        self.hits: dict[tuple[str, int], int] = {}
        self.expiry: dict[tuple[str, int], int] = {}

    def take(self, tenant: str, window: int, limit: int, expires_at: int) -> bool:
        key = (tenant, window)
        if self.hits.get(key, 0) >= limit:
            return False
        self.hits[key] = self.hits.get(key, 0) + 1
        self.expiry[key] = expires_at
        return True


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def test_rate_limit_per_tenant_and_window() -> None:
    now = [1_000_000.2]
    counter = FakeCounter()
    limiter = RateLimiter(counter, requests=2, window_s=10, clock=lambda: _at(now[0]))
    limiter.check("vision")
    limiter.check("vision")
    with pytest.raises(RateLimited) as refused:
        limiter.check("vision")
    assert refused.value.retry_after_s == 10  # window [1_000_000, 1_000_010): 9.8 s left, rounded up
    limiter.check("nlp")  # another tenant is unaffected
    now[0] = 1_000_009.5
    with pytest.raises(RateLimited) as refused:
        limiter.check("vision")
    assert refused.value.retry_after_s == 1
    now[0] = 1_000_010.0  # next window
    limiter.check("vision")
    assert counter.expiry[("vision", 100_001)] == 1_000_030  # kept one extra window for the TTL


KEY = b"k" * 32


def test_page_token_round_trip_and_expiry() -> None:
    now = [1000.0]
    codec = PageTokenCodec(lambda: KEY, ttl_s=60, clock=lambda: now[0])
    token = codec.encode({"t": "vision", "k": {"a": 1}})
    assert codec.decode(token) == {"t": "vision", "k": {"a": 1}}
    now[0] = 1061.0
    with pytest.raises(InvalidRequest, match="expired"):
        codec.decode(token)


def test_page_token_from_another_key_or_tampered_is_refused() -> None:
    codec = PageTokenCodec(lambda: KEY)
    token = codec.encode({"t": "vision"})
    with pytest.raises(InvalidRequest):
        PageTokenCodec(lambda: b"x" * 32).decode(token)
    payload, mac = token.split(".")
    for bad in (payload, f"{payload}.", f".{mac}", f"{payload}x.{mac}", f"{payload}.{mac}!", "é.é", ""):
        with pytest.raises(InvalidRequest):
            codec.decode(bad)


def test_a_signed_but_pathological_payload_is_still_a_400() -> None:
    codec = PageTokenCodec(lambda: KEY)
    nested = base64.urlsafe_b64encode(b"[" * 100_000).rstrip(b"=")
    token = f"{nested.decode()}.{base64.urlsafe_b64encode(codec._mac(nested)).decode().rstrip('=')}"
    with pytest.raises(InvalidRequest):
        codec.decode(token)
    not_a_dict = base64.urlsafe_b64encode(json.dumps([1]).encode()).rstrip(b"=")
    token = f"{not_a_dict.decode()}.{base64.urlsafe_b64encode(codec._mac(not_a_dict)).decode().rstrip('=')}"
    with pytest.raises(InvalidRequest):
        codec.decode(token)
