"""The scheduling pass's apply path: parallel, one transaction per placement (or per group of
placements on one host), a deadline, and a pass killed at any point of it that the next passes
complete with every job placed exactly once."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from berth.domain.fleet import HostRecord, attempt_key
from berth.domain.job import Job
from berth.domain.placement import OnPremPlacement
from berth.domain.status import JobStatus
from berth.logic.pass_apply import (
    MAX_GROUP,
    Deadline,
    GpuPicker,
    HostLocks,
    placement_groups,
    run_bounded,
)
from tests.unit.fakes import FakePlacements
from tests.unit.test_workflow_services import World

S = JobStatus


class Killed(BaseException):
    """The pass's process died here (not an Exception: nothing in the pass may catch it)."""


def _world(
    hosts: int, gpus: int, sizes: list[int], workers: int, max_group: int = 1
) -> tuple[World, list[Job]]:
    """``max_group`` 1 (by default): each placement its own transaction, as these tests count them."""
    w = World(hosts=hosts, gpus=gpus)
    object.__setattr__(w.scheduler, "apply_workers", workers)
    object.__setattr__(w.scheduler, "max_group", max_group)
    jobs = []
    for g in sizes:
        job = w.submit(gpus=g)
        w.workflow.await_placement(job.id, f"place-{job.id}")
        jobs.append(job)
    return w, jobs


def _check_placed_once(w: World, jobs: list[Job]) -> list[Job]:
    """Every STARTING job was placed once (attempt 1, one STARTING event) and the hosts hold exactly
    the placed jobs' GPUs; returns the placed jobs."""
    placed = [w.job(j.id) for j in jobs if w.job(j.id).status is S.STARTING]
    for job in jobs:
        stored = w.job(job.id)
        starts = [e for e in w.jobs.events(job.id) if e.to is S.STARTING]
        assert len(starts) == (1 if stored.status is S.STARTING else 0)
        assert stored.status in (S.STARTING, S.QUEUED)
    expected: dict[tuple[str, str], tuple[str, ...]] = {}
    for job in placed:
        assert job.attempts == 1 and isinstance(job.placement, OnPremPlacement)
        for h in job.placement.hosts:
            expected[(h.host_id, attempt_key(job.id, 1))] = h.gpu_ids
    actual = {(r.host_id, k): hold.gpu_ids for r in w.hosts.list_hosts() for k, hold in r.holds.items()}
    assert actual == expected
    held = [g for ids in actual.values() for g in ids]
    assert len(held) == len(set(held))
    return placed


def _recover(w: World) -> None:
    """The next passes, without faults: one now, one after the orphan grace period (the hosts keep
    heartbeating meanwhile)."""
    w.scheduler.run_pass()
    w.clock.now += timedelta(seconds=w.settings.orphan_grace_s + 1)
    for r in w.hosts.list_hosts():
        w.hosts.heartbeat(r.host_id, w.clock.now + timedelta(seconds=w.settings.lease_s))
    w.scheduler.run_pass()


# -- the pool ------------------------------------------------------------------------------------------
class SlowPlacements(FakePlacements):
    """Each placement takes a while (as a transaction at AWS latency), recording what is in flight."""

    def __init__(self, jobs: Any, hosts: Any) -> None:
        super().__init__(jobs, hosts)
        self.lock = threading.Lock()
        self.in_flight: list[set[str]] = []
        self.most = 0
        self.shared = 0

    def place(self, job: Job, event: Any, attempt: str, holds: Any) -> None:
        mine = {h.host_id for h in holds}
        with self.lock:
            self.shared += sum(1 for other in self.in_flight if other & mine)
            self.in_flight.append(mine)
            self.most = max(self.most, len(self.in_flight))
        try:
            time.sleep(0.01)
            super().place(job, event, attempt, holds)
        finally:
            with self.lock:
                self.in_flight.remove(mine)


def test_a_parallel_pass_places_concurrently_without_touching_one_host_twice_at_once() -> None:
    rng = random.Random(3)
    w, jobs = _world(hosts=12, gpus=8, sizes=[rng.choice((1, 1, 2, 4, 8)) for _ in range(60)], workers=8)
    slow = SlowPlacements(w.jobs, w.hosts)
    object.__setattr__(w.scheduler, "placements", slow)
    report = w.scheduler.run_pass()
    placed = _check_placed_once(w, jobs)
    assert report.placed == len(placed) > 12 and report.skipped == report.deferred == 0
    assert slow.most > 1  # the pool overlapped placements
    assert slow.shared == 0  # never two in flight on one host
    answered = {c[1] for c in w.tokens.of("succeed")}
    assert answered == {f"place-{j.id}" for j in placed}  # every token answered, in the pool
    assert len(w.tokens.of("succeed")) == len(placed)


def test_placements_pick_disjoint_gpus_from_the_snapshot_without_reading_hosts() -> None:
    w, jobs = _world(hosts=2, gpus=8, sizes=[2, 2, 2, 2, 4, 4], workers=4)
    reads: list[str] = []
    get = w.hosts.get

    def counting_get(host_id: str) -> HostRecord | None:
        reads.append(host_id)
        return get(host_id)

    object.__setattr__(w.hosts, "get", counting_get)
    report = w.scheduler.run_pass()
    assert report.placed == 6 and reads == []
    _check_placed_once(w, jobs)


def test_gpu_picker_hands_out_each_free_gpu_once() -> None:
    w = World(hosts=1, gpus=4)
    w.hosts.hold("h0", "j-x#1", ("GPU-h0-1",), 1, 1)
    picker = GpuPicker(w.hosts.list_hosts())
    assert picker.take("h0", 2) == ("GPU-h0-0", "GPU-h0-2")
    assert picker.take("h0", 2) is None  # one left: nothing taken
    assert picker.take("h0", 1) == ("GPU-h0-3",)
    assert picker.take("nope", 1) is None and picker.take("h0", 0) is None


def test_run_bounded_stops_starting_work_after_a_failure_and_raises_it() -> None:
    started: list[int] = []

    def task(i: int) -> Callable[[], int]:
        def run() -> int:
            started.append(i)
            if i == 0:
                raise Killed()
            return i

        return run

    with pytest.raises(Killed):
        run_bounded([task(i) for i in range(5)], 1, Deadline(), -1)
    assert started == [0]
    locks = HostLocks()
    with locks.holding(["b", "a", "a"]):
        pass  # the same host twice in one placement takes its lock once


# -- the deadline ----------------------------------------------------------------------------------------
def test_a_pass_stops_applying_at_its_deadline_and_asks_for_the_next_pass() -> None:
    w, jobs = _world(hosts=2, gpus=8, sizes=[2] * 6, workers=1)
    for _ in range(2):  # no V100 host: these two wait, with a reason
        job = w.submit(resources={"gpu_type": "V100", "gpus": 1})
        w.workflow.await_placement(job.id, f"place-{job.id}")
        jobs.append(job)
    object.__setattr__(w.scheduler, "min_placements", 0)
    left = [30.0]
    place = w.scheduler.placements.place  # type: ignore[union-attr]

    def slow_place(*args: Any) -> None:
        place(*args)
        left[0] -= 4.0  # each placement takes 4 s of the invocation

    object.__setattr__(w.scheduler.placements, "place", slow_place)
    report = w.scheduler.run_pass(time_left=lambda: left[0])
    # 30 -> 26 -> 22 -> 18: under the 20 s reserve after three placements.
    assert report.placed == 3 and report.deferred == 3 and report.skipped == 0
    assert ("deferred placements", 0) in w.trigger.requests
    assert report.reasons_written == 0 and report.reasons_deferred == 2  # the two V100 jobs wait
    _check_placed_once(w, jobs)
    nxt = w.scheduler.run_pass()  # no deadline: the rest
    assert nxt.placed == 3 and nxt.deferred == 0 and nxt.reasons_written == 2
    assert len(_check_placed_once(w, jobs)) == 6


def test_a_pass_reads_full_items_a_window_at_a_time_and_not_past_its_deadline() -> None:
    w, jobs = _world(hosts=3, gpus=8, sizes=[2] * 9, workers=1)
    object.__setattr__(w.scheduler, "min_placements", 0)
    object.__setattr__(w.scheduler, "hydrate_window", 3)
    read: list[list[str]] = []
    hydrate = w.scheduler.source.hydrate

    def counted(ids: Any) -> dict[str, Job]:
        wanted = list(ids)
        read.append(wanted)
        return hydrate(wanted)

    object.__setattr__(w.scheduler.source, "hydrate", counted)
    left = [34.0]
    place = w.scheduler.placements.place  # type: ignore[union-attr]

    def slow_place(*args: Any) -> None:
        place(*args)
        left[0] -= 4.0

    object.__setattr__(w.scheduler.placements, "place", slow_place)
    report = w.scheduler.run_pass(time_left=lambda: left[0])
    # 34 -> 30 -> 26 -> 22 (the first window), 22 -> 18 (the second's first): the third window
    # is never read
    assert [len(ids) for ids in read] == [3, 3]
    assert report.placed == 4 and report.deferred == 5 and report.skipped == 0
    assert ("deferred placements", 0) in w.trigger.requests
    _check_placed_once(w, jobs)
    nxt = w.scheduler.run_pass()
    assert nxt.placed == 5 and len(_check_placed_once(w, jobs)) == 9


def test_a_pass_whose_load_ate_its_time_still_places_a_few() -> None:
    w, jobs = _world(hosts=2, gpus=8, sizes=[2] * 6, workers=2)
    object.__setattr__(w.scheduler, "min_placements", 2)
    report = w.scheduler.run_pass(time_left=lambda: 1.0)  # past the deadline before it applies
    assert report.placed == 2 and report.deferred == 4
    assert ("deferred placements", 0) in w.trigger.requests
    _check_placed_once(w, jobs)


# -- reasons ---------------------------------------------------------------------------------------------
def test_unchanged_reasons_are_never_written_and_changed_ones_alone() -> None:
    w, jobs = _world(hosts=1, gpus=8, sizes=[8, 8, 8], workers=4)
    first = w.scheduler.run_pass()
    assert first.placed == 1 and first.reasons_written == 2
    waiting = [w.job(j.id) for j in jobs if w.job(j.id).status is S.QUEUED]
    assert all(j.reason.startswith("waiting for placement (") for j in waiting)
    versions = {j.id: j.version for j in waiting}
    writes: list[str] = []
    set_reason = w.jobs.set_reason

    def counting(job: Job, reason: str) -> bool:
        writes.append(job.id)
        return set_reason(job, reason)

    object.__setattr__(w.jobs, "set_reason", counting)
    update = w.jobs.update

    def no_full_writes(job: Job) -> None:
        raise AssertionError(f"a full write of {job.id} for its reason")

    object.__setattr__(w.jobs, "update", no_full_writes)
    for _ in range(3):
        assert w.scheduler.run_pass().reasons_written == 0
    assert writes == []
    object.__setattr__(w.jobs, "update", update)
    assert {j.id: w.job(j.id).version for j in waiting} == versions  # a reason write is no new version


# -- killed at every point -------------------------------------------------------------------------------
class Dying:
    """Wraps the pass's remote calls (placement transactions, token answers, reason writes, pass
    requests); the ``at``-th call and every later one raise ``Killed``, before their effect or, with
    ``after``, once it is done (the process died before it saw the answer)."""

    def __init__(self, at: int, after: bool) -> None:
        self.at, self.after = at, after
        self.calls = 0
        self.lock = threading.Lock()

    def wrap(self, target: Any, name: str) -> None:
        real = getattr(target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                n, self.calls = self.calls, self.calls + 1
            if n < self.at:
                return real(*args, **kwargs)
            if self.after and n == self.at:
                real(*args, **kwargs)
            raise Killed(f"killed at call {n} ({name})")

        object.__setattr__(target, name, call)

    def install(self, w: World) -> list[tuple[Any, str, Any]]:
        targets = [
            (w.scheduler.placements, "place"),
            (w.scheduler.placements, "place_many"),
            (w.tokens, "succeed"),
            (w.jobs, "set_reason"),
            (w.trigger, "request"),
        ]
        saved = [(t, n, getattr(t, n)) for t, n in targets]
        for t, n in targets:
            self.wrap(t, n)
        return saved


SIZES = [4, 4, 8, 2, 2, 1]  # 21 GPUs of 24: they all fit, in any order


def _killable_world(workers: int, max_group: int = 1) -> tuple[World, list[Job]]:
    w, jobs = _world(hosts=3, gpus=8, sizes=SIZES, workers=workers, max_group=max_group)
    for _ in range(2):  # no V100 host: these wait, with a reason written
        job = w.submit(resources={"gpu_type": "V100", "gpus": 1})
        w.workflow.await_placement(job.id, f"place-{job.id}")
        jobs.append(job)
    return w, jobs


def _calls_of_a_clean_pass(workers: int, max_group: int = 1) -> tuple[int, int]:
    w, jobs = _killable_world(workers, max_group)
    counter = Dying(at=10**6, after=False)
    counter.install(w)
    w.scheduler.run_pass()
    return counter.calls, len(_check_placed_once(w, jobs))


@pytest.mark.parametrize("max_group", [1, MAX_GROUP])
@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("after", [False, True])
def test_a_pass_killed_at_any_point_loses_and_doubles_nothing(
    workers: int, after: bool, max_group: int
) -> None:
    calls, placed = _calls_of_a_clean_pass(workers, max_group)
    # transactions (one per placement, or fewer, grouped), tokens, reasons and a request: every point
    assert calls > placed * 2 if max_group == 1 else calls > placed + 2
    for at in range(calls):
        w, jobs = _killable_world(workers, max_group)
        saved = Dying(at, after).install(w)
        with pytest.raises(Killed):
            w.scheduler.run_pass()
        _check_placed_once(w, jobs)  # consistent as the pass left it
        for target, name, real in saved:
            object.__setattr__(target, name, real)
        _recover(w)
        done = _check_placed_once(w, jobs)
        assert len(done) == placed, f"killed at call {at}: {len(done)} placed, not {placed}"
        answered = {c[1] for c in w.tokens.of("succeed")}
        assert {f"place-{j.id}" for j in done} <= answered, f"killed at call {at}: a token never answered"


def test_a_gang_across_hosts_is_one_transaction() -> None:
    w = World(hosts=2, gpus=4)
    job = w.submit(resources={"gpu_type": "A100", "gpus": 8, "nodes": 2})
    w.workflow.await_placement(job.id, "place-gang")
    calls: list[list[str]] = []
    place = w.scheduler.placements.place  # type: ignore[union-attr]

    def recording(job: Job, event: Any, attempt: str, holds: Any) -> None:
        calls.append(sorted(h.host_id for h in holds))
        place(job, event, attempt, holds)

    object.__setattr__(w.scheduler.placements, "place", recording)
    assert w.scheduler.run_pass().placed == 1
    assert calls == [["h0", "h1"]]
    placed = _check_placed_once(w, [job])
    assert len(placed) == 1 and len(w.held()) == 8


def _submit_as(w: World, tenant: str, user: str) -> Job:
    from berth.domain.job import new_job, new_job_id
    from berth.domain.job_spec import JobSpec

    spec = JobSpec.model_validate(
        {"name": "t", "image": "busybox", "command": ["true"], "resources": {"gpu_type": "A100", "gpus": 8}}
    )
    job, event = new_job(new_job_id(w.clock()), tenant, user, spec, w.clock())
    w.jobs.create(job, event, max_active=1000)
    w.workflow.await_placement(job.id, f"place-{job.id}")
    return job


def test_a_pass_writes_at_most_its_reason_budget_heads_of_every_tenant_first() -> None:
    w = World(hosts=1, gpus=8)
    object.__setattr__(w.scheduler, "max_reason_writes", 3)
    first_job = w.submit(gpus=8)  # the host's heartbeat goes stale as the clock moves: all nine wait
    w.workflow.await_placement(first_job.id, f"place-{first_job.id}")
    queued: dict[str, list[Job]] = {"vision": [first_job], "nlp": []}
    for _ in range(4):
        for tenant, user in (("vision", "alice"), ("nlp", "nina")):
            w.clock.now += timedelta(seconds=1)
            queued[tenant].append(_submit_as(w, tenant, user))
    first = w.scheduler.run_pass()
    waiting = {t: [j for j in js if w.job(j.id).status is S.QUEUED] for t, js in queued.items()}
    total = sum(len(js) for js in waiting.values())
    assert total >= 7 and first.reasons_written == 3 and first.reasons_deferred == total - 3
    written = {
        j.id
        for js in waiting.values()
        for j in js
        if w.job(j.id).reason.startswith("waiting for placement (")
    }
    # Round-robin over the tenants (by name) in queue order: both heads, then nlp's second.
    assert written == {waiting["nlp"][0].id, waiting["vision"][0].id, waiting["nlp"][1].id}
    second = w.scheduler.run_pass()  # the written ones are unchanged: the next three
    assert second.reasons_written == 3 and second.reasons_deferred == total - 6
    third = w.scheduler.run_pass()
    assert third.reasons_written == total - 6 and third.reasons_deferred == 0
    assert all(w.job(j.id).reason.startswith("waiting for placement (") for js in queued.values() for j in js)


# -- placements on one host written together -------------------------------------------------------------
class RecordingPlacements(FakePlacements):
    """Records each transaction's jobs; ``lose`` (a job id): that job moves before the first group that
    holds it is written, so the group's transaction fails on it."""

    def __init__(self, jobs: Any, hosts: Any, lose: str | None = None) -> None:
        super().__init__(jobs, hosts)
        self.transactions: list[list[str]] = []
        self.lose = lose

    def place_many(self, writes: Any) -> None:
        ids = [w.job.id for w in writes]
        self.transactions.append(ids)
        if self.lose in ids and len(ids) > 1:
            moved = self.jobs.jobs[self.lose]
            self.jobs.jobs[self.lose] = moved.model_copy(update={"version": moved.version + 1})
        super().place_many(writes)


def test_placements_on_one_host_are_one_transaction_and_each_token_is_answered() -> None:
    w, jobs = _world(hosts=3, gpus=8, sizes=[1, 1, 2, 4, 2, 2, 4, 8], workers=4, max_group=MAX_GROUP)
    recording = RecordingPlacements(w.jobs, w.hosts)
    object.__setattr__(w.scheduler, "placements", recording)
    report = w.scheduler.run_pass()
    placed = _check_placed_once(w, jobs)
    assert report.placed == len(placed) == len(jobs) and report.skipped == report.deferred == 0
    assert len(recording.transactions) < len(jobs)  # fewer transactions than placements
    assert sorted(j for t in recording.transactions for j in t) == sorted(j.id for j in jobs)
    for ids in recording.transactions:  # a transaction's jobs share one host
        hosts = {h.host_id for i in ids for h in w.job(i).placement.hosts}  # type: ignore[union-attr]
        assert len(hosts) == 1
    answered = [c[1] for c in w.tokens.of("succeed")]
    assert sorted(answered) == sorted(f"place-{j.id}" for j in jobs)  # once each


def test_a_group_that_loses_a_race_is_applied_placement_by_placement() -> None:
    w, jobs = _world(hosts=1, gpus=8, sizes=[2, 2, 2, 2], workers=2, max_group=MAX_GROUP)
    recording = RecordingPlacements(w.jobs, w.hosts, lose=jobs[1].id)
    object.__setattr__(w.scheduler, "placements", recording)
    report = w.scheduler.run_pass()
    assert report.placed == 3 and report.skipped == 1
    assert sorted(recording.transactions[0]) == sorted(j.id for j in jobs)  # the group, lost on jobs[1]
    assert sorted(recording.transactions[1:]) == sorted([j.id] for j in jobs)  # then one by one
    placed = _check_placed_once(w, jobs)
    assert {j.id for j in placed} == {jobs[0].id, jobs[2].id, jobs[3].id}
    assert ("placements lost a race", 1) in w.trigger.requests


def test_placement_groups_keep_to_one_host_a_window_a_size_and_one_task_per_array() -> None:
    one, two = ("h0",), ("h1",)
    assert placement_groups([one, one, two, one, None, two], [None] * 6) == [[0, 1, 3], [2, 5], [4]]
    assert placement_groups([one, one, one], [None] * 3, max_group=2) == [[0, 1], [2]]
    assert placement_groups([one, one, one], [None] * 3, max_group=1) == [[0], [1], [2]]
    assert placement_groups([one, two, one], [None] * 3, window=2) == [[0], [1], [2]]
    assert placement_groups([one, one, one], ["a", "a", "b"]) == [[0], [1, 2]]  # a new group takes over
    gang = ("h0", "h1")
    assert placement_groups([one, gang, one], [None] * 3) == [[0, 2], [1]]  # a gang is written alone


# -- single cloud jobs placed together (issue 18) ---------------------------------------------------------
def test_cloud_placements_of_single_jobs_share_transactions_and_each_token_is_answered() -> None:
    """A pass placing five single jobs in the cloud writes them in one transaction (each only its job and
    event), not five; each placement token is answered once. An array task stays alone: its Batch
    array group's tokens wait for the pass."""
    from tests.unit.test_cloud_dispatch import CloudWorld

    w = CloudWorld()
    recording = RecordingPlacements(w.jobs, w.hosts)
    object.__setattr__(w.scheduler, "placements", recording)
    object.__setattr__(w.scheduler, "max_group", MAX_GROUP)
    jobs = [w.submit(constraints={"placement": "cloud"}) for _ in range(5)]
    for job in jobs:
        w.workflow.await_placement(job.id, f"place-{job.id}")
    report = w.scheduler.run_pass()
    assert report.placed == 5
    assert [sorted(t) for t in recording.transactions] == [sorted(j.id for j in jobs)]
    for job in jobs:
        assert w.job(job.id).status is S.STARTING and w.job(job.id).site is not None
    answered = [c[1] for c in w.tokens.of("succeed")]
    assert sorted(answered) == sorted(f"place-{j.id}" for j in jobs)


def test_placement_groups_put_single_cloud_jobs_together_but_never_array_tasks() -> None:
    one = ("h0",)
    assert placement_groups([None, one, None, None], [None, None, None, "a"]) == [[0, 2], [1], [3]]
    assert placement_groups([None, None, None], [None] * 3, max_group=2) == [[0, 1], [2]]
    assert placement_groups([None, None], ["a", "b"]) == [[0], [1]]
