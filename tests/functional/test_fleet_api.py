"""Fleet and policy through the API Lambda on moto: the stored policy and offers, feasibility at
submit, ``explain`` and ``capacity`` (issue 8, item 1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from berth.scheduler.defaults import default_policy
from berth.scheduler.outcomes import Rule
from tests.functional.conftest import TABLES, Invoke, cold_start


def _register(host_id: str, model: str, gpus: int, pool: str = "default", lease_h: float = 1.0) -> None:
    from berth.dal.hosts import DynamoHostRepository
    from berth.domain.fleet import HostInventory

    DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"]).register(
        HostInventory(
            host_id=host_id,
            pool=pool,
            gpu_type=model,
            gpu_ids=tuple(f"GPU-{host_id}-{i}" for i in range(gpus)),
            cpu=64,
            memory_gib=512,
        ),
        datetime.now(UTC) + timedelta(hours=lease_h),
    )


@pytest.fixture
def fleet(api: Invoke) -> Invoke:
    _register("v100-a", "V100", 8)
    _register("v100-b", "V100", 8)
    _register("a100-a", "A100", 8, pool="lab")
    return api


def test_policy_default_then_versions_kept(api: Invoke) -> None:
    status, body = api("GET", "/v1/policy")
    assert status == 200
    assert body["version"] == 0 and body["source"] == "default"
    assert body["document"] == default_policy().model_dump(mode="json")

    doc = {**body["document"], "name": "strict", "burst": None}
    status, v1 = api("PUT", "/v1/policy", user="admin", body=doc)
    assert status == 200, v1
    assert v1["version"] == 1 and v1["source"] == "stored" and v1["updated_by"] == "admin"
    assert v1["document"]["burst"] is None

    status, v2 = api("PUT", "/v1/policy", user="admin", body={"name": "minimal"}, headers={"If-Match": "1"})
    assert status == 200 and v2["version"] == 2
    # the admin edited version 1, but 2 is current now: refused, nothing written
    status, err = api("PUT", "/v1/policy", user="admin", body={"name": "late"}, headers={"If-Match": "1"})
    assert status == 409 and err["error"]["code"] == "Conflict"
    assert api("GET", "/v1/policy")[1]["version"] == 2
    assert api("GET", "/v1/policy", query={"version": "1"})[1]["document"]["name"] == "strict"
    assert api("GET", "/v1/policy", query={"version": "0"})[1]["source"] == "default"
    status, err = api("GET", "/v1/policy", query={"version": "7"})
    assert status == 404 and err["error"]["code"] == "NotFound"


@pytest.mark.parametrize(
    ("user", "body", "status", "code"),
    [
        ("alice", {"name": "x"}, 403, "Forbidden"),
        ("admin", {"name": "x", "burst": {"min_wait_s": -1}}, 422, "ValidationError"),
        ("admin", {"nonsense": True}, 422, "ValidationError"),
        ("admin", [1, 2], 422, "ValidationError"),
    ],
)
def test_policy_bad_writes_are_4xx_and_store_nothing(
    api: Invoke, user: str, body: Any, status: int, code: str
) -> None:
    got, err = api("PUT", "/v1/policy", user=user, body=body)
    assert (got, err["error"]["code"]) == (status, code), err
    assert api("GET", "/v1/policy")[1]["version"] == 0


def test_offers_default_is_the_catalog_and_can_be_replaced(api: Invoke) -> None:
    from berth.pricing.catalog import load_offers

    status, body = api("GET", "/v1/offers")
    assert status == 200 and body["version"] == 0
    assert len(body["document"]["offers"]) == len(load_offers())
    one = {
        "region": "us-west-2",
        "zone": "usw2-az1",
        "instance_type": "p3.2xlarge",
        "gpu_type": "V100",
        "gpus": 1,
        "vcpus": 8,
        "memory_gib": 61,
        "on_demand_usd_h": 3.06,
    }
    status, stored = api("PUT", "/v1/offers", user="admin", body={"offers": [one]})
    assert status == 200 and stored["version"] == 1 and len(stored["document"]["offers"]) == 1
    status, err = api("PUT", "/v1/offers", user="admin", body={"offers": [{**one, "gpus": 0}]})
    assert status == 422 and err["error"]["details"][0]["field"] == "offers.0.gpus"


def test_offers_are_limited_to_the_deployed_compute_environments(
    api: Invoke, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``BERTH_CLOUD_CAPACITY`` (what the stack sets): only those instance types are offered, an
    offer of another is refused with 422, and a cloud-only V100 job (no p3 compute environment) too."""
    monkeypatch.setenv("BERTH_CLOUD_CAPACITY", '{"us-west-2":["g5.xlarge","p4d.24xlarge"]}')
    cold_start()
    status, body = api("GET", "/v1/offers")
    assert status == 200 and body["version"] == 0
    assert {(o["region"], o["instance_type"]) for o in body["document"]["offers"]} == {
        ("us-west-2", "g5.xlarge"),
        ("us-west-2", "p4d.24xlarge"),
    }
    p3 = {
        "region": "us-west-2",
        "zone": "usw2-az1",
        "instance_type": "p3.2xlarge",
        "gpu_type": "V100",
        "gpus": 1,
        "vcpus": 8,
        "memory_gib": 61,
        "on_demand_usd_h": 3.06,
    }
    status, err = api("PUT", "/v1/offers", user="admin", body={"offers": [p3]})
    assert status == 422 and err["error"]["code"] == "ValidationError", err
    assert "us-west-2 p3.2xlarge" in err["error"]["message"]
    assert api("GET", "/v1/offers")[1]["version"] == 0
    g5 = {**p3, "instance_type": "g5.xlarge", "gpu_type": "A10G", "vcpus": 4, "memory_gib": 16}
    status, stored = api("PUT", "/v1/offers", user="admin", body={"offers": [g5]})
    assert status == 200 and stored["version"] == 1, stored
    cloud_only = {"constraints": {"placement": "cloud"}}
    status, err = api(
        "POST", "/v1/jobs", body={**spec, **cloud_only, "resources": {"gpu_type": "V100", "gpus": 1}}
    )
    assert status == 422 and err["error"]["code"] == "Infeasible", err


def test_submit_refuses_an_infeasible_job_naming_the_rule(fleet: Invoke, spec: dict[str, Any]) -> None:
    # no H200 hosts, and the catalog sells no H200
    status, err = fleet("POST", "/v1/jobs", body={**spec, "resources": {"gpu_type": "H200", "gpus": 1}})
    assert status == 422, err
    assert err["error"]["code"] == "Infeasible"
    assert err["error"]["details"]["rule"] == Rule.GPU_TYPE
    assert Rule.GPU_TYPE in err["error"]["message"]
    # on-prem only, larger than any host, on one node
    big = {**spec, "resources": {"gpu_type": "V100", "gpus": 16}, "constraints": {"placement": "onprem"}}
    status, err = fleet("POST", "/v1/jobs", body=big)
    assert status == 422 and err["error"]["details"]["rule"] == Rule.SHAPE, err
    assert err["error"]["details"]["largest_shape"]["onprem"]["gpus"] == 8
    # 64 A100s on one node: no host or instance holds it (not eight p4d instances for one container)
    huge = {**spec, "resources": {"gpu_type": "A100", "gpus": 64, "nodes": 1}}
    status, err = fleet("POST", "/v1/jobs", body=huge)
    assert status == 422 and err["error"]["details"]["rule"] == Rule.SHAPE, err
    assert "the largest A100 shape is 8 GPUs" in err["error"]["message"]
    assert "(p4d.24xlarge)" in err["error"]["message"] and "per on-prem host" in err["error"]["message"]
    assert err["error"]["details"]["largest_shape"]["cloud"]["where"] == "p4d.24xlarge"
    # two nodes of two hosts' size: on-prem has two V100 hosts in one pool
    two = {**big, "resources": {"gpu_type": "V100", "gpus": 16, "nodes": 2}}
    assert fleet("POST", "/v1/jobs", body=two)[0] == 201
    # nothing was stored but the feasible gang
    assert len(fleet("GET", "/v1/jobs")[1]["jobs"]) == 1
    # a job the fleet can take is accepted
    ok = {**spec, "constraints": {"placement": "onprem"}}
    assert fleet("POST", "/v1/jobs", body=ok)[0] == 201


def test_feasibility_reads_the_stored_policy(fleet: Invoke, spec: dict[str, Any]) -> None:
    cloud = {**spec, "resources": {"gpu_type": "H100", "gpus": 8}, "constraints": {"placement": "cloud"}}
    assert fleet("POST", "/v1/jobs", body=cloud)[0] == 201
    policy = fleet("GET", "/v1/policy")[1]["document"]
    assert fleet("PUT", "/v1/policy", user="admin", body={**policy, "burst": None})[0] == 200
    from berth.handlers import services

    services.fleet().clear_cache()
    status, err = fleet("POST", "/v1/jobs", body=cloud)
    assert status == 422 and err["error"]["details"]["rule"] == Rule.BURST
    assert err["error"]["details"]["policy_version"] == 1


def test_dataset_residency_counts_at_submit(fleet: Invoke, spec: dict[str, Any]) -> None:
    ds = {
        "locations": [{"pool": "lab", "root": "/data/glue"}],
        "tenants": ["vision"],
        "residency": "onprem-only",
    }
    assert fleet("PUT", "/v1/datasets/glue", user="admin", body=ds)[0] == 200
    reads = {**spec, "data": [{"source": "dataset://glue", "mount": "/data"}]}
    # the dataset lives only in pool "lab", which has A100s; the job wants V100s and may not burst
    status, err = fleet("POST", "/v1/jobs", body=reads)
    assert status == 422, err
    assert err["error"]["details"]["rule"] in {Rule.POOLS, Rule.RESIDENCY, Rule.CAPACITY}
    sites = err["error"]["details"]["sites"]
    assert any(s["rule"] == Rule.RESIDENCY for s in sites), sites
    a100 = {**reads, "resources": {"gpu_type": "A100", "gpus": 2}}
    assert fleet("POST", "/v1/jobs", body=a100)[0] == 201


def test_explain_a_queued_job_from_the_cores_outcome(fleet: Invoke, spec: dict[str, Any]) -> None:
    status, job = fleet("POST", "/v1/jobs", body={**spec, "constraints": {"placement": "onprem"}})
    assert status == 201
    status, out = fleet("GET", f"/v1/jobs/{job['id']}/explain")
    assert status == 200, out
    assert out["status"] == "QUEUED" and out["outcome"] == "onprem"
    ex = out["explanation"]
    assert ex["job_id"] == job["id"] and ex["summary"].startswith("placed on-prem in pool default")
    rows = {c["site"]: c for c in ex["candidates"]}
    assert rows["onprem:lab/A100"]["rule"] == Rule.GPU_TYPE
    assert any(c["chosen"] for c in ex["candidates"])
    assert all(c["rule"] == Rule.PLACEMENT for k, c in rows.items() if k.startswith("cloud:"))


def test_explain_names_why_a_job_waits(fleet: Invoke, spec: dict[str, Any]) -> None:
    from berth.dal.hosts import DynamoHostRepository

    hosts = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    for h in ("v100-a", "v100-b"):
        rec = hosts.get(h)
        assert rec is not None
        hosts.hold(h, f"j-other-{h}#1", rec.free_gpu_ids, 1, 1)
    status, job = fleet("POST", "/v1/jobs", body={**spec, "constraints": {"placement": "onprem"}})
    assert status == 201
    out = fleet("GET", f"/v1/jobs/{job['id']}/explain")[1]
    assert out["outcome"] == "pending"
    assert Rule.CAPACITY in out["explanation"]["rules"]
    assert "on-prem" in out["explanation"]["summary"]


def test_explain_has_the_same_tenant_check_as_get(fleet: Invoke, spec: dict[str, Any]) -> None:
    job = fleet("POST", "/v1/jobs", body=spec)[1]
    status, err = fleet("GET", f"/v1/jobs/{job['id']}/explain", user="bob")
    assert status == 404 and err["error"]["code"] == "NotFound"
    assert fleet("GET", f"/v1/jobs/{job['id']}/explain", user="admin")[0] == 200
    assert fleet("GET", "/v1/jobs/j-00000000000000000000000000/explain")[0] == 404
    assert fleet("GET", "/v1/jobs/bad/explain")[0] == 422


def test_explain_a_finished_job(fleet: Invoke, spec: dict[str, Any]) -> None:
    job = fleet("POST", "/v1/jobs", body=spec)[1]
    assert fleet("POST", f"/v1/jobs/{job['id']}/cancel")[0] == 202
    out = fleet("GET", f"/v1/jobs/{job['id']}/explain")[1]
    assert out["status"] == "CANCELED" and out["outcome"] == "finished" and out["explanation"] is None


def test_capacity(fleet: Invoke) -> None:
    from berth.dal.hosts import DynamoHostRepository

    DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"]).hold(
        "v100-a", "j-x#1", ("GPU-v100-a-0", "GPU-v100-a-1"), 4, 8
    )
    _register("dead", "V100", 4, lease_h=-1)
    status, cap = fleet("GET", "/v1/capacity", user="bob")
    assert status == 200, cap
    assert cap["totals"] == {
        "hosts": 4,
        "gpus": 28,
        "used_gpus": 2,
        "free_gpus": 22,
        "unavailable_gpus": 4,
        "faulted_gpus": 0,
    }
    pools = {p["pool"]: p for p in cap["pools"]}
    assert pools["default"]["models"]["V100"] == {
        "gpus": 20,
        "used_gpus": 2,
        "free_gpus": 14,
        "unavailable_gpus": 4,
        "faulted_gpus": 0,
    }
    assert pools["default"]["healthy_hosts"] == 2 and pools["lab"]["free_gpus"] == 8
    hosts = {h["host_id"]: h for h in cap["hosts"]}
    # j-x is no job of bob's tenant: a member sees only its own tenant's job ids (finding 8a)
    assert hosts["v100-a"]["attempts"] == [] and hosts["v100-a"]["free_gpus"] == 6
    assert hosts["dead"]["alive"] is False
    regions = {r["region"]: r for r in cap["cloud"]["regions"]}
    assert set(regions) == {"us-east-1", "us-east-2", "us-west-2"}
    assert regions["us-east-1"]["circuit"] == "closed"
    assert all(it["circuit"] == "closed" for r in regions.values() for it in r["instance_types"])


def test_capacity_shows_a_member_only_its_own_tenants_job_ids(fleet: Invoke, spec: dict[str, Any]) -> None:
    from berth.dal.hosts import DynamoHostRepository

    mine = fleet("POST", "/v1/jobs", body=spec, user="alice")[1]["id"]
    theirs = fleet("POST", "/v1/jobs", body=spec, user="bob")[1]["id"]
    hosts_repo = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    hosts_repo.hold("v100-a", f"{mine}#1", ("GPU-v100-a-0",), 4, 8)
    hosts_repo.hold("v100-a", f"{theirs}#1", ("GPU-v100-a-1",), 4, 8)

    def attempts(user: str) -> list[str]:
        status, cap = fleet("GET", "/v1/capacity", user=user)
        assert status == 200, cap
        return {h["host_id"]: h for h in cap["hosts"]}["v100-a"]["attempts"]

    assert attempts("alice") == [f"{mine}#1"]
    assert attempts("bob") == [f"{theirs}#1"]
    assert attempts("admin") == sorted([f"{mine}#1", f"{theirs}#1"])


def test_an_admin_drains_a_host_and_lifts_it(fleet: Invoke) -> None:
    def capacity() -> dict[str, Any]:
        status, cap = fleet("GET", "/v1/capacity", user="bob")
        assert status == 200, cap
        return cap

    assert capacity()["totals"]["free_gpus"] == 24
    status, out = fleet("PUT", "/v1/hosts/v100-a/drain", user="admin", body={"drain": True})
    assert status == 200 and out == {"host_id": "v100-a", "drain_requested": True}
    cap = capacity()
    assert {h["host_id"]: h["draining"] for h in cap["hosts"]}["v100-a"] is True
    # nothing more is placed there: its GPUs no longer count as free
    assert cap["totals"]["free_gpus"] == 16 and cap["totals"]["unavailable_gpus"] == 8
    status, out = fleet("PUT", "/v1/hosts/v100-a/drain", user="admin", body={"drain": False})
    assert status == 200 and capacity()["totals"]["free_gpus"] == 24


@pytest.mark.parametrize(
    ("user", "host", "body", "expected"),
    [
        ("alice", "v100-a", {"drain": True}, 403),
        ("admin", "never-registered", {"drain": True}, 404),
        ("admin", "v100-a", {"drain": "yes"}, 422),
        ("admin", "v100-a", {"drain": True, "extra": 1}, 422),
        ("admin", "bad%20host", {"drain": True}, 422),
    ],
)
def test_drain_refusals_are_4xx_and_change_nothing(
    fleet: Invoke, user: str, host: str, body: dict[str, Any], expected: int
) -> None:
    status, out = fleet("PUT", f"/v1/hosts/{host}/drain", user=user, body=body)
    assert status == expected, out
    _, cap = fleet("GET", "/v1/capacity", user="bob")
    assert not any(h["draining"] for h in cap["hosts"])


def test_an_admin_reads_and_resets_the_circuits(fleet: Invoke) -> None:
    """Finding 9: an admin sees which circuits are open and closes them (one, or a whole region)."""
    import time

    from berth.dal.circuits import DynamoCircuitRepository

    repo = DynamoCircuitRepository(TABLES["BERTH_TENANTS_TABLE"])
    now = time.time()
    for i in range(3):
        repo.record_failure("us-east-1", "p4d.24xlarge", now - i)
        repo.record_failure("us-west-2", "*", now - i)
    status, out = fleet("GET", "/v1/circuits", user="admin")
    assert status == 200, out
    rows = {(c["region"], c["instance_type"]): c for c in out["circuits"]}
    assert rows[("us-east-1", "p4d.24xlarge")]["state"] == "open"
    assert rows[("us-east-1", "p4d.24xlarge")]["recent_failures"] == 3
    assert rows[("us-west-2", "*")]["state"] == "open" and out["rule"]["failure_threshold"] == 3

    status, err = fleet("DELETE", "/v1/circuits/us-east-1", user="alice")
    assert status == 403, err
    status, err = fleet("DELETE", "/v1/circuits/nowhere", user="admin")
    assert status == 422, err
    status, err = fleet(
        "DELETE", "/v1/circuits/us-east-1", user="admin", query={"instance_type": "g5.xlarge"}
    )
    assert status == 404, err
    status, out = fleet(
        "DELETE", "/v1/circuits/us-east-1", user="admin", query={"instance_type": "p4d.24xlarge"}
    )
    assert status == 200 and out == {"reset": [{"region": "us-east-1", "instance_type": "p4d.24xlarge"}]}
    status, cap = fleet("GET", "/v1/capacity", user="admin")
    regions = {r["region"]: r for r in cap["cloud"]["regions"]}
    types = {t["instance_type"]: t["circuit"] for t in regions["us-east-1"]["instance_types"]}
    assert types["p4d.24xlarge"] == "closed" and regions["us-west-2"]["circuit"] == "open"
    assert fleet("DELETE", "/v1/circuits/us-west-2", user="admin")[1]["reset"] == [
        {"region": "us-west-2", "instance_type": "*"}
    ]
    assert fleet("GET", "/v1/circuits", user="admin")[1]["circuits"] == []


def test_an_admin_admits_more_gpus_than_a_host_first_registered(fleet: Invoke) -> None:
    """Finding 8c: v100-a registered 8 V100s; 9 are refused until an admin admits them."""
    from berth.domain.fleet import InventoryRefused

    nine = {"gpu_type": "V100", "gpus": 9}
    with pytest.raises(InventoryRefused):
        _register("v100-a", "V100", 9)
    status, err = fleet("PUT", "/v1/hosts/v100-a/admission", user="alice", body=nine)
    assert status == 403, err
    for bad in ({"gpu_type": "V100", "gpus": 17}, {"gpu_type": "V100", "gpus": "9"}, {"gpus": 9}):
        status, err = fleet("PUT", "/v1/hosts/v100-a/admission", user="admin", body=bad)
        assert status == 422, (bad, err)
    status, err = fleet("PUT", "/v1/hosts/nope/admission", user="admin", body=nine)
    assert status == 404, err
    status, out = fleet("PUT", "/v1/hosts/v100-a/admission", user="admin", body=nine)
    assert status == 200 and out == {"host_id": "v100-a", "admitted": {"gpu_type": "V100", "gpus": 9}}
    _register("v100-a", "V100", 9)
    hosts = {h["host_id"]: h for h in fleet("GET", "/v1/capacity", user="admin")[1]["hosts"]}
    assert hosts["v100-a"]["gpus"] == 9 and hosts["v100-a"]["admitted_gpus"] == 9


def test_an_admin_clears_a_gpu_fault_and_the_gpu_is_placeable_again(fleet: Invoke) -> None:
    """GPU health at run time: a fatal fault (as a heartbeat records it, through the DynamoDB adapter)
    shows in capacity and takes the GPU out; only an admin clears it, by index or UUID."""
    from berth.dal.hosts import DynamoHostRepository
    from berth.domain.gpu_health import GpuFault, GpuFaultKind

    repo = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    fault = GpuFault(fault_id="f1", kind=GpuFaultKind.XID, xid=79, at=datetime.now(UTC))
    repo.add_gpu_faults("v100-a", {"GPU-v100-a-3": fault})
    repo.add_gpu_faults("v100-a", {"GPU-v100-a-3": fault.model_copy(update={"fault_id": "f2"})})
    status, cap = fleet("GET", "/v1/capacity", user="bob")
    assert status == 200, cap
    host = {h["host_id"]: h for h in cap["hosts"]}["v100-a"]
    assert host["degraded"] and host["free_gpus"] == 7 and cap["totals"]["faulted_gpus"] == 1
    assert [(f["index"], f["fault_id"], f["reason"]) for f in host["gpu_faults"]] == [
        (3, "f1", "XID 79 (GPU has fallen off the bus)")
    ]
    for user, path, expected in [
        ("alice", "/v1/hosts/v100-a/gpus/3/clear", 403),
        ("admin", "/v1/hosts/never-registered/gpus/3/clear", 404),
        ("admin", "/v1/hosts/v100-a/gpus/9/clear", 404),
        ("admin", "/v1/hosts/v100-a/gpus/GPU-v100-a-0/clear", 409),
        ("admin", "/v1/hosts/v100-a/gpus/bad%20gpu/clear", 422),
    ]:
        status, err = fleet("POST", path, user=user)
        assert status == expected, (path, err)
    assert fleet("GET", "/v1/capacity", user="bob")[1]["totals"]["faulted_gpus"] == 1
    status, out = fleet("POST", "/v1/hosts/v100-a/gpus/GPU-v100-a-3/clear", user="admin")
    assert status == 200 and out["gpu_id"] == "GPU-v100-a-3" and out["fault_id"] == "f1", out
    status, cap = fleet("GET", "/v1/capacity", user="bob")
    host = {h["host_id"]: h for h in cap["hosts"]}["v100-a"]
    assert not host["degraded"] and host["free_gpus"] == 8 and host["gpu_faults"] == []
    rec = repo.get("v100-a")
    assert rec is not None and rec.cleared_faults == ("f1",)
    hot = GpuFault(fault_id="t1", kind=GpuFaultKind.THERMAL_SLOWDOWN, value=91, at=datetime.now(UTC))
    repo.set_gpu_warnings("v100-a", {"GPU-v100-a-1": hot})
    rec = repo.get("v100-a")
    assert rec is not None and rec.gpu_warnings == {"GPU-v100-a-1": hot} and not rec.degraded
    repo.set_gpu_warnings("v100-a", {})
    rec = repo.get("v100-a")
    assert rec is not None and rec.gpu_warnings == {}


def test_a_waiting_job_shows_its_queue_position_and_estimated_start(
    fleet: Invoke, spec: dict[str, Any]
) -> None:
    from berth.dal.hosts import DynamoHostRepository
    from berth.dal.queue_summaries import DynamoQueueSummaries
    from berth.domain.queue_summary import summarize

    hosts = DynamoHostRepository(TABLES["BERTH_HOSTS_TABLE"])
    for h in ("v100-a", "v100-b"):
        rec = hosts.get(h)
        assert rec is not None
        hosts.hold(h, f"j-other-{h}#1", rec.free_gpu_ids, 1, 1)
    body = {**spec, "constraints": {"placement": "onprem"}}
    first, second = (fleet("POST", "/v1/jobs", body=body)[1] for _ in range(2))
    # explain runs the core now: the second waits behind the first
    ex = fleet("GET", f"/v1/jobs/{second['id']}/explain")[1]["explanation"]
    assert ex["queue_position"] == 2
    # before any pass has written the team's summary, the fields are there and empty
    got = fleet("GET", f"/v1/jobs/{first['id']}")[1]
    assert got["queue_position"] is None and got["estimated_start"] is None
    # the pass's summary (berth.logic.scheduler_service.write_queue_summaries) is what GET shows
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    rows = [(first["id"], 1, now.timestamp() + 600, "onprem"), (second["id"], 2, None, None)]
    DynamoQueueSummaries(TABLES["BERTH_TENANTS_TABLE"]).put(summarize("vision", rows, 0, now))
    got = fleet("GET", f"/v1/jobs/{first['id']}")[1]
    assert got["queue_position"] == 1 and got["queue_length"] == 2
    assert got["estimated_start"] == "2026-12-01T12:10:00.000Z" and got["estimated_start_basis"] == "onprem"
    assert got["queue_as_of"] == "2026-12-01T12:00:00.000Z"
    listed = {j["id"]: j for j in fleet("GET", "/v1/jobs", query={"status": "QUEUED"})[1]["jobs"]}
    assert listed[second["id"]]["queue_position"] == 2 and listed[second["id"]]["estimated_start"] is None
    # a canceled job has no place, and another team sees neither job
    fleet("POST", f"/v1/jobs/{first['id']}/cancel")
    assert fleet("GET", f"/v1/jobs/{first['id']}")[1]["queue_position"] is None
    assert fleet("GET", f"/v1/jobs/{second['id']}", user="bob")[0] == 404


def test_a_teams_queue_is_answered_in_the_passs_order_whatever_its_depth(
    fleet: Invoke, spec: dict[str, Any]
) -> None:
    from berth.dal.queue_summaries import DynamoQueueSummaries
    from berth.domain.queue_summary import summarize

    # no pass has ranked the team's queue yet: an empty answer, not an error
    status, empty = fleet("GET", "/v1/tenants/vision/queue")
    assert status == 200 and empty == {"tenant": "vision", "as_of": None, "waiting": 0, "jobs": []}
    body = {**spec, "constraints": {"placement": "onprem"}}
    a, b, c = (fleet("POST", "/v1/jobs", body=body)[1] for _ in range(3))
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    # the pass serves c first, then a, then b; 250 more wait behind its read budget
    rows = [(c["id"], 1, now.timestamp() + 60, "onprem"), (a["id"], 2, None, None), (b["id"], 3, None, None)]
    DynamoQueueSummaries(TABLES["BERTH_TENANTS_TABLE"]).put(summarize("vision", rows, 250, now))
    status, q = fleet("GET", "/v1/tenants/vision/queue")
    assert status == 200, q
    assert q["as_of"] == "2026-12-01T12:00:00.000Z" and q["waiting"] == 253
    assert [j["id"] for j in q["jobs"]] == [c["id"], a["id"], b["id"]]
    assert [j["queue_position"] for j in q["jobs"]] == [1, 2, 3]
    assert q["jobs"][0]["estimated_start"] == "2026-12-01T12:01:00.000Z" and q["jobs"][0]["spec"]["name"]
    assert [j["id"] for j in fleet("GET", "/v1/tenants/vision/queue", query={"limit": "2"})[1]["jobs"]] == [
        c["id"],
        a["id"],
    ]
    # a job that left the queue since that pass is left out (positions then skip)
    fleet("POST", f"/v1/jobs/{a['id']}/cancel")
    q = fleet("GET", "/v1/tenants/vision/queue")[1]
    assert [(j["id"], j["queue_position"]) for j in q["jobs"]] == [(c["id"], 1), (b["id"], 3)]
    # another team's member may not read it; an admin may; an unknown team is 404; bad input is 422
    status, err = fleet("GET", "/v1/tenants/vision/queue", user="bob")
    assert status == 403 and err["error"]["code"] == "Forbidden"
    assert fleet("GET", "/v1/tenants/vision/queue", user="admin")[1]["waiting"] == 253
    # GET /v1/queue is the caller's own team's
    assert fleet("GET", "/v1/queue")[1] == fleet("GET", "/v1/tenants/vision/queue")[1]
    assert fleet("GET", "/v1/queue", user="bob")[1]["tenant"] == "nlp"
    assert fleet("GET", "/v1/tenants/nosuchteam/queue", user="admin")[0] == 404
    assert fleet("GET", "/v1/tenants/vision/queue", query={"limit": "0"})[0] == 422
    assert fleet("GET", "/v1/tenants/vision/queue", query={"limit": "101"})[0] == 422
