"""Data locality: the pass prefers, among hosts that can take a job now, those whose cache holds its
data; never over fairness or quotas, and never waiting for a busy caching host."""

from __future__ import annotations

from dataclasses import replace

from berth.scheduler import schedule
from berth.scheduler.decisions import OnPremAssignment
from berth.scheduler.explain import explain_job
from berth.scheduler.snapshot import Host, TenantState

from .helpers import NOW, host, job, policy, running, snap

DATA = "s3://data/vision/imagenet/"


def cached(h: Host, *sources: str) -> Host:
    return replace(h, cached_datasets=frozenset(sources))


def where(d: object, job_id: str) -> tuple[str, ...]:
    placed = d.outcomes[job_id].placed  # type: ignore[attr-defined]
    assert isinstance(placed, OnPremAssignment), placed
    return tuple(h for h, _ in placed.hosts)


def test_prefers_the_host_that_holds_the_data_all_else_equal() -> None:
    hosts = [host("h1"), cached(host("h2"), DATA), host("h3")]
    j = job("j", gpus=4, datasets=(DATA,))
    d = schedule(snap([j], hosts=hosts), policy(), NOW)
    assert where(d, "j") == ("h2",)
    assert d.outcomes["j"].placed.data_cached_on == ("h2",)  # type: ignore[union-attr]
    # the same job without data, or with locality off, goes where best fit alone puts it
    assert where(schedule(snap([job("j", gpus=4)], hosts=hosts), policy(), NOW), "j") == ("h1",)
    off = policy(data_locality="off")
    d = schedule(snap([j], hosts=hosts), off, NOW)
    assert where(d, "j") == ("h1",) and d.outcomes["j"].placed.data_cached_on == ()  # type: ignore[union-attr]


def test_a_busy_caching_host_never_makes_the_job_wait() -> None:
    busy = cached(host("h2", free=2), DATA)
    d = schedule(snap([job("j", gpus=4, datasets=(DATA,))], hosts=[host("h1"), busy]), policy(), NOW)
    assert where(d, "j") == ("h1",)
    ex = explain_job(snap([job("j", gpus=4, datasets=(DATA,))], hosts=[host("h1"), busy]), policy(), NOW, "j")
    assert ex.data_cached_on == ["h2"] and "had no room: it did not wait for them" in ex.summary


def test_locality_never_outranks_fair_share() -> None:
    # tenant a already runs 8 GPUs (higher share); b's job goes first and takes the one free host
    # even though it is the host caching a's data.
    hosts = [host("h0", free=0), cached(host("h1"), DATA)]
    d = schedule(
        snap(
            [job("a1", "a", gpus=8, datasets=(DATA,), submitted_at=NOW - 100), job("b1", "b", gpus=8)],
            running_jobs=[running("r", "a", (("h0", 8),))],
            hosts=hosts,
        ),
        policy(burst=None),
        NOW,
    )
    assert where(d, "b1") == ("h1",) and d.outcomes["a1"].placed is None


def test_locality_never_outranks_quota() -> None:
    t = {"a": TenantState("a", guaranteed_gpus={"V100": 4}, borrow_limit_gpus={"V100": 0})}
    hosts = [cached(host("h1"), DATA)]
    d = schedule(
        snap([job("a1", "a", gpus=8, datasets=(DATA,))], hosts=hosts, tenants=t), policy(burst=None), NOW
    )
    assert d.outcomes["a1"].placed is None


def test_a_gang_takes_the_caching_hosts_first_and_fills_by_best_fit() -> None:
    hosts = [host("h1"), host("h2"), cached(host("h3"), DATA), host("h4", pool="p2"), host("h5", pool="p2")]
    d = schedule(snap([job("g", gpus=16, nodes=2, datasets=(DATA,))], hosts=hosts), policy(), NOW)
    assert "h3" in where(d, "g") and len(where(d, "g")) == 2
    assert d.outcomes["g"].placed.data_cached_on == ("h3",)  # type: ignore[union-attr]


def test_explain_names_the_caching_host_when_placed_there() -> None:
    hosts = [host("h1"), cached(host("h2"), DATA, "s3://other/")]
    ex = explain_job(snap([job("j", gpus=4, datasets=(DATA,))], hosts=hosts), policy(), NOW, "j")
    assert ex.outcome == "onprem" and ex.data_cached_on == ["h2"]
    assert "its data is cached there (h2)" in ex.summary
    # an unhealthy caching host does not count
    sick = [host("h1"), cached(host("h2", healthy=False), DATA)]
    ex = explain_job(snap([job("j", gpus=4, datasets=(DATA,))], hosts=sick), policy(), NOW, "j")
    assert ex.data_cached_on == [] and "cached" not in ex.summary


def test_prefer_goes_to_the_caching_host_over_best_fit_and_ties_only_breaks_ties() -> None:
    # the caching host has 8 free GPUs, another exactly the 4 the job needs
    hosts = [cached(host("h1"), DATA), host("h2", free=4)]
    j = job("j", gpus=4, datasets=(DATA,))
    assert where(schedule(snap([j], hosts=hosts), policy(), NOW), "j") == ("h1",)  # prefer (default)
    ties = policy(data_locality="ties")
    assert where(schedule(snap([j], hosts=hosts), ties, NOW), "j") == ("h2",)  # best fit kept
    hosts = [host("h1", free=4), cached(host("h2", free=4), DATA), host("h3")]
    assert where(schedule(snap([j], hosts=hosts), ties, NOW), "j") == ("h2",)  # equal fit: the cache
    assert where(schedule(snap([job("j", gpus=4)], hosts=hosts), ties, NOW), "j") == ("h1",)
