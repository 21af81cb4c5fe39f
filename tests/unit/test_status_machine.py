import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth.domain.errors import IllegalTransition
from berth.domain.status import (
    TERMINAL,
    TRANSITIONS,
    JobStatus,
    can_transition,
    cancel_target,
    check_transition,
)

S = JobStatus


def test_table_covers_every_status() -> None:
    assert set(TRANSITIONS) == set(JobStatus)


def test_terminal_states_have_no_exit() -> None:
    for s in TERMINAL:
        assert TRANSITIONS[s] == frozenset()
        assert s.is_terminal


def test_every_state_reachable_from_queued() -> None:
    seen, frontier = {S.QUEUED}, [S.QUEUED]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(JobStatus)


def test_happy_path_and_illegal_moves() -> None:
    for a, b in [(S.QUEUED, S.STARTING), (S.STARTING, S.RUNNING), (S.RUNNING, S.COMPLETED)]:
        check_transition(a, b)
    with pytest.raises(IllegalTransition, match="a COMPLETED job cannot become RUNNING"):
        check_transition(S.COMPLETED, S.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(S.QUEUED, S.RUNNING)  # must pass through STARTING


@given(st.lists(st.sampled_from(list(JobStatus)), min_size=1, max_size=30))
def test_random_walks_only_follow_the_table(steps: list[JobStatus]) -> None:
    current = S.QUEUED
    for target in steps:
        if can_transition(current, target):
            check_transition(current, target)
            current = target
        else:
            with pytest.raises(IllegalTransition):
                check_transition(current, target)
        # Once terminal, nothing moves the job again.
        if current.is_terminal:
            assert all(not can_transition(current, t) for t in JobStatus)


@given(st.sampled_from(list(JobStatus)))
def test_cancel_target_is_a_legal_move(src: JobStatus) -> None:
    if src.is_terminal or src is S.CANCELING:
        with pytest.raises(IllegalTransition):
            cancel_target(src)
    else:
        assert can_transition(src, cancel_target(src))
