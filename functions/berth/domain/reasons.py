"""A failed attempt's reason as Berth stores it: Berth's own words, never job output. Pure.

A reason lands in the Jobs and JobEvents tables, the ``Berth Job State Change`` event and the Step
Functions history (``SendTaskFailure``'s cause), all kept and readable by more people than the job's
log. Job output may hold anything the job printed, its secrets among it, so it never goes there:
the reason of an attempt that ran (the agent reported an exit code) is rebuilt here from the failure
kind and the exit code, whatever text the agent sent, and says where the output is
(``berth logs <id>``). The agent already writes its messages this way
(``berth_agent.executors.base.classify``); the control plane does not rely on it.

Text an agent sends about an attempt that never ran (no exit code: staging, a start error, an
agent error) is the agent's own words about its own work (an S3 error, a missing command): kept,
with control characters replaced by spaces and cut to ``MAX_AGENT_TEXT`` characters.

The control plane holds no secret values (the API and agent API roles cannot read them; a job's
secrets are read on its host or by ECS, with the job's own rights), so it cannot look for them by
value: not storing output is what keeps them out.
"""

from __future__ import annotations

import re
import signal

from berth.domain.workflow import Failure

MAX_AGENT_TEXT = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]+")
#: What an attempt that ran and failed as each kind did, before its exit code.
_KIND_WORDS = {
    Failure.OOM: "out of memory",
    Failure.TIMEOUT: "stopped at its timeout_minutes limit",
    Failure.BAD_IMAGE: "the image could not be pulled",
    Failure.AGENT_ERROR: "the container runtime or the agent failed",
    Failure.STAGING: "its inputs could not be staged",
    Failure.INVALID_SPEC: "the spec could not be run",
    Failure.PREEMPTED: "stopped for a preemption",
}


def logs_pointer(job_id: str) -> str:
    return f"see `berth logs {job_id}`"


def exit_words(returncode: int | None) -> str:
    """``exited with code 3``, ``killed by signal 9 (SIGKILL)``, ``exited with code 137 (128 +
    SIGKILL)`` (a container's way of saying it was killed)."""
    if returncode is None:
        return "ended without an exit code"
    if returncode < 0:
        name = _signal_name(-returncode)
        return f"killed by signal {-returncode}" + (f" ({name})" if name else "")
    name = _signal_name(returncode - 128) if returncode > 128 else ""
    return f"exited with code {returncode}" + (f" (128 + {name})" if name else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return ""


def agent_text(text: str) -> str:
    """An agent's own words as they may be stored: control characters as spaces, at most
    ``MAX_AGENT_TEXT`` characters."""
    flat = _CONTROL.sub(" ", text).strip()
    return flat if len(flat) <= MAX_AGENT_TEXT else flat[: MAX_AGENT_TEXT - 1] + "…"


def attempt_failure_detail(job_id: str, failure: Failure, exit_code: int | None, message: str) -> str:
    """The detail of a failed (or canceled) attempt's report, as the control plane passes it on:
    for an attempt that ran, the kind and the exit code and where its output is; for one that did
    not, the agent's words (``agent_text``), or the failure's name when it sent none."""
    if exit_code is None:
        return agent_text(message) or failure.value
    if failure is Failure.CANCELED:
        return f"stopped on cancel ({exit_words(exit_code)})"
    ended = exit_words(exit_code)
    words = _KIND_WORDS.get(failure)
    return f"{words} ({ended}); {logs_pointer(job_id)}" if words else f"{ended}; {logs_pointer(job_id)}"
