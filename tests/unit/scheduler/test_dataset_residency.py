"""Registered datasets become the core's residency rules (issue 9): jobs reading an on-prem-only
dataset stay on-prem, in the pools where it exists."""

from __future__ import annotations

from berth.domain.storage import Dataset
from berth.scheduler.adapter import dataset_residency, with_dataset_residency
from berth.scheduler.core import schedule
from berth.scheduler.decisions import CloudAssignment, OnPremAssignment
from tests.unit.scheduler.helpers import NOW, host, job, offer, policy, snap

GLUE = Dataset.model_validate(
    {"locations": [{"pool": "b", "root": "/datasets/glue"}], "tenants": ["nlp"], "residency": "onprem-only"}
)
PUBLIC = Dataset.model_validate({"locations": [{"pool": "a", "root": "/datasets/c4"}], "tenants": ["nlp"]})


def test_rules_name_the_dataset_its_pools_and_its_residency() -> None:
    glue, public = dataset_residency({"glue": GLUE, "c4": PUBLIC})[::-1]
    assert glue.dataset_prefix == "dataset://glue" and glue.onprem_only and glue.pools == ["b"]
    assert public.dataset_prefix == "dataset://c4" and not public.onprem_only and public.pools == ["a"]


def test_an_onprem_only_dataset_keeps_its_job_in_its_pool_and_out_of_the_cloud() -> None:
    pol = with_dataset_residency(policy(), {"glue": GLUE})
    reader = job("reads-glue", tenant="nlp", datasets=("dataset://glue",))
    other = job("no-data", tenant="nlp")
    full_b = [host("a1", pool="a"), host("b1", pool="b", free=0)]
    d = schedule(snap([reader, other], hosts=full_b, offers=[offer()]), pol, NOW)
    placed = {p.job_id: p for p in d.placements}
    assert "reads-glue" not in placed and "reads-glue" in d.reasons  # pool b is full; no cloud
    assert isinstance(placed["no-data"], (OnPremAssignment, CloudAssignment))
    d = schedule(
        snap([reader], hosts=[host("a1", pool="a"), host("b1", pool="b")], offers=[offer()]), pol, NOW
    )
    (a,) = d.placements
    assert isinstance(a, OnPremAssignment) and a.pool == "b"
