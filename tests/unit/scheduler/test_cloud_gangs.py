"""A gang's cloud offers: AWS Batch multi-node parallel jobs run on on-demand compute environments
only, and on one instance per node, so their price is every node's."""

from __future__ import annotations

from berth.domain.job_spec import PlacementConstraint, SpotPolicy
from berth.scheduler import schedule
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.feasibility import check_feasible
from berth.scheduler.outcomes import Rule

from .helpers import NOW, job, offer, policy, snap

#: p4d.24xlarge: 8 A100, on-demand 32.77, spot 9.8 (the spot price is the cheaper by far).
P4D = offer(itype="p4d.24xlarge", gpu="A100", gpus=8, od=32.77, spot=9.8)


def test_a_gang_gets_on_demand_even_where_spot_is_cheaper_and_pays_for_every_node() -> None:
    gang = job("g", gpus=16, nodes=2, gpu_type="A100", checkpointing=True)
    single = job("s", gpus=8, gpu_type="A100", checkpointing=True)
    d = schedule(snap([gang, single], offers=[P4D]), policy(spot={"use": "always"}), NOW)
    by_id = {a.job_id: a for a in d.placements}
    a = by_id["g"]
    assert isinstance(a, CloudAssignment)
    assert not a.spot and a.queue.endswith("-ondemand") and a.instances == 2
    assert a.hourly_usd == 2 * 32.77
    assert by_id["s"].spot  # a single-node job of the same shape still gets spot


def test_a_gang_takes_one_instance_per_node_even_when_one_instance_has_the_gpus() -> None:
    eight = offer(itype="p3.16xlarge", gpus=8, od=24.48, spot=None)
    (a,) = schedule(snap([job("g", gpus=4, nodes=2)], offers=[eight]), policy(), NOW).placements
    assert isinstance(a, CloudAssignment) and a.instances == 2 and a.hourly_usd == 2 * 24.48


def test_a_gang_that_requires_spot_gets_no_cloud_offer_and_says_why() -> None:
    gang = job("g", gpus=16, nodes=2, gpu_type="A100", spot=SpotPolicy.REQUIRED)
    d = schedule(snap([gang], offers=[P4D]), policy(), NOW)
    assert d.placements == []
    assert Rule.SPOT in d.outcomes["g"].rules
    assert "multi-node" in d.reasons["g"]


def test_a_cloud_only_gang_that_requires_spot_is_refused_at_submit() -> None:
    gang = job("g", gpus=16, nodes=2, gpu_type="A100", placement=PlacementConstraint.CLOUD)
    assert check_feasible(gang, "a", policy(), [], [P4D]) is None
    spot_only = job(
        "g", gpus=16, nodes=2, gpu_type="A100", placement=PlacementConstraint.CLOUD, spot=SpotPolicy.REQUIRED
    )
    found = check_feasible(spot_only, "a", policy(), [], [P4D])
    assert found is not None and found.rule is Rule.SPOT and "multi-node" in found.message
