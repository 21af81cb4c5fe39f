"""Two Powertools resolvers answering at once in one process each see their own request."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from berth_tools.localcloud import powertools_isolation


def _event(path: str, header: str) -> dict[str, Any]:
    return {
        "resource": path,
        "path": path,
        "httpMethod": "GET",
        "headers": {"X-Probe": header},
        "multiValueHeaders": {"X-Probe": [header]},
        "queryStringParameters": None,
        "requestContext": {"resourcePath": path, "httpMethod": "GET", "stage": "api"},
        "body": None,
        "isBase64Encoded": False,
    }


def _apps(barrier: threading.Barrier) -> tuple[APIGatewayRestResolver, APIGatewayRestResolver]:
    api, agent_api = APIGatewayRestResolver(), APIGatewayRestResolver()

    @api.get("/jobs")
    def jobs() -> dict[str, Any]:
        barrier.wait(timeout=5)  # the other resolver has set its event by now
        return {"probe": api.current_event.headers.get("X-Probe")}

    @agent_api.get("/heartbeat")
    def heartbeat() -> dict[str, Any]:
        barrier.wait(timeout=5)
        return {"probe": agent_api.current_event.headers.get("X-Probe")}

    return api, agent_api


def _race() -> dict[str, str]:
    barrier = threading.Barrier(2)
    api, agent_api = _apps(barrier)
    seen: dict[str, str] = {}

    def call(app: APIGatewayRestResolver, path: str, header: str) -> None:
        # As the in-process Lambda runtime runs each invocation: in a copy of the context.
        out = contextvars.copy_context().run(app.resolve, _event(path, header), None)
        seen[header] = out["body"]

    threads = [
        threading.Thread(target=call, args=(api, "/jobs", "submit")),
        threading.Thread(target=call, args=(agent_api, "/heartbeat", "heartbeat")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def test_concurrent_resolvers_keep_their_own_event() -> None:
    powertools_isolation.install()
    powertools_isolation.install()  # idempotent
    for _ in range(5):
        seen = _race()
        assert '"probe":"submit"' in seen["submit"].replace(" ", ""), seen
        assert '"probe":"heartbeat"' in seen["heartbeat"].replace(" ", ""), seen


def test_outside_an_invocation_the_resolver_behaves_as_before() -> None:
    powertools_isolation.install()
    app = APIGatewayRestResolver()

    @app.get("/x")
    def x() -> dict[str, Any]:
        return {"probe": app.current_event.headers.get("X-Probe")}

    out = app.resolve(_event("/x", "plain"), None)
    assert out["statusCode"] == 200 and "plain" in out["body"]
