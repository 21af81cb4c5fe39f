"""The local Batch's multi-node parallel jobs (gangs): one Batch job of N nodes, run as N processes.

moto 5.2.5 registers ``type: multinode`` job definitions (their ``nodeProperties`` kept as given) but
drops SubmitJob's ``nodeOverrides`` and never runs such a job. The local Batch (``local_batch``) runs
it as AWS Batch does, as far as Berth relies on it:

- the job (the parent) goes SUBMITTED -> PENDING -> RUNNABLE; then each node is a job of its own,
  ``<job id>#<index>``, with the parent's name and queue, its container the definition's node range
  for it (``targetNodes``) with the submit's ``nodePropertyOverrides`` for it over it, driven by the
  local Batch like any job (capacity wait, its own process, its own log stream
  ``<prefix>/default/<task id>``, a ``Batch Job State Change`` event per state, DescribeJobs of
  ``<job id>#<index>``); ListJobs lists the parent only, as on AWS;
- each node's process sees ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_NUM_NODES``,
  ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` and, on the child nodes only,
  ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` = 127.0.0.1 (every node is a process of this
  machine). On AWS each node has an address of its own (awsvpc), so one port does for every gang;
  here they share one, so each gang gets a free port of its own as ``MASTER_PORT``;
- the parent is RUNNING once its main node (node 0) is, with the main node's log stream; it ends
  when the main node ends, with its outcome (exit code, reason); the other nodes are stopped then;
- TerminateJob of the parent stops every node and fails the parent with the given reason. A child
  node that fails does not end the gang (as on AWS): Berth's control plane ends it on the node's
  event (``berth.logic.cloud_gangs``).
"""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
import time
from typing import Any

from berth_tools.localcloud import moto_compat

NODE_OVERRIDES_ATTR = "berth_node_overrides"
NODE_ENV_ATTR = "berth_node_env"
NODE_INDEX_ATTR = "berth_node_index"
LOOPBACK = "127.0.0.1"
MAIN_NODE_EXITED = "Main node exited"
_POLL_S = 0.05
_JOIN_S = 30.0


def is_gang(job: Any) -> bool:
    return getattr(job.job_definition, "type", "container") == "multinode"


def in_range(target: str, index: int, nodes: int) -> bool:
    """Whether ``targetNodes`` (``3``, ``0:``, ``:4``, ``1:3``) covers node ``index`` of ``nodes``."""
    low, sep, high = str(target).partition(":")
    try:
        if not sep:
            return int(low) == index
        return (int(low) if low.strip() else 0) <= index <= (int(high) if high.strip() else nodes - 1)
    except ValueError:
        return False


def num_nodes(job: Any, overrides: dict[str, Any]) -> int:
    props = job.job_definition.node_properties or {}
    return int(overrides.get("numNodes") or props.get("numNodes") or 1)


def main_node(job: Any) -> int:
    return int((job.job_definition.node_properties or {}).get("mainNode") or 0)


def node_container(job: Any, index: int, nodes: int) -> dict[str, Any]:
    for item in (job.job_definition.node_properties or {}).get("nodeRangeProperties") or []:
        if in_range(item.get("targetNodes", ""), index, nodes):
            return copy.deepcopy(item.get("container") or {})
    raise ValueError(f"no node range of the job definition covers node {index}")


def node_overrides(overrides: dict[str, Any], index: int, nodes: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in overrides.get("nodePropertyOverrides") or []:
        if in_range(item.get("targetNodes", ""), index, nodes):
            found = copy.deepcopy(item.get("containerOverrides") or {})
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def make_node(job: Any, index: int, nodes: int, overrides: dict[str, Any], port: int) -> Any:
    """Node ``index`` of the gang ``job``: a moto Job ``<job id>#<index>`` of a container definition
    (the node range's), never stored in moto's jobs (ListJobs does not list nodes)."""
    parent = job.job_definition
    definition = moto_compat.surface("moto.batch.models:JobDefinition")(
        parent.name,
        parent.parameters,
        "container",
        node_container(job, index, nodes),
        None,
        eks_properties=None,
        tags={},
        retry_strategy=parent.retry_strategy,
        timeout=parent.timeout,
        backend=parent.backend,
        platform_capabilities=parent.platform_capabilities,
        propagate_tags=False,
        revision=max(0, parent.revision - 1),  # the same ARN as the gang's definition
    )
    node = moto_compat.surface("moto.batch.models:Job")(
        job.job_name,
        definition,
        job.job_queue,
        job.backend,
        job._log_backend,
        node_overrides(overrides, index, nodes),
        eks_properties_override=None,
        depends_on=None,
        parameters=job.parameters,
        all_jobs={},
        timeout=job.timeout,
        array_properties={},
        provided_job_id=f"{job.job_id}#{index}",
    )
    with contextlib.suppress(ValueError):  # moto's Job lists itself in its queue; ListJobs lists no node
        job.job_queue.jobs.remove(node)
    main = main_node(job)
    env = {
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_NUM_NODES": str(nodes),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main),
        "MASTER_PORT": str(port),
    }
    if index != main:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = LOOPBACK
    setattr(node, NODE_ENV_ATTR, env)
    setattr(node, NODE_INDEX_ATTR, index)
    return node


def run_gang(runner: Any, job: Any, overrides: dict[str, Any]) -> None:
    """Drive the gang ``job`` to its end (``runner``: the ``LocalBatch``; see the module docstring)."""
    runner._emit(job)  # SUBMITTED
    runner._set_status(job, "PENDING")
    runner._set_status(job, "RUNNABLE")
    count = num_nodes(job, overrides)
    port = free_port()
    nodes = [make_node(job, i, count, overrides, port) for i in range(count)]
    main = nodes[main_node(job)]
    runner.add_nodes(nodes)
    threads = [threading.Thread(target=runner.execute, args=(n,), daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    stopping = False
    while not main.job_stopped:
        if (job.stop or runner._stopping) and not stopping:
            stopping = True
            for node in nodes:
                node.terminate(job.job_stopped_reason or "terminated")
        if main.status == "RUNNING" and job.status not in ("RUNNING",) and not stopping:
            job.log_stream_name = main.log_stream_name  # the gang's stream: its main node's
            job.job_started_at = main.job_started_at
            job._start_attempt()
            runner._set_status(job, "STARTING")
            runner._set_status(job, "RUNNING")
        time.sleep(_POLL_S)
    if job.stop or runner._stopping:
        runner._finish(
            job, success=False, exit_code=main.exit_code, reason=job.job_stopped_reason or "terminated"
        )
    else:
        runner._finish(
            job,
            success=main.status == "SUCCEEDED",
            exit_code=main.exit_code,
            reason=main.job_stopped_reason or MAIN_NODE_EXITED,
        )
    for node in nodes:  # Batch stops the other nodes once the main node has exited
        node.terminate(MAIN_NODE_EXITED)
    for thread in threads:
        thread.join(_JOIN_S)


__all__ = ["is_gang", "make_node", "run_gang"]
