"""``GET /v1/jobs`` filters: since, name, site, all_tenants (admins); bad values are 4xx."""

from __future__ import annotations

from typing import Any

from tests.functional.conftest import Invoke


def _ids(page: dict[str, Any]) -> list[str]:
    return [j["id"] for j in page["jobs"]]


def test_name_filters_by_substring_or_glob(api: Invoke, spec: dict[str, Any]) -> None:
    a = api("POST", "/v1/jobs", body={**spec, "name": "resnet-a"})[1]["id"]
    b = api("POST", "/v1/jobs", body={**spec, "name": "bert-b"})[1]["id"]
    c = api("POST", "/v1/jobs", body={**spec, "name": "resnet-c"})[1]["id"]
    status, page = api("GET", "/v1/jobs", query={"name": "resnet"})
    assert status == 200 and _ids(page) == [c, a]
    _, page = api("GET", "/v1/jobs", query={"name": "*-b"})
    assert _ids(page) == [b]
    _, page = api("GET", "/v1/jobs", query={"name": "res*"})
    assert _ids(page) == [c, a]
    _, page = api("GET", "/v1/jobs", query={"name": "net"})  # a substring, not a glob over the whole name
    assert _ids(page) == [c, a]


def test_a_filtered_page_may_be_short_and_the_token_reaches_the_rest(
    api: Invoke, spec: dict[str, Any]
) -> None:
    wanted = [api("POST", "/v1/jobs", body={**spec, "name": f"x-{i}"})[1]["id"] for i in range(2)]
    for i in range(3):
        api("POST", "/v1/jobs", body={**spec, "name": f"other-{i}"})
    seen: list[str] = []
    token = None
    for _ in range(10):
        _, page = api(
            "GET", "/v1/jobs", query={"name": "x-*", "limit": "2", **({"next_token": token} if token else {})}
        )
        assert len(page["jobs"]) <= 2
        seen += _ids(page)
        token = page["next_token"]
        if not token:
            break
    assert seen == wanted[::-1]


def test_since_takes_iso_or_epoch_ms(api: Invoke, spec: dict[str, Any]) -> None:
    first = api("POST", "/v1/jobs", body={**spec, "name": "early"})[1]
    second = api("POST", "/v1/jobs", body={**spec, "name": "late"})[1]
    _, page = api("GET", "/v1/jobs", query={"since": second["created_at"]})
    assert second["id"] in _ids(page)
    assert first["id"] not in _ids(page) or first["created_at"] == second["created_at"]
    _, page = api("GET", "/v1/jobs", query={"since": "2099-01-01T00:00:00Z"})
    assert page["jobs"] == []
    _, page = api("GET", "/v1/jobs", query={"since": "0"})
    assert set(_ids(page)) == {first["id"], second["id"]}


def test_all_tenants_is_for_admins(api: Invoke, spec: dict[str, Any]) -> None:
    mine = api("POST", "/v1/jobs", body=spec)[1]["id"]
    theirs = api("POST", "/v1/jobs", body=spec, user="bob")[1]["id"]
    status, page = api("GET", "/v1/jobs", user="admin", query={"all_tenants": "true"})
    assert status == 200 and _ids(page) == [theirs, mine]
    assert {j["tenant"] for j in page["jobs"]} == {"vision", "nlp"}
    status, body = api("GET", "/v1/jobs", query={"all_tenants": "true"})
    assert status == 403 and body["error"]["code"] == "Forbidden"
    status, body = api("GET", "/v1/jobs", user="admin", query={"all_tenants": "true", "tenant": "nlp"})
    assert status == 400
    status, page = api("GET", "/v1/jobs", user="admin", query={"all_tenants": "true", "name": "nothing-like"})
    assert status == 200 and page["jobs"] == []


def test_bad_filter_values_are_4xx(api: Invoke) -> None:
    for query, expected in [
        ({"since": "yesterday"}, 400),
        ({"since": "2026-12-01T10:00:00"}, 400),  # no zone
        ({"site": "moon"}, 422),
        ({"name": "Bad Name!"}, 422),
        ({"name": "x" * 65}, 422),
        ({"all_tenants": "perhaps"}, 422),
        ({"array": "j-01m8mqx5p4cmnjzq2zgpbtrdbm", "name": "x"}, 400),
    ]:
        status, body = api("GET", "/v1/jobs", query=query)
        assert status == expected, (query, body)
        assert body["error"]["message"], query
