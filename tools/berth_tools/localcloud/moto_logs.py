"""moto 5.2.5's CloudWatch Logs keeps every event for good: a bound for the functions' own log streams.

moto never applies a log group's retention (the template sets 30 days), so every log line a function
writes stays in memory for the local cloud's life. An idle local cloud still invokes functions all the
time (the scheduler's timer, the agents' heartbeats through the agent API), each invocation storing
its START, END and REPORT lines and its own log records, so the store only grows
(docs/local-cloud.md, "Memory over an idle hour").

The patch (declared in ``moto_compat.SURFACES``) wraps ``LogStream.put_log_events``: a stream of a
Lambda function's log group keeps its newest ``FUNCTION_EVENTS_KEPT`` events, the older ones dropped
as retention would drop them on AWS, only sooner. A function's log group is ``/aws/lambda/<name>``
by default, or the group its ``LoggingConfig`` names: Berth's CDK app gives every function a group
of its own (``Berth-...FunctionLogGroup...``, 30 days), so the local Lambda runtime names each group
it writes a function's logs to (``function_group``). Until it did, the bound applied to no Berth
function at all. Nothing in Berth reads a function's log group; the jobs' own streams
(``/berth/jobs/<tenant>``, read by ``GET /v1/jobs/{id}/logs``) and every other group keep all their
events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from berth_tools.localcloud import moto_compat

_PUT = "moto.logs.models:LogStream.put_log_events"
#: Events a function's log stream keeps (one sandbox's stream: a few minutes of the busiest idle
#: function's invocations at the local timings).
FUNCTION_EVENTS_KEPT = 1_000
FUNCTION_GROUP_PREFIX = "/aws/lambda/"
#: Log groups a function's ``LoggingConfig`` names (the Lambda runtime tells: ``function_group``).
_function_groups: set[str] = set()


def function_group(name: str) -> None:
    """``name`` is a Lambda function's log group: its streams are bounded as ``/aws/lambda/`` ones."""
    _function_groups.add(name)


def is_function_group(name: str) -> bool:
    return name.startswith(FUNCTION_GROUP_PREFIX) or name in _function_groups


def trim(stream: Any, kept: int | None = None) -> int:
    """Drop the oldest events of a function's log `stream` beyond `kept` (``FUNCTION_EVENTS_KEPT``);
    how many were dropped."""
    if not is_function_group(str(getattr(stream.log_group, "name", ""))):
        return 0
    extra = len(stream.events) - (FUNCTION_EVENTS_KEPT if kept is None else kept)
    if extra <= 0:
        return 0
    del stream.events[:extra]
    return extra


def _bounded(original: Callable[..., str]) -> Callable[..., str]:
    def put_log_events(self: Any, log_events: list[dict[str, Any]]) -> str:
        token = original(self, log_events)
        trim(self)
        return token

    put_log_events._berth_bounded = True  # type: ignore[attr-defined]
    put_log_events.__wrapped__ = original  # type: ignore[attr-defined]
    return put_log_events


def install() -> Callable[[], None]:
    """Apply the patch (idempotent); returns the undo."""
    current = moto_compat.surface(_PUT)
    if getattr(current, "_berth_bounded", False):
        return lambda: None
    return moto_compat.replace(_PUT, _bounded(current)).undo
