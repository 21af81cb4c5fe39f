"""A node of a cloud gang: the launcher maps AWS Batch's multi-node variables to the rendezvous
variables an on-prem rank gets (torchrun's and Berth's)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from berth_agent import launch
from berth_agent.batch_gang import GangEnvError, batch_rendezvous
from berth_agent.launch import Launcher

from .test_launch import FakeIO, _spec

CHILD = {
    "AWS_BATCH_JOB_NUM_NODES": "4",
    "AWS_BATCH_JOB_NODE_INDEX": "2",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.17",
}


def test_a_child_node_reaches_the_main_nodes_address_and_its_rank_is_its_index() -> None:
    rdv = batch_rendezvous(CHILD, address=lambda: "10.0.1.99")
    assert rdv is not None
    assert rdv.env() == {
        "MASTER_ADDR": "10.0.1.17",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "4",
        "RANK": "2",
        "NODE_RANK": "2",
        "BERTH_RANK": "2",
        "BERTH_WORLD_SIZE": "4",
    }


def test_the_main_node_is_rank_0_at_its_own_address_and_a_container_port_wins() -> None:
    main = {
        **CHILD,
        "AWS_BATCH_JOB_NODE_INDEX": "1",
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "1",
        "MASTER_PORT": "23456",
    }
    del main["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]  # Batch sets it on child nodes only
    rdv = batch_rendezvous(main, address=lambda: "10.0.1.99")
    assert rdv is not None and (rdv.rank, rdv.master_addr, rdv.master_port) == (0, "10.0.1.99", 23456)
    # ranks count from the main node: node 0 of 4 with main node 1 is rank 3
    other = batch_rendezvous({**CHILD, "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "1"})
    assert other is not None and other.rank == 3


def test_a_single_container_job_has_no_rendezvous() -> None:
    assert batch_rendezvous({"AWS_BATCH_JOB_ID": "x"}) is None


@pytest.mark.parametrize(
    "change",
    [
        {"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": ""},
        {"AWS_BATCH_JOB_NODE_INDEX": "4"},
        {"AWS_BATCH_JOB_NODE_INDEX": "two"},
        {"MASTER_PORT": "70000"},
    ],
)
def test_variables_that_make_no_rendezvous_are_refused(change: dict[str, str]) -> None:
    with pytest.raises(GangEnvError):
        batch_rendezvous({**CHILD, **change})


def test_the_launched_command_sees_its_rank_and_a_broken_gang_env_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = "import os; e = os.environ; print(e['BERTH_RANK'], e['BERTH_WORLD_SIZE'], e['MASTER_ADDR'])"
    out, err = io.StringIO(), io.StringIO()
    code = Launcher(
        _spec(command=[sys.executable, "-c", script]),
        io=FakeIO(),
        work_dir=tmp_path / "work",
        environ=CHILD,
        stdout=out,
        stderr=err,
        rendezvous=batch_rendezvous(CHILD),
    ).run()
    assert (code, out.getvalue()) == (0, "2 4 10.0.1.17\n"), err.getvalue()
    assert "rank 2 of 4" in err.getvalue()
    valid = {"job_id": "j", "attempt": 1, "tenant": "vision", "command": ["true"]}
    broken = {**CHILD, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "", "BERTH_LAUNCH": json.dumps(valid)}
    assert launch.main(broken) == launch.EXIT_USAGE
    assert (
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set on child node 2" in capsys.readouterr().err
    )
