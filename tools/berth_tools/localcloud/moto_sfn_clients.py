"""moto 5.2.5's Step Functions build one SDK client per Lambda task, not one per task run.

moto (LocalStack's interpreter) calls ``boto_client_for(region, "lambda", credentials)`` for every
``lambda:invoke`` task state it runs, and each call builds a new boto3 client: a botocore session,
the service model loaded and a client class made, which was about 7 % of the local cloud's busy time
under `berth bench api` (every job's workflow runs several Lambda tasks). The client it builds depends
only on the region, the service, whether moto intercepts botocore in-process and the server's port
(its fixed dummy keys and its config are the same every time; the credentials argument is not used),
and a botocore client is safe to share between threads once built. The patch replaces the name in
``lambda_eval_utils`` (the only Step Functions integration Berth's state machines use: ``lambda:invoke``
and ``lambda:invoke.waitForTaskToken``) with one that builds each distinct client once, under a lock
(building clients is not thread-safe), and answers the same client afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_TARGET = "moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils:boto_client_for"

_clients: dict[tuple[str, str, bool, int], Any] = {}
_lock = threading.Lock()
stats = {"built": 0, "reused": 0}


def _key(region: str, service: str) -> tuple[str, str, bool, int]:
    stubber = moto_compat.surface("moto.core.models:botocore_stubber")
    port = moto_compat.surface("moto.settings:moto_server_port")
    return region, service, bool(stubber.enabled), int(port())


def _cached(original: Callable[..., Any]) -> Callable[..., Any]:
    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        key = _key(region, service)
        with _lock:
            client = _clients.get(key)
            if client is not None:
                stats["reused"] += 1
                return client
            client = _clients[key] = original(region, service, state_credentials)
            stats["built"] += 1
            return client

    boto_client_for._berth_cached = True  # type: ignore[attr-defined]
    return boto_client_for


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo (which also forgets the clients)."""
    current = moto_compat.surface(_TARGET)
    if getattr(current, "_berth_cached", False):
        return lambda: None
    patch = moto_compat.replace(_TARGET, _cached(current))

    def undo() -> None:
        patch.undo()
        with _lock:
            _clients.clear()

    return undo
