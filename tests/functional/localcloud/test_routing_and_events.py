"""Route matching and proxy response mapping, without servers."""

from __future__ import annotations

import base64

from berth_tools.localcloud.front_door import Method, Route, RouteTable, proxy_response

M = {"GET": Method("GET", "AWS_IAM", "AWS_PROXY", None)}


def table(*paths: str) -> RouteTable:
    return RouteTable([Route(resource_id=str(i), path=p, methods=M) for i, p in enumerate(paths)])


def test_literal_beats_parameter_beats_greedy() -> None:
    routes = table("/", "/v1/jobs", "/v1/jobs/{id}", "/v1/jobs/mine", "/v1/{proxy+}", "/v1/jobs/{id}/cancel")
    assert routes.resolve("/v1/jobs/mine")[0].path == "/v1/jobs/mine"  # type: ignore[index]
    route, params = routes.resolve("/v1/jobs/j-1")  # type: ignore[misc]
    assert (route.path, params) == ("/v1/jobs/{id}", {"id": "j-1"})
    route, params = routes.resolve("/v1/jobs/j-1/cancel")  # type: ignore[misc]
    assert (route.path, params) == ("/v1/jobs/{id}/cancel", {"id": "j-1"})
    route, params = routes.resolve("/v1/a/b/c")  # type: ignore[misc]
    assert (route.path, params) == ("/v1/{proxy+}", {"proxy": "a/b/c"})
    assert routes.resolve("/")[0].path == "/"  # type: ignore[index]
    assert table("/v1/jobs").resolve("/v1/jobs/x") is None
    assert table("/v1/jobs/{id}").resolve("/v1/jobs") is None


def test_multiple_parameters() -> None:
    route, params = table("/v1/tenants/{tenant}/quota").resolve("/v1/tenants/vision/quota")  # type: ignore[misc]
    assert params == {"tenant": "vision"}
    assert route.path == "/v1/tenants/{tenant}/quota"


def test_proxy_response_mapping() -> None:
    response = proxy_response(
        {
            "statusCode": 201,
            "headers": {"Location": "/v1/jobs/1"},
            "multiValueHeaders": {"Set-Cookie": ["a=1", "b=2"]},
            "body": '{"id": "1"}',
        }
    )
    assert response is not None
    assert response.status_code == 201
    assert response.headers["Location"] == "/v1/jobs/1"
    assert response.headers.getlist("Set-Cookie") == ["a=1", "b=2"]
    assert response.headers["Content-Type"] == "application/json"
    assert response.get_data() == b'{"id": "1"}'


def test_base64_body_and_malformed_results() -> None:
    response = proxy_response(
        {"statusCode": 200, "body": base64.b64encode(b"\x00\x01").decode(), "isBase64Encoded": True}
    )
    assert response is not None and response.get_data() == b"\x00\x01"
    assert proxy_response({"body": "x"}) is None
    assert proxy_response("not a dict") is None
    assert proxy_response({"statusCode": "abc"}) is None
    assert proxy_response({"statusCode": 200, "body": {"not": "a string"}}) is None
