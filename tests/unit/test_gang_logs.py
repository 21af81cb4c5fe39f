"""Logs per rank (issue 23 item 1): every node of a cloud gang has its own Batch stream, recorded from
that node's own events as its rank's, and ``GET /v1/jobs/{id}/logs?rank=N`` / ``berth logs --rank N``
read it; a rank outside the gang is refused; an on-prem gang's ranks share the attempt's stream."""

from __future__ import annotations

from typing import Any

import pytest

from berth.domain.cloud import BatchJob, BatchStatus, node_job_id
from berth.domain.errors import ValidationFailed
from berth.domain.observability import (
    ONPREM_RANKS_REASON,
    RANK_NEVER_REASON,
    RANK_PENDING_REASON,
    attempt_log_source,
)
from berth.domain.status import JobStatus
from berth.domain.workflow import RunState
from berth_tools.cli.observe_cmd import log_pages
from tests.unit.fakes import FakeLogReader
from tests.unit.test_cloud_dispatch import CloudWorld
from tests.unit.test_cloud_gangs import GANG, _submitted
from tests.unit.test_cloud_logs import GROUP, _service
from tests.unit.test_observability import ALICE

MAIN = "batch/default/" + "0" * 32
CHILD = "batch/default/" + "1" * 32


def _running_gang(w: CloudWorld) -> tuple[str, str, str]:
    """A 2-node gang RUNNING in the cloud; neither node has named its stream yet."""
    job_id, _, bid = _submitted(w, **GANG)
    name = w.batch.jobs[bid].name
    w.batch.set(bid, BatchStatus.RUNNING)
    assert w.cloud.on_event(bid, name) == "running"
    return job_id, bid, name


def _node_runs(w: CloudWorld, bid: str, name: str, index: int, stream: str) -> None:
    node = node_job_id(bid, index)
    w.batch.jobs[node] = BatchJob(node, name, BatchStatus.RUNNING, log_stream=stream)
    assert w.cloud.on_event(node, name) == "node"


def test_each_nodes_stream_is_recorded_as_its_ranks_from_its_own_event() -> None:
    w = CloudWorld()
    job_id, bid, name = _running_gang(w)
    _node_runs(w, bid, name, 1, CHILD)
    run = w.job(job_id).run
    assert run.log_stream_of(1, rank=1) == CHILD
    assert run.log_stream_of(1) is None  # the child's stream is never the gang's (rank 0)
    _node_runs(w, bid, name, 0, MAIN)
    run = w.job(job_id).run
    assert (run.log_stream_of(1), run.log_stream_of(1, 0), run.log_stream_of(1, 1)) == (MAIN, MAIN, CHILD)
    _node_runs(w, bid, name, 1, CHILD)  # a redelivered event: still one entry per rank
    assert len(w.job(job_id).run.log_streams) == 2


def test_rank_streams_round_trip_and_older_records_read_as_rank_zero() -> None:
    run = RunState().with_log_stream(1, MAIN).with_log_stream(1, CHILD, rank=1)
    assert RunState.model_validate(run.model_dump(mode="json", exclude_defaults=True)) == run
    old = RunState.model_validate({"log_streams": [{"attempt": 1, "stream": MAIN}]})
    assert old.log_stream_of(1, 0) == MAIN and old.log_stream_of(1, 1) is None


def test_the_route_reads_the_asked_ranks_stream() -> None:
    w, logs = CloudWorld(), FakeLogReader()
    svc = _service(w, logs)
    job_id, bid, name = _running_gang(w)
    logs.write(GROUP, MAIN, 1, "rank 0 says hi")
    logs.write(GROUP, CHILD, 1, "rank 1 says hi")
    waiting = svc.logs(ALICE, job_id, rank=1)
    assert waiting["events"] == [] and waiting["rank"] == 1 and waiting["next_token"] is None
    assert waiting["reason"] == RANK_PENDING_REASON.format(attempt=1, rank=1)
    _node_runs(w, bid, name, 0, MAIN)
    _node_runs(w, bid, name, 1, CHILD)
    assert [e["message"] for e in svc.logs(ALICE, job_id, rank=1)["events"]] == ["rank 1 says hi"]
    for rank in (None, 0):  # the default is the main node
        page = svc.logs(ALICE, job_id, rank=rank)
        assert [e["message"] for e in page["events"]] == ["rank 0 says hi"] and page["rank"] == 0
        assert page["reason"] is None


@pytest.mark.parametrize("rank", [2, 7])
def test_a_rank_outside_the_gang_is_refused(rank: int) -> None:
    w, logs = CloudWorld(), FakeLogReader()
    svc = _service(w, logs)
    job_id, _, _ = _running_gang(w)
    with pytest.raises(ValidationFailed) as err:
        svc.logs(ALICE, job_id, rank=rank)
    assert f"rank {rank} does not exist" in str(err.value) and err.value.details == {"nodes": 2}


def test_a_single_node_job_has_rank_zero_only() -> None:
    w, logs = CloudWorld(), FakeLogReader()
    svc = _service(w, logs)
    job, _, _ = _submitted(w)
    assert svc.logs(ALICE, job, rank=0)["rank"] == 0
    with pytest.raises(ValidationFailed):
        svc.logs(ALICE, job, rank=1)


def test_a_node_that_never_named_a_stream_says_so_once_the_gang_ended() -> None:
    w = CloudWorld()
    job_id, bid, name = _running_gang(w)
    _node_runs(w, bid, name, 0, MAIN)
    ended = w.job(job_id).model_copy(update={"status": JobStatus.FAILED})
    source = attempt_log_source(ended, 1, 1)
    assert source.stream is None and source.reason == RANK_NEVER_REASON.format(attempt=1, rank=1)


def test_an_onprem_gangs_ranks_share_the_attempts_stream() -> None:
    w = CloudWorld()
    job = w.submit(**GANG)
    onprem = job.model_copy(update={"attempts": 1, "status": JobStatus.RUNNING})
    source = attempt_log_source(onprem, 1, 1)
    assert source.stream == f"{job.id}/1" and source.reason == ONPREM_RANKS_REASON.format(attempt=1)
    assert attempt_log_source(onprem, 1).reason is None  # without a rank: no note


def test_berth_logs_rank_asks_every_page_for_that_rank() -> None:
    asked: list[dict[str, Any]] = []

    class Api:
        def logs(self, job_id: str, **kw: Any) -> Any:
            asked.append(kw)
            events = [] if len(asked) > 1 else [{"at": "t", "message": "x", "attempt": 1}]
            return {"attempt": 1, "attempts": 1, "status": "COMPLETED", "events": events, "next_token": "n"}

    assert len(list(log_pages(Api(), "j-1", rank=1))) == 2
    assert [kw["rank"] for kw in asked] == [1, 1]
    asked.clear()
    list(log_pages(Api(), "j-1"))
    assert all("rank" not in kw for kw in asked)  # not sent unless asked
