"""``UsageLedger`` contract: one record per attempt, never counted twice, never lowered, and a late
running record never replaces the attempt's final one (fake and DynamoDB alike)."""

from __future__ import annotations

from berth.domain.cost import AttemptUsage, by_site, cloud_spend
from berth.domain.placement import Site

from .conftest import Store


def usage(seconds: float, final: bool = False, **kw: object) -> AttemptUsage:
    base: dict[str, object] = {
        "tenant": "vision",
        "month": "2026-12",
        "job_id": "j-1",
        "attempt": 1,
        "site": Site.CLOUD,
        "location": "us-east-1",
        "gpus": 2,
        "seconds": seconds,
        "hourly_usd": 7.2,
        "final": final,
    }
    base.update(kw)
    return AttemptUsage(**base)  # type: ignore[arg-type]


def test_a_retried_write_counts_once(store: Store) -> None:
    assert store.usage.record(usage(1800))
    assert not store.usage.record(usage(1800))  # the same write again: nothing changes
    [r] = store.usage.month("vision", "2026-12")
    assert r.cost_usd == 3.6 and r.gpu_hours == 1.0


def test_a_running_record_only_grows(store: Store) -> None:
    assert store.usage.record(usage(600))
    assert store.usage.record(usage(1200))
    assert not store.usage.record(usage(900))  # a late, older write
    [r] = store.usage.month("vision", "2026-12")
    assert r.seconds == 1200


def test_the_final_record_wins_over_running_ones(store: Store) -> None:
    assert store.usage.record(usage(1200))
    assert store.usage.record(usage(1000, final=True))  # ended: its final figure replaces the estimate
    assert not store.usage.record(usage(1500))  # a pass that read the job before it ended
    assert not store.usage.record(usage(900, final=True))
    assert store.usage.record(usage(1100, final=True))  # the final task retried a moment later
    [r] = store.usage.month("vision", "2026-12")
    assert r.final and r.seconds == 1100


def test_months_and_tenants_are_apart_and_sites_summed(store: Store) -> None:
    store.usage.record(usage(3600, final=True))
    store.usage.record(usage(3600, final=True, attempt=2))
    store.usage.record(
        usage(7200, job_id="j-2", site=Site.ONPREM, location="default", gpus=4, hourly_usd=4.0)
    )
    store.usage.record(usage(3600, month="2026-11"))
    store.usage.record(usage(3600, tenant="nlp"))
    records = store.usage.month("vision", "2026-12")
    assert sorted((r.job_id, r.attempt) for r in records) == [("j-1", 1), ("j-1", 2), ("j-2", 1)]
    sites = {s.site: s for s in by_site(records)}
    assert round(sites["cloud"].cost_usd, 6) == 14.4 and round(sites["cloud"].gpu_hours, 6) == 4.0
    assert round(sites["onprem"].cost_usd, 6) == 8.0 and round(sites["onprem"].gpu_hours, 6) == 8.0
    assert round(cloud_spend(records), 6) == 14.4
    assert store.usage.month("vision", "2027-01") == []
