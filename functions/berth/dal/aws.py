"""SDK clients for the adapters, from one boto3 session per process (a Lambda sandbox runs one
event at a time; the session is built from the environment the first time a client is needed)."""

from __future__ import annotations

from functools import cache
from typing import Any

import boto3
from botocore.config import Config

#: HTTP connections per client (botocore's default is 10): the scheduler answers placement tokens
#: from its apply pool's threads at once (``berth.logic.scheduler_service.APPLY_WORKERS``).
MAX_POOL_CONNECTIONS = 32


@cache
def session() -> boto3.session.Session:
    return boto3.session.Session()


def client(service: str, **kwargs: Any) -> Any:
    kwargs.setdefault("config", Config(max_pool_connections=MAX_POOL_CONNECTIONS))
    return session().client(service, **kwargs)  # type: ignore[call-overload]
