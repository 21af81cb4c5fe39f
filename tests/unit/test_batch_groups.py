"""Array tasks placed together in the cloud run as one Batch array job: the pass forms the groups,
the first request of a group submits its array job (one SubmitJob for the group), every task
records its child ``<parent>:<k>``, and each child's events, cancel and sweep act on that task
alone. Over the in-memory fakes (docs/workflow.md, "Array tasks in one Batch array job")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from berth.domain.arrays import task_id, task_spec
from berth.domain.cloud import (
    GROUP_TABLE_BYTES,
    BatchStatus,
    batch_group_name,
    batch_job_task,
    expected_batch_name,
    form_batch_groups,
    group_entry_bytes,
)
from berth.domain.job import Job, new_job
from berth.domain.job_spec import JobSpec
from berth.domain.placement import MAX_BATCH_GROUP, BatchGroup, CloudPlacement
from berth.domain.status import JobStatus
from berth.logic.cloud_dispatch import submit_request
from berth_agent.launch import LaunchSpec, LaunchSpecError, NoTaskHere, main
from tests.unit.test_cloud_dispatch import CloudWorld

S = JobStatus
AID = "j-" + "0123456789abcdefghjkmnpqrs"
DIGEST = "a" * 64


def _spec(n: int, **extra: Any) -> JobSpec:
    body: dict[str, Any] = {
        "name": "sweep",
        "code": f"sha256:{DIGEST}",
        "command": ["python", "train.py", "--lr", "{lr}"],
        "resources": {"gpu_type": "A100", "gpus": 1},
        "constraints": {"placement": "cloud"},
        "array": {"size": n},
    }
    body.update(extra)
    return JobSpec.model_validate(body)


def _tasks(w: CloudWorld, indexes: range | list[int], n: int | None = None, **extra: Any) -> list[Job]:
    """Tasks of the array AID, stored QUEUED with their placement tokens parked (as the expander
    and the workflow leave them)."""
    size = n or (max(indexes) + 1)
    base = _spec(size, **extra)
    out = []
    for i in indexes:
        spec = task_spec(base, AID, i, size, {"lr": i / 10})
        job, event = new_job(task_id(AID, i), "vision", "alice", spec, w.clock())
        w.jobs.create(job, event, max_active=10_000)
        w.workflow.await_placement(job.id, f"place-{job.id}")
        out.append(job)
    return out


def _placed(w: CloudWorld, jobs: list[Job]) -> list[Job]:
    w.scheduler.run_pass()
    placed = [w.job(j.id) for j in jobs]
    assert all(p.status is S.STARTING for p in placed)
    return placed


def _group(job: Job) -> BatchGroup | None:
    assert isinstance(job.placement, CloudPlacement)
    return job.placement.group


def test_a_pass_groups_an_arrays_tasks_and_one_submit_starts_them_all() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(5)))
    assert {_group(p) for p in placed} == {BatchGroup(first=0, size=5)}
    assert all("Batch array of tasks 0-4" in p.reason for p in placed)
    for p in placed:
        w.dispatch(p)
    requests = w.submits.messages[:]
    name = batch_group_name(AID, BatchGroup(first=0, size=5), 1)
    assert {r.message_group for r in requests} == {name}  # one FIFO group: one submitter at a time
    successes: list[tuple[str, str]] = []
    record = w.circuits.record_success
    w.circuits.record_success = lambda r, t, at: successes.append((r, t)) or record(r, t, at)  # type: ignore[method-assign, func-returns-value]
    assert w.deliver() == ["submitted"] * 5
    assert len(successes) == 1  # only the request that called Batch is the region's signal
    (sub,) = w.batch.submitted  # one SubmitJob for five tasks
    assert sub.array_size == 5 and sub.name == name and w.batch.lookups == 1
    assert [w.batch_id(p.id) for p in placed] == [f"batch-1:{k}" for k in range(5)]
    # the container's environment is the same for every child: no task's own variables in it
    assert "BERTH_JOB_ID" not in sub.environment and "BERTH_PARAM_LR" not in sub.environment
    assert sub.environment["BERTH_ARRAY_ID"] == AID and sub.tags["BERTH_JOB_ID"] == AID
    # each child's launcher picks its own row
    launch = LaunchSpec.parse(sub.environment["BERTH_LAUNCH"], "3")
    assert launch.job_id == task_id(AID, 3) and launch.attempt == 1
    assert launch.command == ("python", "train.py", "--lr", "0.3")
    assert launch.array_env["BERTH_ARRAY_INDEX"] == "3" and launch.array_env["BERTH_PARAM_LR"] == "0.3"
    assert launch.code_digest == DIGEST


def test_each_childs_events_move_its_own_task() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(3)))
    tokens = [w.dispatch(p) for p in placed]
    w.deliver()
    name = expected_batch_name(w.job(placed[0].id))
    assert batch_job_task("batch-1:2", name) == (task_id(AID, 2), 1)
    assert batch_job_task("batch-1", name) is None  # the parent array job runs nothing itself
    assert batch_job_task("batch-1:3", name) is None  # no such child
    assert w.cloud.on_event("batch-1", name, BatchStatus.RUNNING) == "foreign"
    w.batch.set("batch-1:2", BatchStatus.RUNNING)
    assert w.cloud.on_event("batch-1:2", name, BatchStatus.RUNNING) == "running"
    assert [w.job(p.id).status for p in placed] == [S.STARTING, S.STARTING, S.RUNNING]
    w.batch.set("batch-1:2", BatchStatus.SUCCEEDED, exit_code=0)
    assert w.cloud.on_event("batch-1:2", name, BatchStatus.SUCCEEDED) == "succeeded"
    assert [c[1] for c in w.tokens.calls if c[0] == "succeed"][-1] == tokens[2]


def test_an_event_that_beats_the_tasks_own_request_is_adopted() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(3)))
    for p in placed:
        w.dispatch(p)
    first, *rest = w.submits.take()
    assert w.cloud.submit(first) == "submitted"
    name = expected_batch_name(w.job(placed[0].id))
    w.batch.set("batch-1:1", BatchStatus.RUNNING)
    assert w.cloud.on_event("batch-1:1", name, BatchStatus.RUNNING) == "running"
    assert w.batch_id(placed[1].id) == "batch-1:1"
    assert [w.cloud.submit(r) for r in rest] == ["exists", "submitted"]
    assert len(w.batch.submitted) == 1


def test_a_crash_after_the_groups_submit_is_found_by_name_never_submitted_twice() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(4)))
    for p in placed:
        w.dispatch(p)
    requests = w.submits.take()
    w.fail_next_job_write(RuntimeError("the Lambda died after SubmitJob"))
    with pytest.raises(RuntimeError):
        w.cloud.submit(requests[0])
    fresh = CloudWorld.__new__(CloudWorld)  # a new sandbox: nothing remembered
    fresh.__dict__.update(w.__dict__)
    from dataclasses import replace

    fresh.cloud = replace(w.cloud, _parents={})
    assert [fresh.cloud.submit(r) for r in requests] == ["submitted"] * 4
    assert len(w.batch.submitted) == 1
    assert [w.batch_id(p.id) for p in placed] == [f"batch-1:{k}" for k in range(4)]


def test_a_task_canceled_before_the_submit_gets_no_row_and_after_it_only_its_child_stops() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(4)))
    for p in placed:
        w.dispatch(p)
    requests = {r.job_id: r for r in w.submits.take()}
    w.jobs.update(w.job(placed[1].id).updated(w.clock(), status=S.CANCELING))  # canceled at once
    w.jobs.update(w.job(placed[3].id).updated(w.clock(), status=S.CANCELING))
    assert w.cloud.submit(requests[placed[0].id]) == "submitted"
    (sub,) = w.batch.submitted
    rows = json.loads(sub.environment["BERTH_LAUNCH"])["tasks"]
    assert rows[1] is None and [r["job_id"] for r in rows if r] == [task_id(AID, i) for i in (0, 2)]
    assert sub.array_size == 3 == len(rows)  # no child for a canceled last task
    with pytest.raises(NoTaskHere):
        LaunchSpec.parse(sub.environment["BERTH_LAUNCH"], "1")
    # the canceled task's own request: nothing to terminate yet beyond its own child
    w.batch.set("batch-1:1", BatchStatus.RUNNING)
    assert w.cloud.submit(requests[placed[1].id]) == "canceled"
    assert [t[0] for t in w.batch.terminated] == ["batch-1:1"]
    assert w.batch.jobs["batch-1:2"].status is BatchStatus.SUBMITTED  # its neighbours run on


def test_a_child_of_a_group_the_task_is_no_longer_on_is_stale() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(2)))
    for p in placed:
        w.dispatch(p)
    w.deliver()
    # the same task and attempt named by another group: never adopted, terminated
    other = batch_group_name(AID, BatchGroup(first=0, size=3), 1)
    w.batch.jobs["x:0"] = w.batch.jobs["batch-1:0"].__class__("x:0", other, BatchStatus.RUNNING)
    assert w.cloud.on_event("x:0", other, BatchStatus.RUNNING) == "stale"
    assert ("x:0", "Berth: attempt no longer current") in w.batch.terminated
    assert w.batch_id(placed[0].id) == "batch-1:0"


def test_what_is_not_grouped() -> None:
    w = CloudWorld()
    # image tasks run their own command: no launcher to pick a row
    images = _tasks(w, range(2), image="busybox", code=None)
    placed = _placed(w, images)
    assert [_group(p) for p in placed] == [None, None]
    for p in placed:
        w.dispatch(p)
    assert w.deliver() == ["submitted", "submitted"] and len(w.batch.submitted) == 2
    assert all(r.array_size == 0 for r in w.batch.submitted)


def test_groups_are_runs_of_consecutive_tasks_within_the_caps() -> None:
    w = CloudWorld()
    jobs = {j.spec.array_task.index: j for j in _tasks(w, [0, 1, 2, 5, 6, 9], n=10)}  # type: ignore[union-attr]
    placement = CloudPlacement(region="us-east-1", queue="q", instance_type="p4d", gpu_type="A100")
    groups = form_batch_groups([(j, placement) for j in jobs.values()])
    assert {jobs[i].id: groups[jobs[i].id] for i in (0, 1, 2, 5, 6)} == {
        **{jobs[i].id: BatchGroup(first=0, size=3) for i in (0, 1, 2)},
        **{jobs[i].id: BatchGroup(first=5, size=2) for i in (5, 6)},
    }
    assert jobs[9].id not in groups  # a run of one is a Batch job of its own
    other = placement.model_copy(update={"region": "us-west-2"})
    split = form_batch_groups([(jobs[0], placement), (jobs[1], other)])
    assert split == {}  # placed differently: not one array job
    w2 = CloudWorld()
    many = _tasks(w2, range(MAX_BATCH_GROUP + 3))
    sizes = sorted({g.size for g in form_batch_groups([(j, placement) for j in many]).values()})
    per_task = group_entry_bytes(many[0])
    cap = min(MAX_BATCH_GROUP, GROUP_TABLE_BYTES // per_task)
    assert max(sizes) == cap and len(sizes) == 2  # full groups, then the rest


def test_the_table_stays_within_its_bytes() -> None:
    w = CloudWorld()
    long_arg = "x" * 2_000
    many = _tasks(w, range(20), command=["python", "train.py", long_arg, "{lr}"])
    placement = CloudPlacement(region="us-east-1", queue="q", instance_type="p4d", gpu_type="A100")
    groups = form_batch_groups([(j, placement) for j in many])
    for group in set(groups.values()):
        members = [j for j in many if groups.get(j.id) == group]
        assert sum(group_entry_bytes(j) for j in members) <= GROUP_TABLE_BYTES


def test_the_sweep_resends_a_lost_request_in_its_group() -> None:
    w = CloudWorld()
    placed = _placed(w, _tasks(w, range(2)))
    job = w.job(placed[0].id)
    assert submit_request(job).group == expected_batch_name(job)
    assert submit_request(job).dedup_id != submit_request(w.job(placed[1].id)).dedup_id


def test_the_launcher_runs_nothing_for_a_child_without_a_task(capsys: pytest.CaptureFixture[str]) -> None:
    table = {"attempt": 1, "tenant": "vision", "tasks": [None, {"job_id": "j:1", "command": ["true"]}]}
    assert main({"BERTH_LAUNCH": json.dumps(table), "AWS_BATCH_JOB_ARRAY_INDEX": "0"}) == 0
    assert "has no task to run" in capsys.readouterr().err
    assert main({"BERTH_LAUNCH": json.dumps(table), "AWS_BATCH_JOB_ARRAY_INDEX": "7"}) == 64
    assert main({"BERTH_LAUNCH": json.dumps(table)}) == 64
    with pytest.raises(LaunchSpecError, match="not a task row"):
        LaunchSpec.parse({**table, "tasks": [{"job_id": "j:0", "command": []}]}, "0")
    # a field a newer control plane adds to a row is not the launcher's business (agent_wire's rule)
    row = {"job_id": "j:0", "command": ["true"], "priority": 3}
    assert LaunchSpec.parse({**table, "tasks": [row]}, "0").command == ("true",)


def test_a_groups_tokens_are_answered_only_once_all_its_tasks_are_placed() -> None:
    """The first submit of a group reads its tasks: a task placed after a neighbour's token was
    answered (and its submit ran) would get no row and never run. So the pass answers a group's
    tokens after its last placement."""
    w = CloudWorld()
    jobs = _tasks(w, range(4))
    order: list[str] = []
    place = w.scheduler.placements.place  # type: ignore[union-attr]
    succeed = w.tokens.succeed

    def placing(job: Job, *args: Any) -> None:
        place(job, *args)
        order.append("place")

    def answering(token: str, output: dict[str, Any]) -> bool:
        order.append("answer")
        return succeed(token, output)

    w.scheduler.placements.place = placing  # type: ignore[union-attr, method-assign]
    w.tokens.succeed = answering  # type: ignore[method-assign]
    _placed(w, jobs)
    assert order == ["place"] * 4 + ["answer"] * 4
    assert all(_group(w.job(j.id)) == BatchGroup(first=0, size=4) for j in jobs)


def test_no_wait_for_placement_asks_for_a_pass_of_its_own() -> None:
    """The job's move to QUEUED asks for one through the job-events stream (logic/pass_triggers.py;
    an array task's creation: the expander asks for one per invocation), so no wait does: neither a
    task's first wait, nor a single job's, nor a retried task's (a SendMessage per job saved)."""
    w = CloudWorld()
    w.trigger.requests.clear()
    (task,) = _tasks(w, [0], n=2)  # _tasks parks the placement token (await_placement)
    single = w.submit(constraints={"placement": "cloud"})
    w.workflow.await_placement(single.id, "p")
    retried = w.job(task.id).model_copy(update={"attempts": 1})
    w.jobs.update(retried.updated(w.clock()))
    w.workflow.await_placement(task.id, "p2")
    assert w.trigger.requests == []


def test_a_pass_whose_placement_lost_a_race_asks_for_another_soon() -> None:
    w = CloudWorld()
    jobs = _tasks(w, range(2))
    place = w.scheduler.placements.place  # type: ignore[union-attr]
    from berth.domain.errors import Conflict

    def lose_first(job: Job, *args: Any) -> None:
        if job.id == jobs[0].id:
            raise Conflict("the job moved since the pass read it")
        place(job, *args)

    w.scheduler.placements.place = lose_first  # type: ignore[union-attr, method-assign]
    w.trigger.requests.clear()
    w.scheduler.run_pass()
    assert ("placements lost a race", 1) in w.trigger.requests
    assert w.job(jobs[0].id).status is S.QUEUED and w.job(jobs[1].id).status is S.STARTING
