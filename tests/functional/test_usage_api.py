"""``GET /v1/tenants/{tenant}/usage`` on moto: the month's ledger per site, the cloud budget left,
the quota route's tenant rule, and bad input refused with a 4xx."""

from __future__ import annotations

from datetime import UTC, datetime

from berth.dal.usage import DynamoUsageLedger
from berth.domain.cost import AttemptUsage
from berth.domain.placement import Site
from tests.functional.conftest import TABLES, Invoke


def _record(
    tenant: str, month: str, job: str, site: Site, seconds: float, rate: float, gpus: int = 1
) -> None:
    where = "us-east-1" if site is Site.CLOUD else "default"
    usage = AttemptUsage(tenant, month, job, 1, site, where, gpus, seconds, rate, final=True)
    DynamoUsageLedger(TABLES["BERTH_USAGE_TABLE"]).record(usage)


def test_a_members_month_per_site_with_the_budget_left(api: Invoke) -> None:
    month = datetime.now(UTC).strftime("%Y-%m")
    _record("vision", month, "j-a", Site.ONPREM, 7200, 2.0, gpus=2)
    _record("vision", month, "j-b", Site.CLOUD, 3600, 32.77, gpus=8)
    _record("vision", "2020-01", "j-c", Site.CLOUD, 3600, 1.0)
    _record("nlp", month, "j-d", Site.CLOUD, 3600, 5.0)
    api("PUT", "/v1/tenants/vision/quota", user="admin", body={"monthly_cloud_budget_usd": 100.0})

    status, body = api("GET", "/v1/tenants/vision/usage")
    assert status == 200, body
    assert body == {
        "tenant": "vision",
        "month": month,
        "sites": [
            {"site": "onprem", "gpu_hours": 4.0, "cost_usd": 4.0},
            {"site": "cloud", "gpu_hours": 8.0, "cost_usd": 32.77},
        ],
        "attempts": 2,
        "total_gpu_hours": 12.0,
        "total_cost_usd": 36.77,
        "cloud_cost_usd": 32.77,
        "monthly_budget_usd": 100.0,
        "budget_left_usd": 67.23,
    }
    status, old = api("GET", "/v1/tenants/vision/usage", query={"month": "2020-01"})
    assert status == 200 and old["total_cost_usd"] == 1.0 and old["sites"][0]["site"] == "cloud"
    status, empty = api("GET", "/v1/tenants/vision/usage", query={"month": "2019-07"})
    assert status == 200 and empty["sites"] == [] and empty["total_cost_usd"] == 0.0


def test_members_read_their_own_tenant_admins_any(api: Invoke) -> None:
    status, body = api("GET", "/v1/tenants/nlp/usage")
    assert status == 403 and body["error"]["code"] == "Forbidden"
    status, body = api("GET", "/v1/tenants/nlp/usage", user="admin")
    assert status == 200 and body["tenant"] == "nlp" and body["monthly_budget_usd"] is None
    assert body["budget_left_usd"] is None
    assert api("GET", "/v1/tenants/ghost/usage", user="admin")[0] == 404


def test_bad_months_are_refused(api: Invoke) -> None:
    for month in ("2026-13", "26-01", "2026-1", "yesterday", "2026-01-01"):
        status, body = api("GET", "/v1/tenants/vision/usage", query={"month": month})
        assert status in (400, 422) and "error" in body, month


def test_own_usage_route_answers_the_callers_tenant(api: Invoke) -> None:
    month = datetime.now(UTC).strftime("%Y-%m")
    _record("nlp", month, "j-n", Site.ONPREM, 3600, 3.0, gpus=3)
    status, body = api("GET", "/v1/usage", user="bob")
    assert status == 200 and body["tenant"] == "nlp" and body["total_cost_usd"] == 3.0
    status, mine = api("GET", "/v1/usage")
    assert status == 200 and mine["tenant"] == "vision" and mine["sites"] == []
