"""A node of a gang in the cloud: the rendezvous variables from AWS Batch's multi-node parallel ones.

A gang (``resources.nodes`` > 1) placed in the cloud runs as one AWS Batch multi-node parallel job;
every node runs ``python -m berth_agent.launch``, which sets what an on-prem rank gets from its claim
(``executors.base.Rendezvous``: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``,
``NODE_RANK``, ``BERTH_RANK``, ``BERTH_WORLD_SIZE``) from what Batch sets on each node:

- ``AWS_BATCH_JOB_NUM_NODES``: the world size;
- ``AWS_BATCH_JOB_NODE_INDEX`` and ``AWS_BATCH_JOB_MAIN_NODE_INDEX``: the rank, counted from the main
  node (rank 0, where torch's store lives; Berth's definitions make node 0 the main node, so the
  rank is the node index);
- ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (set on the child nodes only): ``MASTER_ADDR``;
  on the main node, its own address (its hostname's: Batch's awsvpc mode gives each node container
  its own network interface);
- ``MASTER_PORT``: the container's own if set, else torchrun's default 29500.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

from berth_agent.executors.base import Rendezvous

NUM_NODES_ENV = "AWS_BATCH_JOB_NUM_NODES"
NODE_INDEX_ENV = "AWS_BATCH_JOB_NODE_INDEX"
MAIN_NODE_INDEX_ENV = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_NODE_ADDR_ENV = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
MASTER_PORT_ENV = "MASTER_PORT"
DEFAULT_MASTER_PORT = 29500


class GangEnvError(ValueError):
    """Batch's multi-node variables are missing or malformed (the node cannot find its peers)."""


def own_address() -> str:
    """This node's own address: its hostname's (awsvpc: the container's private IPv4), else loopback."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _int(environ: Mapping[str, str], name: str, default: str | None = None) -> int:
    raw = environ.get(name, default)
    if raw is None or not raw.strip().isdigit():
        raise GangEnvError(f"{name}={raw!r} is not a non-negative integer")
    return int(raw)


def batch_rendezvous(
    environ: Mapping[str, str], address: Callable[[], str] = own_address
) -> Rendezvous | None:
    """The node's rendezvous from Batch's multi-node variables; None for a single-container job
    (no ``AWS_BATCH_JOB_NUM_NODES``). Raises ``GangEnvError`` when they do not make one."""
    if NUM_NODES_ENV not in environ:
        return None
    nodes = _int(environ, NUM_NODES_ENV)
    index = _int(environ, NODE_INDEX_ENV)
    main = _int(environ, MAIN_NODE_INDEX_ENV, "0")
    if not (index < nodes and main < nodes):
        raise GangEnvError(f"node {index} (main node {main}) is outside a gang of {nodes}")
    if index == main:
        master = address()
    else:
        master = environ.get(MAIN_NODE_ADDR_ENV, "").strip()
        if not master:
            raise GangEnvError(f"{MAIN_NODE_ADDR_ENV} is not set on child node {index}")
    port = _int(environ, MASTER_PORT_ENV, str(DEFAULT_MASTER_PORT))
    try:
        return Rendezvous(master, port, nodes, (index - main) % nodes)
    except ValueError as exc:
        raise GangEnvError(str(exc)) from exc


__all__ = ["DEFAULT_MASTER_PORT", "GangEnvError", "batch_rendezvous", "own_address"]
