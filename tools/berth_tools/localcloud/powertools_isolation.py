"""Give each in-process Lambda invocation its own Powertools "current event".

Powertools' event handler keeps the request being resolved in a class attribute shared by every
resolver in the process (``BaseRouter.current_event = ...`` in ``resolve``; route functions read
``app.current_event``). On Lambda each function is its own process, so that is harmless. In the local
cloud every function runs in one process (`lambda_runtime`), and the API and agent-API functions resolve
requests at the same time on different threads: a job submit could read a heartbeat's headers (an
``Idempotency-Key`` lost, so a retried submit created a second job) or its identity (a 403).

The attribute is made a per-context value: a data descriptor on ``BaseRouter``'s metaclass intercepts the
class-level assignment and read, and a property on the class serves instances. Each invocation runs in
its own copy of a `contextvars` context (`lambda_runtime`), so it sees only the event it resolves. Outside
an invocation (unit tests calling a handler directly) the behaviour is Powertools' own.
"""

from __future__ import annotations

import contextvars
from typing import Any

_CURRENT_EVENT: contextvars.ContextVar[Any] = contextvars.ContextVar("powertools_current_event", default=None)
_ROUTER = "aws_lambda_powertools.event_handler.api_gateway"


class _PerContextEvent:
    """``current_event`` read and written through the invocation's context."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return _CURRENT_EVENT.get()

    def __set__(self, obj: Any, value: Any) -> None:
        _CURRENT_EVENT.set(value)


def install() -> None:
    """Idempotent. Must run before handlers resolve requests concurrently (`lambda_runtime.install`)."""
    import importlib

    router = importlib.import_module(_ROUTER).BaseRouter
    meta = type(router)
    if isinstance(meta.__dict__.get("current_event"), _PerContextEvent):
        return
    # Instances (``self.current_event``): a property on the class, set while the metaclass is the old one.
    descriptor = _PerContextEvent()
    router.current_event = property(descriptor.__get__, descriptor.__set__)
    # The class (``BaseRouter.current_event = event``): a data descriptor on a metaclass of its own.
    router.__class__ = type("PerContextRouterMeta", (meta,), {"current_event": _PerContextEvent()})
