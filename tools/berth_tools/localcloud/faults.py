"""Faults injected into the local cloud on demand: region outages, missing capacity, spot reclaims.

State lives in the local cloud's process (`FAULTS`, process-global like moto's backends) and is changed
through `POST /_berth/fault` on the front door (127.0.0.1 only, like `/_berth/meter`), which
`berth local fault` sends:

- `{"kind": "region-outage", "region": R}`: every Batch and EC2 API call signed for R answers HTTP
  503 `ServiceUnavailable` (both ways into moto: the server and the in-process transport);
- `{"kind": "capacity", "region": R, "instance_type": T}`: jobs of a `berth-*` queue in R whose
  compute environment would use T stay RUNNABLE (never start); after `CAPACITY_REASON_AFTER_S`
  their statusReason says why;
- `{"kind": "spot-interrupt", "job_id": J}`: the running Batch job named `J-a<n>` (the latest
  attempt) is killed and fails with statusReason `Host EC2 (instance i-0123456789abcdef0) terminated.`;
- `{"kind": "control-plane-outage"}`: every request to Berth's API (the tenants' and the agents'
  routes) answers HTTP 503, as API Gateway does when its integration is down, until `clear`;
- `{"kind": "clear"}`: no more outages or capacity faults (RUNNABLE jobs start).

`GET /_berth/fault` answers the current faults. Bad input answers 400 with a message, an unknown job 404.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from berth_tools.localcloud.metering import LOCAL_ADDRESSES, Answer, ObservedRequest

FAULT_PATH = "/_berth/fault"
KINDS = ("region-outage", "capacity", "spot-interrupt", "control-plane-outage", "clear")
#: The APIs a region outage takes down.
OUTAGE_SERVICES = frozenset({"batch", "ec2"})
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_INSTANCE_TYPE = re.compile(r"^[a-z0-9-]+(\.[a-z0-9-]+)?$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


class FaultError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def instance_type_matches(configured: str, faulted: str) -> bool:
    """Whether a compute environment's instance type entry (`g5.xlarge`, a family `g5`, or `optimal`)
    could launch `faulted` (`g5.xlarge`, or a whole family `g5`)."""
    if configured == faulted:
        return True
    family_of = configured.split(".", 1)[0]
    if "." not in configured:  # a family: any size of it
        return faulted.split(".", 1)[0] == configured
    return "." not in faulted and family_of == faulted


class FaultState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outages: set[str] = set()
        self._capacity: set[tuple[str, str]] = set()
        self._control_plane_down = False
        #: Set by the local Batch runner: kills a Berth job's running Batch job; False when none runs.
        self.spot_interrupt_handler: Callable[[str], str | None] | None = None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "region_outages": sorted(self._outages),
                "capacity": [{"region": r, "instance_type": t} for r, t in sorted(self._capacity)],
                "control_plane_outage": self._control_plane_down,
            }

    def clear(self) -> None:
        with self._lock:
            self._outages.clear()
            self._capacity.clear()
            self._control_plane_down = False

    def control_plane_down(self) -> bool:
        with self._lock:
            return self._control_plane_down

    def region_down(self, region: str) -> bool:
        with self._lock:
            return region in self._outages

    def capacity_blocked(self, region: str, instance_types: Iterable[str]) -> str | None:
        """The faulted instance type that keeps a compute environment of `region` with these
        `instance_types` from starting anything (all of its types faulted), else None."""
        types = list(instance_types)
        with self._lock:
            faulted = [t for r, t in self._capacity if r == region]
        if not faulted or not types:
            return None
        hits = [next((f for f in faulted if instance_type_matches(c, f)), None) for c in types]
        if all(hit is not None for hit in hits):
            return hits[0]
        return None

    def apply(self, body: Any) -> dict[str, Any]:
        """Apply one fault request (the JSON body of `POST /_berth/fault`); raises FaultError."""
        if not isinstance(body, dict):
            raise FaultError(400, "the body must be a JSON object with a 'kind'")
        kind = body.get("kind")
        if kind not in KINDS:
            raise FaultError(400, f"kind must be one of {', '.join(KINDS)}")
        result: dict[str, Any] = {"kind": kind}
        if kind == "clear":
            self.clear()
        elif kind == "region-outage":
            region = _field(body, "region", _REGION)
            with self._lock:
                self._outages.add(region)
        elif kind == "control-plane-outage":
            with self._lock:
                self._control_plane_down = True
        elif kind == "capacity":
            region = _field(body, "region", _REGION)
            instance_type = _field(body, "instance_type", _INSTANCE_TYPE)
            with self._lock:
                self._capacity.add((region, instance_type))
        else:
            job_id = _field(body, "job_id", _JOB_ID)
            handler = self.spot_interrupt_handler
            batch_job = handler(job_id) if handler is not None else None
            if batch_job is None:
                raise FaultError(404, f"no running Batch job of Berth job {job_id} on a berth-* queue")
            result["batch_job_id"] = batch_job
        result["faults"] = self.snapshot()
        return result


def _field(body: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not pattern.match(value):
        raise FaultError(400, f"{name} is missing or malformed")
    return value


#: The faults of this process (the local cloud is process-global).
FAULTS = FaultState()


def handle_http(method: str, remote_addr: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
    """`GET|POST /_berth/fault`: (status, JSON body)."""
    if (remote_addr or "127.0.0.1") not in LOCAL_ADDRESSES:
        return 403, {"message": "the fault endpoint answers 127.0.0.1 only"}
    if method == "GET":
        return 200, {"faults": FAULTS.snapshot()}
    if method != "POST":
        return 405, {"message": f"{method} is not allowed; use GET or POST"}
    try:
        parsed = json.loads(body or b"null")
    except ValueError:
        return 400, {"message": "the body is not JSON"}
    try:
        return 200, FAULTS.apply(parsed)
    except FaultError as exc:
        return exc.status, {"message": str(exc)}


def outage_answer(request: ObservedRequest, state: FaultState | None = None) -> Answer | None:
    """A 503 `ServiceUnavailable` in the service's own error format when its region is down, else None."""
    if request.service not in OUTAGE_SERVICES or not request.region:
        return None
    if not (state or FAULTS).region_down(request.region):
        return None
    message = f"Service unavailable in {request.region} (berth local fault region-outage)"
    if request.service == "ec2":
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>ServiceUnavailable</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>berth-local-fault</RequestID></Response>"
        )
        return 503, [("Content-Type", "text/xml")], xml.encode()
    payload = json.dumps({"__type": "ServiceUnavailable", "message": message}).encode()
    return (
        503,
        [("Content-Type", "application/json"), ("x-amzn-ErrorType", "ServiceUnavailable")],
        payload,
    )
