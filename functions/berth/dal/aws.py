"""SDK clients for the adapters, from one boto3 session per process (a Lambda sandbox runs one
event at a time; the session is built from the environment the first time a client is needed)."""

from __future__ import annotations

from functools import cache
from typing import Any

import boto3


@cache
def session() -> boto3.session.Session:
    return boto3.session.Session()


def client(service: str, **kwargs: Any) -> Any:
    return session().client(service, **kwargs)  # type: ignore[call-overload]
