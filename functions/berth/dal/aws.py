"""SDK clients for the adapters: each from a session of its own, built from the environment as it is
now (never boto3's process-wide default session, which keeps the first environment it saw; the
local cloud runs every function in one process, each with its own environment)."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

#: HTTP connections per client (botocore's default is 10): the scheduler answers placement tokens
#: from its apply pool's threads at once (``berth.logic.scheduler_service.APPLY_WORKERS``).
MAX_POOL_CONNECTIONS = 32


def client(service: str, **kwargs: Any) -> Any:
    kwargs.setdefault("config", Config(max_pool_connections=MAX_POOL_CONNECTIONS))
    return boto3.session.Session().client(service, **kwargs)  # type: ignore[call-overload]
