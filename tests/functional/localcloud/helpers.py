"""Signed HTTP calls to the front door, with knobs to break the signature in specific ways."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any
from unittest import mock

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def sign(
    method: str,
    url: str,
    key: str,
    secret: str,
    body: bytes = b"",
    *,
    region: str = "us-east-1",
    service: str = "execute-api",
    at: datetime | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    signer = SigV4Auth(Credentials(key, secret), service, region)
    if at is None:
        signer.add_auth(request)
    else:
        with mock.patch("botocore.auth.get_current_datetime", return_value=at):
            signer.add_auth(request)
    return dict(request.headers.items())


def call(
    method: str, url: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, data=body or None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, head, raw = response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        status, head, raw = exc.code, dict(exc.headers.items()), exc.read()
    try:
        return status, head, json.loads(raw) if raw else None
    except ValueError:
        return status, head, raw.decode(errors="replace")
