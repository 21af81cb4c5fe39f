"""A gang in the cloud (an AWS Batch multi-node parallel job) fails fast when one node fails.

Batch ends a multi-node parallel job when its main node exits (its status is the main node's), and
stops the other nodes then. A child node that fails leaves the job RUNNING: its peers usually block
in a collective until their timeout, on instances that are all billed. So a Batch state change of a
gang's node (``<batch job id>#<index>``, same queue and job name as the job) that says the node
FAILED (not with exit 0) makes Berth terminate the whole Batch job, with the reason
``GANG_NODE_FAILED`` naming the node, its exit and Batch's reason for it: the attempt then fails as
that node's ``NonZeroExit`` (the job's retry rules), or, when the node's instance went away or found
no capacity, as the cloud's ``SpotInterruption`` / ``Capacity`` (``berth.domain.cloud.failed_outcome``).
As for every event, nothing is trusted from it: the node and the job are described first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from berth.domain.cloud import (
    GANG_NODE_FAILED,
    TERMINATED_BY_BERTH,
    BatchJob,
    BatchStatus,
    gang_node_reason,
    parse_node_job_id,
)
from berth.domain.job import Job
from berth.domain.placement import CloudPlacement
from berth.domain.ports import BatchGateway

#: The main node of the gangs Berth submits (their definitions' ``mainNode``).
MAIN_NODE = 0


def node_failure_reason(index: int, node: BatchJob) -> str | None:
    """The reason to end a gang for its node ``index`` as ``node`` is now, or None when that node's
    state ends nothing: still running, succeeded, the main node (Batch ends the job itself), or
    stopped because Berth ended the job already."""
    if index == MAIN_NODE or node.status is not BatchStatus.FAILED:
        return None
    if node.status_reason.startswith((TERMINATED_BY_BERTH, GANG_NODE_FAILED)) or node.exit_code == 0:
        return None
    return gang_node_reason(index, node)


def on_node_event(
    batch: BatchGateway,
    job: Job,
    placement: CloudPlacement,
    node_id: str,
    states: Mapping[str, BatchJob | None],
    record_stream: Callable[[Job, BatchJob, int], Job] | None = None,
) -> str:
    """Reconcile one node's state change of the job's current gang: ``gang-failed`` when it ended the
    gang, ``node`` when the node's state changes nothing, ``stale`` for a node of another Batch job.
    ``states``: what the event's batch already described (others are described here).
    ``record_stream``: records a Batch job's log stream as its attempt's stream of a rank: each node's
    as its rank's (``GET /v1/jobs/{id}/logs?rank=N``); the main node's is also the gang's (rank 0,
    what the route reads by default), recorded from its own events in case DescribeJobs of the gang
    names none."""
    parsed = parse_node_job_id(node_id)
    if parsed is None or job.run.attempt.batch_job_id != parsed[0]:
        return "stale"
    parent_id, index = parsed
    wanted = [i for i in (node_id, parent_id) if i not in states]
    described = {b.batch_job_id: b for b in batch.describe(placement.region, wanted)} if wanted else {}
    node = states[node_id] if node_id in states else described.get(node_id)
    parent = states[parent_id] if parent_id in states else described.get(parent_id)
    if record_stream is not None and node is not None and node.log_stream:
        job = record_stream(job, replace(node, batch_job_id=parent_id), index)
    reason = None if node is None else node_failure_reason(index, node)
    if reason is None or parent is None or parent.status.is_terminal:
        return "node"
    # A CloudError goes up: the event is redelivered and tries again (terminating twice is harmless).
    batch.terminate(placement.region, parent_id, reason, job.tenant)
    return "gang-failed"


__all__ = ["MAIN_NODE", "node_failure_reason", "on_node_event"]
