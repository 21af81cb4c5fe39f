"""The meter on a whole local cloud: API Gateway requests, Lambda GB-seconds and logs, read over HTTP."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from berth_tools.localcloud import metering
from berth_tools.localcloud.cloud import LocalCloud

from .helpers import call, sign


def _report(cloud: LocalCloud, reset: bool = False) -> dict[str, Any]:
    path = metering.METER_RESET_PATH if reset else metering.METER_PATH
    request = urllib.request.Request(cloud.endpoint_url + path, data=b"" if reset else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def test_api_requests_and_lambda_duration_are_metered(cloud: LocalCloud) -> None:
    _report(cloud, reset=True)
    user = cloud.profiles["alice"]
    url = f"{cloud.api_url}/v1/jobs/j-1?sleep=0.2"
    status, _, body = call("GET", url, sign("GET", url, user.access_key_id, user.secret_access_key))
    assert status == 200, body
    unsigned, _, _ = call("GET", f"{cloud.api_url}/v1/jobs/j-1", {})
    assert unsigned == 403  # refused before the integration: not a billed request

    report = _report(cloud)
    meter = report["meter"]
    assert meter["apigateway"]["requests"] == 1
    function = cloud.output("ApiFunctionName")
    entry = meter["lambda"]["functions"][function]
    assert entry["invocations"] == 1
    assert entry["memory_mb"] == 512  # the template's MemorySize
    assert 200 <= entry["billed_ms"] < 2000  # the handler slept 0.2 s
    assert entry["gb_seconds"] == entry["billed_ms"] / 1000 * 0.5
    # the front door's Invoke call is a Lambda API request; the invocation is billed from the runtime
    assert meter["requests"]["lambda"]["Invoke"] == 1
    assert meter["logs"]["ingested_bytes"] > 0  # START/END/REPORT and the handler's line
    usd = report["bill"]["per_service_usd"]
    assert usd["apigateway"] == 3.5e-6
    assert usd["lambda"] > 0 and report["bill"]["total_usd"] > usd["apigateway"]
