"""The console's Fleet page shows a host's faulted GPUs as ``berth capacity`` does (issue 23 item 3):
its health ``degraded (GPU fault)``, which GPU (index and UUID), the fault (XID and its meaning),
fatal before warnings, and the faulted count in the totals. ``fleetPageData`` (``pages.js``) is the
page's data, computed here by node from the very ``GET /v1/capacity`` document the service builds."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from typing import Any

import pytest

from berth.domain.gpu_health import GpuFaultKind, GpuFaultReport
from berth.logic.fleet import FleetService
from tests.unit.test_gpu_faults import ADMIN, _beat, _xid
from tests.unit.test_workflow_services import World

#: Loads pages.js as the browser would after app.js (the globals it touches at load time stubbed) and
#: prints ``fleetPageData`` of the capacity document on stdin.
RUNNER = """
const vm = require("vm");
globalThis.Berth = { pages: {} };
globalThis.MutationObserver = class { observe() {} };
globalThis.document = { documentElement: {} };
vm.runInThisContext(require("fs").readFileSync(process.argv[1], "utf8"));
const cap = JSON.parse(require("fs").readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(fleetPageData(cap)));
"""


def _page_data(cap: dict[str, Any]) -> Any:
    node = shutil.which("node")
    if node is None:
        pytest.fail("the console's page-data test needs node (the CDK app needs it too: `make install`)")
    pages = resources.files("berth_tools.console") / "static" / "pages.js"
    out = subprocess.run(
        [node, "-e", RUNNER, str(pages)],
        input=json.dumps(cap, default=str),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_fleet_page_shows_a_degraded_host_and_its_faulted_gpu() -> None:
    w = World(hosts=2, gpus=2)
    warm = GpuFaultReport(fault_id="w1", gpu_id="GPU-h0-0", kind=GpuFaultKind.THERMAL_SLOWDOWN, value=88)
    _beat(w, "h0", _xid("GPU-h0-1"), warm)
    cap = FleetService(w.source).capacity(ADMIN)
    data = _page_data(cap)
    assert data["health"] == {"h0": "degraded (GPU fault)", "h1": "healthy"}
    assert data["summary"].endswith(", 1 faulted")
    fatal, warning = data["faults"]
    assert fatal["host"] == "h0" and fatal["gpu"] == "1 (GPU-h0-1)"
    assert fatal["severity"] == "fatal: out of placement" and "XID 79" in fatal["fault"]
    assert fatal["since"] == cap["hosts"][0]["gpu_faults"][0]["at"]
    assert warning["gpu"] == "0 (GPU-h0-0)" and warning["severity"] == "warning"


def test_a_healthy_fleet_has_no_fault_rows_and_a_lost_host_says_so() -> None:
    w = World(hosts=1, gpus=2)
    cap = FleetService(w.source).capacity(ADMIN)
    data = _page_data(cap)
    assert data["faults"] == [] and data["health"] == {"h0": "healthy"}
    assert "faulted" not in data["summary"]
    lost = {**cap, "hosts": [{**cap["hosts"][0], "alive": False, "degraded": True}]}
    assert _page_data(lost)["health"] == {"h0": "lease lost"}  # worst first, as `berth capacity`
