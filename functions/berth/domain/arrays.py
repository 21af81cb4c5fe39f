"""Job arrays: one submitted spec run as N tasks, each a job of its own. Pure.

An array is stored as one parent record (``JobArray``) whose tasks are created later, in chunks, by
the expander (``logic/arrays.py``, docs/workflow.md). Task ``i`` is the job ``<array id>:<i>``; its spec
is the array's spec without ``array``, with ``array_task`` set and ``{name}`` of its parameters
substituted in its command.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from berth.domain.job import iso
from berth.domain.job_spec import ArrayTask, JobSpec
from berth.domain.status import JobStatus

#: Tasks of one array spread their state counters over this many shard items, so parallel state
#: changes of one array's tasks rarely contend on one item.
COUNTER_SHARDS = 16

ARRAY_ID_RE = r"^j-[0-9a-z]{26}$"
TASK_ID_RE = r"^j-[0-9a-z]{26}:[0-9]{1,5}$"
_TASK = re.compile(r"^(?P<array>j-[0-9a-z]{26}):(?P<index>[0-9]{1,5})$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")


def task_id(array_id: str, index: int) -> str:
    return f"{array_id}:{index}"


def parse_task_id(job_id: str) -> tuple[str, int] | None:
    """``(array id, index)`` of a task id, else None."""
    m = _TASK.fullmatch(job_id)
    return None if m is None else (m["array"], int(m["index"]))


def order_id(job_id: str) -> str:
    """``job_id`` as it sorts among jobs: a task's index zero-padded to five digits (an array has at
    most 10,000 tasks), so task 2 comes before task 10 and a sweep is served in its own order; any
    other id as it is."""
    task = parse_task_id(job_id)
    return job_id if task is None else f"{task[0]}:{task[1]:05d}"


def aws_name(job_id: str) -> str:
    """A job id as AWS names allow it (Step Functions execution, Batch job, log stream, STS session
    and SourceIdentity names refuse ``:``): a task's ``:`` becomes ``_`` (no job id has ``_``)."""
    return job_id.replace(":", "_")


def from_aws_name(name: str) -> str:
    return name.replace("_", ":")


def counter_shard(index: int) -> int:
    return index % COUNTER_SHARDS


def param_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def substitute(command: list[str], params: dict[str, str]) -> list[str]:
    """``{name}`` replaced by the parameter's value in each argument; other braces stay as written."""
    return [_PLACEHOLDER.sub(lambda m: params.get(m[1], m[0]), arg) for arg in command]


def task_spec(spec: JobSpec, array_id: str, index: int, size: int, params: dict[str, Any] | None) -> JobSpec:
    """The spec of task ``index`` of the array ``array_id`` submitted as ``spec``."""
    texts = {k: param_text(v) for k, v in (params or {}).items()}
    task = ArrayTask(array_id=array_id, index=index, size=size, params=texts)
    command = substitute(spec.command, texts)
    return spec.model_copy(update={"array": None, "array_task": task, "command": command})


def array_parent_spec(spec: JobSpec) -> JobSpec:
    """What the parent record keeps: the spec with ``array: {size: N}`` (parameters live in chunks)."""
    assert spec.array is not None
    kept = spec.array.model_copy(update={"size": spec.array.count, "parameters": None})
    return spec.model_copy(update={"array": kept})


def counts_from_deltas(size: int, deltas: dict[str, int]) -> dict[str, int]:
    """Every task starts QUEUED (created or not yet); the counters hold each status's net moves."""
    counts = {str(s): int(deltas.get(str(s), 0)) for s in JobStatus}
    counts[str(JobStatus.QUEUED)] += size
    return {k: v for k, v in counts.items() if v}


_ACTIVE_ORDER = (
    JobStatus.RUNNING,
    JobStatus.STARTING,
    JobStatus.RETRYING,
    JobStatus.CANCELING,
    JobStatus.QUEUED,
)


def array_status(counts: dict[str, int]) -> JobStatus:
    """The array's own status: the most advanced active state of any task, else how it ended
    (FAILED if any task failed, CANCELED if any was canceled, else COMPLETED)."""
    for s in _ACTIVE_ORDER:
        if counts.get(str(s)):
            return s
    for s in (JobStatus.FAILED, JobStatus.CANCELED):
        if counts.get(str(s)):
            return s
    return JobStatus.COMPLETED


class JobArray(BaseModel):
    """The parent record of an array."""

    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str
    owner: str
    actor: str | None = None
    spec: JobSpec
    size: int
    created_at: datetime
    updated_at: datetime
    #: How many tasks (indexes 0..expanded-1) exist as jobs.
    expanded: int = 0
    cancel_requested: bool = False
    cancel_reason: str | None = None
    #: Tasks below this index have been asked to cancel (resumes a bulk cancel).
    canceled_upto: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    #: Start index of each stored parameter chunk (empty: a ``size`` array).
    chunks: list[int] = Field(default_factory=list)

    @property
    def is_array(self) -> bool:
        return True

    @property
    def done(self) -> bool:
        """Every task exists and the cancel (if any) reached every one of them."""
        return self.expanded >= self.size and (not self.cancel_requested or self.canceled_upto >= self.size)

    def public(self) -> dict[str, Any]:
        status = array_status(self.counts)
        ended = sum(self.counts.get(str(s), 0) for s in JobStatus if s.is_terminal)
        reason = f"{ended} of {self.size} tasks ended; {self.expanded} created"
        if self.cancel_requested:
            reason = f"cancel requested ({self.cancel_reason}); " + reason
        return {
            "id": self.id,
            "tenant": self.tenant,
            "owner": self.owner,
            "actor": self.actor,
            "status": str(status),
            "reason": reason,
            "spec": self.spec.model_dump(mode="json", exclude_none=True),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "site": None,
            "placement": None,
            "attempts": 0,
            "cost_usd": 0.0,
            "array": {
                "size": self.size,
                "counts": dict(sorted(self.counts.items())),
                "created": self.expanded,
            },
        }
