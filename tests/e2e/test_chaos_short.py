"""The short form of `berth bench chaos` (the long one: `make chaos`, ten minutes, seed 1).

A fresh local cloud with three real agents runs a mixed workload (on-prem and cloud jobs, some
leaving a detached process behind) for 90 s while the seeded plan injects faults of every kind.
Counted from the jobs' own records: nothing lost, nothing run twice at once, no GPU double-booked,
no process left behind, every tenant's counter equal to the truth.
"""

from __future__ import annotations

from berth_tools.bench.chaos_bench import Workload
from berth_tools.bench.chaos_plan import ALL_KINDS
from berth_tools.bench.chaos_run import run_on_fresh_local_cloud


def test_a_short_chaos_run_loses_nothing_and_runs_nothing_twice() -> None:
    report = run_on_fresh_local_cloud(
        minutes=1.5,
        seed=3,
        agents=3,
        workload=Workload(jobs_per_minute=16, cloud_share=0.2, detach_share=0.3),
        kinds=ALL_KINDS,
    )
    summary = {k: v for k, v in report.items() if k not in ("command",)}
    print({k: report.get(k) for k in ("ready_s", "chaos_s", "drain_s", "ctrl_c_to_gone_s")})  # pytest -s
    assert report["jobs_accepted"] >= 20, summary
    assert report["faults_injected"] >= 4 and len(report["fault_kinds"]) >= 4, summary
    assert report["lost"] == 0, summary
    assert report["run_twice_at_once"] == 0, summary
    assert report["gpus_double_booked"] == 0, summary
    assert report["orphan_processes"] == 0, summary
    assert report["completed_without_a_finished_run"] == [], summary
    assert report["counters_exact"], summary
    assert report["left_after_ctrl_c"] == [], summary
