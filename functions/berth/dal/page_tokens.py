"""Pagination tokens: HMAC-signed and expiring, so a client can neither forge nor keep one.

A token is ``<payload>.<mac>`` (both base64url): the payload is the JSON of the query it continues
(tenant, filter, DynamoDB's last evaluated key) with an expiry; the MAC is HMAC-SHA256 over it with a
key only the API holds. The MAC is checked (constant time) before anything is parsed, so a crafted
token (deeply nested JSON, a key into another partition) never reaches the parser or the store.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from pynamodb.exceptions import PutError

from berth.dal.errors import translated
from berth.dal.models import key_model
from berth.domain.errors import InvalidRequest, StoreUnavailable

KEY = "KEY#"
PAGE_TOKEN_KEY = "page-token-v1"
DEFAULT_TTL_S = 3600
_CONTEXT = b"berth-page-token-v1."


class DynamoSigningKey:
    """A 256-bit key kept in the Tenants table (``KEY#<name>``), created by the first caller that
    needs it (conditional put, so racing cold starts agree on one), cached per Lambda instance.
    Deleting the row rotates it: outstanding tokens then answer 400 and clients start over."""

    def __init__(self, table_name: str, name: str = PAGE_TOKEN_KEY) -> None:
        self._Row = key_model(table_name)
        self._name = name
        self._key: bytes | None = None

    def __call__(self) -> bytes:
        if self._key is None:
            self._key = self._load()
        return self._key

    def _load(self) -> bytes:
        pk = KEY + self._name
        with translated("read the page-token key"):
            try:
                secret = self._Row.get(pk, consistent_read=True).secret
            except self._Row.DoesNotExist:
                try:  # first use: create it; a racing instance may win, then both read its key
                    self._Row(pk, secret=secrets.token_bytes(32)).save(
                        condition=self._Row.pk.does_not_exist()
                    )
                except PutError as exc:
                    if exc.cause_response_code != "ConditionalCheckFailedException":
                        raise
                secret = self._Row.get(pk, consistent_read=True).secret
        if not secret or len(secret) < 32:
            raise StoreUnavailable("the page-token key row is damaged; delete it to rotate the key")
        return bytes(secret)


class PageTokenCodec:
    def __init__(
        self, key: Callable[[], bytes], ttl_s: int = DEFAULT_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = key
        self._ttl_s = ttl_s
        self._clock = clock

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key(), _CONTEXT + payload, hashlib.sha256).digest()

    def encode(self, data: dict[str, Any]) -> str:
        body = {"exp": int(self._clock()) + self._ttl_s, "d": data}
        payload = _b64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        return f"{payload.decode()}.{_b64(self._mac(payload)).decode()}"

    def decode(self, token: str) -> dict[str, Any]:
        """The data of a token this API issued and that has not expired; InvalidRequest otherwise."""
        bad = InvalidRequest("next_token is not valid for this query; start again without it")
        payload, dot, mac = token.partition(".")
        if not dot or not payload.isascii() or not mac.isascii():
            raise bad
        try:
            given = _unb64(mac)
        except (binascii.Error, ValueError) as exc:
            raise bad from exc
        if not hmac.compare_digest(given, self._mac(payload.encode())):
            raise bad
        try:
            body = json.loads(_unb64(payload))
        except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise bad from exc
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("exp"), int)
            or not isinstance(body.get("d"), dict)
        ):
            raise bad
        if body["exp"] < self._clock():
            raise InvalidRequest("next_token has expired; start the listing again without it")
        data: dict[str, Any] = body["d"]
        return data


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def _unb64(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4))
