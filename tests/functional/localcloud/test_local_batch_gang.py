"""A gang on the local Batch: one multi-node parallel job of two nodes, submitted with one SubmitJob by
the real Batch adapter, runs as two launcher processes that find each other over TCP
(``MASTER_ADDR:MASTER_PORT`` from Batch's node variables), each node with its own log stream; a rank
that fails ends the gang once the control plane's node-event rule has read it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from berth.dal.batch import BotoBatchGateway, RateLimiter
from berth.domain.cloud import LAUNCH_COMMAND, BatchSubmission, failed_outcome, node_job_id
from berth.domain.job import Job, new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement
from berth.domain.status import JobStatus
from berth.domain.workflow import Failure
from berth.logic.cloud_gangs import on_node_event
from berth_tools.localcloud.cloud import LocalCloud
from berth_tools.localcloud.local_batch_gang import MAIN_NODE_EXITED
from tests.functional.localcloud.test_local_batch import (
    GROUP,
    QUEUE,
    REGION,
    TASK_STREAM,
    Batch,
    _client,
    create_batch_environment,
)

#: Rank 0 listens on MASTER_PORT and answers every other rank; the others connect to MASTER_ADDR.
#: ``FAIL_RANK`` exits 3 at once (rank 0 then waits for it until the gang is ended).
RANKS = """
import os, socket, sys, time
rank, world = int(os.environ["BERTH_RANK"]), int(os.environ["BERTH_WORLD_SIZE"])
assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(world))
if str(rank) == os.environ.get("FAIL_RANK"):
    print(f"rank {rank} fails"); sys.exit(3)
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server(("0.0.0.0", port))
    heard = []
    for _ in range(world - 1):
        conn, _ = server.accept()
        heard.append(conn.recv(64).decode()); conn.sendall(b"welcome")
        conn.recv(64); conn.close()  # until the rank has printed and closed its end
    print("rank 0 heard", sorted(heard), flush=True)
else:
    for _ in range(300):
        try:
            conn = socket.create_connection((addr, port), timeout=5); break
        except OSError:
            time.sleep(0.1)
    conn.sendall(f"rank {rank}".encode())
    print(f"rank {rank} got", conn.recv(64).decode(), flush=True)
    conn.close()
"""


@pytest.fixture(scope="module")
def lb(cloud: LocalCloud) -> Iterator[Batch]:
    role_arn = create_batch_environment(cloud, max_vcpus=4)
    yield Batch(
        cloud,
        _client(cloud, "batch"),
        _client(cloud, "logs"),
        _client(cloud, "sqs"),
        _client(cloud, "s3"),
        "",
        role_arn,
    )


def _gateway(lb: Batch) -> BotoBatchGateway:
    """The real adapter, its clients the test's (signed for the local cloud)."""
    gateway = BotoBatchGateway("", RateLimiter(1000.0), log_group_prefix="/berth/jobs/", log_region=REGION)
    gateway._clients[("", REGION)] = lb.batch
    gateway._clients[("", REGION, "submit")] = lb.batch
    return gateway


def _submit(lb: Batch, gateway: BotoBatchGateway, job_id: str, fail_rank: str = "") -> str:
    launch = {"job_id": job_id, "attempt": 1, "tenant": "vision", "command": ["python3", "-c", RANKS]}
    launch["env"] = {"FAIL_RANK": fail_rank}
    request = BatchSubmission(
        region=REGION,
        queue=QUEUE,
        name=f"{job_id}-a1",
        image="public.ecr.aws/docker/library/python:3.11-slim",
        definition="berth-img-gangtest-vision-mnp",
        command=LAUNCH_COMMAND,
        environment={"BERTH_LAUNCH": json.dumps(launch), "BERTH_JOB_ID": job_id},
        gpus=0,
        vcpus=1,
        memory_mib=512,
        timeout_s=120,
        tenant="vision",
        job_role=lb.role_arn,
        num_nodes=2,
    )
    return gateway.submit(request)


def _nodes(lb: Batch, bid: str) -> list[dict[str, Any]]:
    """The gang's two nodes once each has ended (Batch stops the child nodes after the parent ends)."""
    return [lb.done(node_job_id(bid, index)) for index in (0, 1)]


def test_a_two_node_gang_connects_over_tcp_and_completes_with_a_stream_per_node(lb: Batch) -> None:
    bid = _submit(lb, _gateway(lb), "j-gang")
    definition = lb.batch.describe_job_definitions(jobDefinitionName="berth-img-gangtest-vision-mnp")
    assert definition["jobDefinitions"][0]["type"] == "multinode"
    done = lb.done(bid, timeout_s=90)
    main, child = _nodes(lb, bid)
    assert done["status"] == "SUCCEEDED", (lb.output(bid), child)
    assert main["status"] == "SUCCEEDED"
    # Batch stops the child nodes once the main node exits: a child still exiting then is stopped
    # (FAILED, "Main node exited"), one that ended first SUCCEEDED; which of the two is a race, on AWS too.
    assert child["status"] == "SUCCEEDED" or child.get("statusReason") == MAIN_NODE_EXITED, child
    streams = [n["container"]["logStreamName"] for n in (main, child)]
    assert all(re.fullmatch(TASK_STREAM, s) for s in streams) and streams[0] != streams[1]
    assert done["container"]["logStreamName"] == streams[0]  # the gang's stream: its main node's
    assert "rank 0 heard ['rank 1']" in lb.log_lines(GROUP, streams[0])
    assert "rank 1 got welcome" in lb.log_lines(GROUP, streams[1])
    listed = lb.batch.list_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["j-gang-a1"]}])
    assert [j["jobId"] for j in listed["jobSummaryList"]] == [bid]  # nodes are not listed


def _job(bid: str) -> tuple[Job, CloudPlacement]:
    now = datetime.now(UTC)
    spec = JobSpec.model_validate(
        {
            "name": "g",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "A10G", "gpus": 2, "nodes": 2},
        }
    )
    job, _ = new_job(new_job_id(now), "vision", "alice", spec, now)
    placement = CloudPlacement(
        region=REGION, queue=QUEUE, instance_type="g5.xlarge", gpu_type="A10G", instances=2
    )
    run = job.run.with_attempt(batch_job_id=bid)
    placed, _ = job.transition(
        JobStatus.STARTING, "placed", now, placement=placement, site=placement.site, attempts=1, run=run
    )
    return placed, placement


def test_a_failing_rank_fails_the_gang(lb: Batch) -> None:
    gateway = _gateway(lb)
    bid = _submit(lb, gateway, "j-gangfail", fail_rank="1")
    lb.wait(bid, lambda j: j["status"] == "RUNNING", timeout_s=60)  # its nodes exist from then on
    child = lb.wait(node_job_id(bid, 1), lambda j: j["status"] == "FAILED", timeout_s=60)
    assert child["container"]["exitCode"] == 3
    assert lb.describe(bid)["status"] == "RUNNING"  # as on AWS: only the main node ends a gang
    job, placement = _job(bid)
    assert on_node_event(gateway, job, placement, node_job_id(bid, 0), {}) == "node"  # still running
    assert on_node_event(gateway, job, placement, node_job_id(bid, 1), {}) == "gang-failed"
    lb.done(bid, timeout_s=30)
    (ended,) = gateway.describe(REGION, [bid])
    outcome = failed_outcome(ended, placement)
    assert outcome.failure is Failure.NONZERO_EXIT and "gang node 1 exited with code 3" in outcome.detail
    assert [n["status"] for n in _nodes(lb, bid)] == ["FAILED", "FAILED"]  # rank 0 was stopped with it
    assert on_node_event(gateway, job, placement, node_job_id(bid, 1), {}) == "node"  # ended: nothing more
