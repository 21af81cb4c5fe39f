"""Batch queues per instance type and offers limited to the deployed compute environments (issues 11, 23).

AWS Batch chooses neither a GPU model nor an instance size, so each queue's compute environment holds
one instance type; the queue a cloud placement names is the chosen instance type's, and nothing is
offered that no deployed compute environment holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from berth.domain.batch_queues import (
    CloudCapacity,
    CloudCapacityError,
    QueueName,
    batch_queue_name,
    instance_family,
    parse_batch_queue_name,
)
from berth.domain.errors import Infeasible, ValidationFailed
from berth.domain.job import new_job, new_job_id
from berth.domain.job_spec import JobSpec
from berth.domain.tenancy import Caller, Role
from berth.logic.fleet import FleetService
from berth.logic.snapshot import OFFERS, SnapshotSource, default_offers_document
from berth.pricing.catalog import load_offers
from berth.scheduler import schedule
from berth.scheduler.decisions import CloudAssignment
from berth.scheduler.snapshot import CloudOffer
from tests.unit.fakes import FakeDocuments, FakeHosts, fake_store

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
#: When the scheduler looks: past any burst wait of the default policy.
LATER = (NOW + timedelta(days=1)).timestamp()
ADMIN = Caller("arn:aws:iam::1:user/admin", "platform", Role.ADMIN, "admin")
#: What a deployment of g5 (A10G) and p4d (A100) compute environments holds: no V100 (p3), no T4 (g4dn).
CAPACITY = CloudCapacity.of(
    {"us-east-1": ["g5.xlarge", "g5.12xlarge", "p4d.24xlarge"], "us-west-2": ["g5.xlarge", "p4d.24xlarge"]}
)


# -- names ----------------------------------------------------------------------------------------
def test_queue_names_carry_region_instance_type_and_purchase_type() -> None:
    assert instance_family("g6e.48xlarge") == "g6e" and instance_family("p4d.24xlarge") == "p4d"
    assert batch_queue_name("us-east-1", "g5.xlarge", False) == "berth-us-east-1-g5_xlarge-ondemand"
    assert (
        batch_queue_name("ap-southeast-2", "g6e.48xlarge", True) == "berth-ap-southeast-2-g6e_48xlarge-spot"
    )
    for region, instance_type, spot in (
        ("us-east-1", "g5.12xlarge", False),
        ("ap-southeast-2", "g6e.2xlarge", True),
        ("eu-west-1", "p5.48xlarge", True),
        ("us-west-2", "u-6tb1.metal", False),  # a family with a hyphen
    ):
        parsed = parse_batch_queue_name(batch_queue_name(region, instance_type, spot))
        assert parsed == QueueName(region, instance_type, spot)
        assert parsed.family == instance_family(instance_type)


@pytest.mark.parametrize(
    "name",
    [
        "berth-us-east-1-ondemand",
        "berth-us-east-1-spot",
        "berth-us-east-1-g5-ondemand",  # a per-family queue (before issue 23)
        "someone-us-east-1-g5_xlarge-spot",
        "berth-us-east-1-g5_xlarge-cheap",
    ],
)
def test_other_names_are_not_berth_instance_type_queues(name: str) -> None:
    assert parse_batch_queue_name(name) is None


def test_an_offer_is_run_by_its_instance_types_queue() -> None:
    (g5,) = load_offers(regions=["us-west-2"], instance_types=["g5.xlarge"])[:1]
    assert g5.queue_name(False) == "berth-us-west-2-g5_xlarge-ondemand"
    assert g5.queue_name(True) == "berth-us-west-2-g5_xlarge-spot"
    (p5,) = load_offers(regions=["us-east-2"], instance_types=["p5.48xlarge"])[:1]
    assert p5.queue_name(True) == "berth-us-east-2-p5_48xlarge-spot"


# -- the deployed capacity -----------------------------------------------------------------------
def test_capacity_round_trips_through_its_environment_variable() -> None:
    text = CAPACITY.to_json()
    assert CloudCapacity.from_json(text) == CAPACITY
    assert CAPACITY.has("us-east-1", "g5.12xlarge") and not CAPACITY.has("us-east-1", "p3.2xlarge")
    assert not CAPACITY.has("us-east-2", "p4d.24xlarge")
    assert CAPACITY.queue_names() == [
        "berth-us-east-1-g5_12xlarge-ondemand",
        "berth-us-east-1-g5_12xlarge-spot",
        "berth-us-east-1-g5_xlarge-ondemand",
        "berth-us-east-1-g5_xlarge-spot",
        "berth-us-east-1-p4d_24xlarge-ondemand",
        "berth-us-east-1-p4d_24xlarge-spot",
        "berth-us-west-2-g5_xlarge-ondemand",
        "berth-us-west-2-g5_xlarge-spot",
        "berth-us-west-2-p4d_24xlarge-ondemand",
        "berth-us-west-2-p4d_24xlarge-spot",
    ]


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"Mars": ["g5.xlarge"]}', '{"us-east-1": "g5.xlarge"}', '{"us-east-1": ["g5"]}'],
)
def test_a_malformed_capacity_is_refused(text: str) -> None:
    with pytest.raises(CloudCapacityError):
        CloudCapacity.from_json(text)


# -- offers ----------------------------------------------------------------------------------------
def _source(capacity: CloudCapacity | None, documents: FakeDocuments | None = None) -> SnapshotSource:
    jobs, tenants = fake_store()
    return SnapshotSource(
        jobs, tenants, FakeHosts(), documents or FakeDocuments(), lambda: NOW, capacity=capacity
    )


def test_default_offers_are_the_catalog_limited_to_the_deployed_instance_types() -> None:
    everything = default_offers_document()["offers"]
    assert {"p3.2xlarge", "g4dn.xlarge"} <= {o["instance_type"] for o in everything}
    offers, version = _source(CAPACITY).offers()
    assert version == 0 and offers
    assert {(o.region, o.instance_type) for o in offers} == {
        (r, t) for r, types in CAPACITY.regions.items() for t in types
    }
    assert not any(o.gpu_type in ("V100", "T4") for o in offers)
    # The document a member reads is the same one.
    shown = FleetService(_source(CAPACITY)).get_document(ADMIN, OFFERS).document["offers"]
    assert {(o["region"], o["instance_type"]) for o in shown} == {(o.region, o.instance_type) for o in offers}
    # Without a known capacity (no Batch stacks): the whole catalog, as before.
    assert len(_source(None).offers()[0]) == len(everything)


def _offer(instance_type: str, region: str = "us-east-1", **kw: Any) -> dict[str, Any]:
    (o,) = load_offers(regions=[region], instance_types=[instance_type])[:1]
    doc = {
        "region": o.region,
        "zone": o.zone,
        "instance_type": o.instance_type,
        "gpu_type": o.gpu_type,
        "gpus": o.gpus,
        "vcpus": o.vcpus,
        "memory_gib": o.memory_gib,
        "on_demand_usd_h": o.on_demand_usd_h,
        "spot_usd_h": o.spot_usd_h,
    }
    return {**doc, **kw}


def test_storing_an_offer_no_compute_environment_runs_is_refused() -> None:
    svc = FleetService(_source(CAPACITY))
    with pytest.raises(ValidationFailed) as err:
        svc.put_document(ADMIN, OFFERS, {"offers": [_offer("g5.xlarge"), _offer("p3.2xlarge")]}, None)
    assert "us-east-1 p3.2xlarge" in str(err.value) and err.value.details == [
        {"field": "offers", "message": "not deployed: us-east-1 p3.2xlarge"}
    ]
    # An offer naming another type's queue would run on that type (another model, or another size
    # at another price): refused too.
    for queue in ("berth-us-east-1-p4d_24xlarge-spot", "berth-us-east-1-g5_12xlarge-ondemand"):
        with pytest.raises(ValidationFailed):
            svc.put_document(ADMIN, OFFERS, {"offers": [_offer("g5.xlarge", queue=queue)]}, None)
    stored = svc.put_document(
        ADMIN,
        OFFERS,
        {"offers": [_offer("g5.xlarge"), _offer("g5.xlarge", queue="berth-us-east-1-g5_xlarge-spot")]},
        None,
    )
    assert stored.version == 1


def test_a_stored_document_is_intersected_with_the_deployed_capacity() -> None:
    """A document stored before a compute environment went away never places a job there."""
    documents = FakeDocuments()
    documents.put(OFFERS, {"offers": [_offer("g5.xlarge"), _offer("p3.2xlarge")]}, 0, NOW, "admin")
    offers, version = _source(CAPACITY, documents).offers()
    assert version == 1 and [o.instance_type for o in offers] == ["g5.xlarge"]


# -- the regression: placements only where a compute environment of the GPU model runs -------------
def _pending(source: SnapshotSource, gpu_type: str, placement: str = "cloud") -> str:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": gpu_type, "gpus": 1, "cpu": 4, "memory_gib": 16},
            "constraints": {"placement": placement},
        }
    )
    job, event = new_job(new_job_id(NOW), "vision", "arn:x", spec, NOW)
    source.jobs.create(job, event, max_active=10)
    return job.id


def _placements(source: SnapshotSource) -> list[CloudAssignment]:
    snapshot, fleet, _ = source.snapshot()
    decisions = schedule(snapshot, fleet.policy, LATER)
    return [a for a in decisions.placements if isinstance(a, CloudAssignment)]


def test_a_v100_job_gets_no_cloud_placement_when_no_compute_environment_has_v100s() -> None:
    # Without the capacity the catalog's p3 (V100) offers would place it: the test can fail.
    unrestricted = _source(None)
    _pending(unrestricted, "V100", placement="auto")
    (before,) = _placements(unrestricted)
    assert before.instance_type.startswith("p3.")

    source = _source(CAPACITY)
    job_id = _pending(source, "V100", placement="auto")
    assert _placements(source) == []
    snapshot, fleet, _ = source.snapshot()
    assert not [o for o in fleet.offers if o.gpu_type == "V100"]
    assert schedule(snapshot, fleet.policy, LATER).reasons[job_id]
    # ...and a cloud-only V100 job is refused at submit (422), not queued for ever.
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "V100", "gpus": 1},
            "constraints": {"placement": "cloud"},
        }
    )
    with pytest.raises(Infeasible):
        FleetService(source).check(spec, "vision")
    FleetService(unrestricted).check(spec, "vision")


def test_an_a10g_job_goes_to_the_queue_of_the_instance_type_it_was_priced_on() -> None:
    source = _source(CAPACITY)
    _pending(source, "A10G")
    (a,) = _placements(source)
    assert a.instance_type.startswith("g5.")
    family, size = a.instance_type.split(".")
    assert a.queue == f"berth-{a.region}-{family}_{size}-{'spot' if a.spot else 'ondemand'}"
    queue = parse_batch_queue_name(a.queue)
    assert queue is not None and queue.instance_type == a.instance_type and queue.spot == a.spot


def test_an_offer_queue_override_is_kept_for_simulations() -> None:
    offer = CloudOffer("us-east-1", "z", "g5.xlarge", "A10G", 1, 4, 16, 1.0, queue="sim-queue")
    assert offer.queue_name(True) == offer.queue_name(False) == "sim-queue"
