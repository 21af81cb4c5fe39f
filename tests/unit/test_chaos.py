"""`berth bench chaos`'s plan and audit: the seeded fault timeline, and what it counts from the jobs'
own records (run twice at once, GPUs double-booked, orphans), with real processes of `JOB_SCRIPT`."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berth_tools.bench import chaos_audit
from berth_tools.bench.chaos_audit import Run
from berth_tools.bench.chaos_plan import ALL_KINDS, SHOT_KINDS, WINDOW_KINDS, Timings, plan

HOSTS = ["sim-a100-0", "sim-a100-1", "sim-a100-2"]
REGIONS = ["us-east-1", "us-west-2"]


def test_a_ten_minute_plan_has_every_kind_and_at_least_thirty_faults() -> None:
    events = plan(1, 10, HOSTS, REGIONS)
    assert len(events) >= 30
    assert {e.kind for e in events} == set(ALL_KINDS)
    assert events == sorted(events, key=lambda e: e.at_s)
    assert all(e.at_s >= 0 and e.at_s + e.duration_s <= 600 for e in events)


def test_the_plan_is_deterministic_in_its_seed() -> None:
    assert plan(7, 5, HOSTS, REGIONS) == plan(7, 5, HOSTS, REGIONS)
    assert plan(7, 5, HOSTS, REGIONS) != plan(8, 5, HOSTS, REGIONS)


def test_windows_never_overlap_and_each_has_its_undo() -> None:
    for seed in range(20):
        windows = [e for e in plan(seed, 10, HOSTS, REGIONS) if e.kind in WINDOW_KINDS]
        for a, b in itertools.pairwise(windows):
            assert a.at_s + a.duration_s < b.at_s
        for w in windows:
            undo = w.undo()
            assert undo == (
                {"kind": "heal", "host_id": w.args["host_id"]} if w.kind == "partition" else {"kind": "clear"}
            )
        assert all(e.undo() is None for e in plan(seed, 10, HOSTS, REGIONS) if e.kind in SHOT_KINDS)


def test_partitions_outlast_the_lease_and_some_outlast_the_tolerance() -> None:
    t = Timings(lease_s=20, outage_tolerance_s=20)
    partitions = [
        e for s in range(30) for e in plan(s, 10, HOSTS, REGIONS, timings=t) if e.kind == "partition"
    ]
    assert partitions and all(p.duration_s > t.lease_s for p in partitions)
    assert any(p.duration_s > t.lease_s + t.outage_tolerance_s for p in partitions)
    assert any(p.duration_s < t.lease_s + t.outage_tolerance_s for p in partitions)


def test_a_plan_of_chosen_kinds_and_bad_input() -> None:
    events = plan(3, 5, HOSTS, REGIONS, kinds=("agent-kill", "partition"))
    assert {e.kind for e in events} == {"agent-kill", "partition"}
    with pytest.raises(ValueError, match="unknown"):
        plan(3, 5, HOSTS, REGIONS, kinds=("melt",))
    with pytest.raises(ValueError, match="host"):
        plan(3, 5, [], REGIONS)


def _run(job: str, attempt: int, start: float, last: float, gpus: tuple[str, ...] = ()) -> Run:
    return Run(job, attempt, 1000 + attempt, start, last, ended=True, gpus=gpus)


def test_overlapping_runs_of_one_job_are_twice_at_once_and_sequential_ones_are_not() -> None:
    runs = [_run("j1", 1, 0, 10), _run("j1", 2, 10.2, 20), _run("j2", 1, 0, 10), _run("j2", 2, 5, 12)]
    assert chaos_audit.twice_at_once(runs) == [("j2", 1, 2)]


def test_a_gpu_held_by_two_jobs_at_once_is_double_booked() -> None:
    runs = [
        _run("a", 1, 0, 10, ("GPU-h0-0",)),
        _run("b", 1, 5, 15, ("GPU-h0-0",)),  # overlaps a on the same GPU
        _run("c", 1, 16, 20, ("GPU-h0-0",)),  # after both
        _run("d", 1, 0, 20, ("GPU-h1-0",)),
    ]
    assert chaos_audit.double_booked(runs) == [("GPU-h0-0", "a", "b")]


def test_the_job_script_records_its_run_and_its_detached_child_is_an_orphan(tmp_path: Path) -> None:
    marker = "CHAOS_RUN=test-" + os.urandom(4).hex()
    env = {
        **os.environ,
        "CHAOS_DIR": str(tmp_path),
        "RUN_S": "1",
        "DETACH": "1",
        "DETACH_S": "60",
        "BERTH_JOB_ID": "j-1",
        "BERTH_ATTEMPT": "2",
        "CUDA_VISIBLE_DEVICES": "GPU-h0-1",
        marker.split("=")[0]: marker.split("=")[1],
    }
    subprocess.run([sys.executable, "-c", chaos_audit.JOB_SCRIPT], env=env, check=True, timeout=30)
    (run,) = chaos_audit.read_runs(tmp_path)
    assert (run.job_id, run.attempt, run.gpus, run.ended) == ("j-1", 2, ("GPU-h0-1",), True)
    assert run.last - run.start >= 1.0
    deadline = time.monotonic() + 10
    while not run.children and time.monotonic() < deadline:
        (run,) = chaos_audit.read_runs(tmp_path)
        time.sleep(0.05)
    (child,) = run.children
    try:
        assert chaos_audit.orphans([run], marker) == [child]  # the detached sleeper outlived its job
        assert chaos_audit.orphans([run], "CHAOS_RUN=another-run") == []  # not ours: never counted
        report = chaos_audit.audit(tmp_path, marker, {"j-1": {"status": "COMPLETED"}})
        assert report["orphan_processes"] == 1 and report["completed_without_a_finished_run"] == []
    finally:
        chaos_audit.kill([child])
    deadline = time.monotonic() + 10
    while chaos_audit.orphans([run], marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chaos_audit.orphans([run], marker) == []


def test_a_record_cut_short_by_a_kill_still_counts_its_life(tmp_path: Path) -> None:
    path = tmp_path / "j-9.1.4242"
    lines = [
        json.dumps({"k": "start", "t": 100.0, "pid": 4242, "gpus": "GPU-a,GPU-b"}),
        json.dumps({"k": "tick", "t": 100.5}),
        json.dumps({"k": "tick", "t": 101.0}),
        '{"k": "ti',  # the kill came mid-write
    ]
    path.write_text("\n".join(lines))
    run = chaos_audit.parse_run(path)
    assert run is not None and (run.start, run.last, run.ended, run.gpus) == (
        100.0,
        101.0,
        False,
        ("GPU-a", "GPU-b"),
    )
    (tmp_path / "j-9.2.4243").write_text('{"k": "tick", "t": 1}\n')  # no start line: no run
    assert [r.attempt for r in chaos_audit.read_runs(tmp_path)] == [1]
    report = chaos_audit.audit(tmp_path, "CHAOS_RUN=x", {"j-9": {"status": "COMPLETED"}})
    assert report["completed_without_a_finished_run"] == ["j-9"]
