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
- `{"kind": "partition", "host_id": H}`: every request to Berth's API signed by host H's identity
  (IAM user `host-<H>`) answers HTTP 503, as if H could not reach the API, until `heal` or `clear`
  (H's own AWS calls to S3, SQS and CloudWatch Logs still work);
- `{"kind": "heal", "host_id": H}`: ends the partition of H;
- `{"kind": "ddb-throttle", "fraction": F, "seed": S}` (0 < F <= 1, seed optional): that fraction of
  DynamoDB API calls (drawn from a seeded random generator) answer HTTP 400
  `ProvisionedThroughputExceededException`, on both ways into moto, until `clear`;
- `{"kind": "sqs-duplicate", "fraction": F, "seed": S}`: that fraction of the messages a
  ReceiveMessage returns (standard queues) are made visible again at once, so a later receive
  delivers them again with a new receipt handle (SQS's at-least-once delivery; see `moto_sqs`);
- `{"kind": "agent-kill", "host_id": H}`: the real agent process of host H (`--agent-kind process`)
  gets SIGKILL and is started again `AGENT_RESTART_S` later by the
  local cloud's agent supervisor, as systemd's `Restart=on-failure` would
  (answers the killed pid);
- `{"kind": "lambda-kill", "function": NAME}`: one sandbox worker process of a deployed Lambda function
  whose name contains NAME (`lambda_runtime.functions_named`: `Workflow` is the WorkflowFunction) gets
  SIGKILL, one running an event if any: that invocation ends as Lambda's does when its sandbox dies,
  `Runtime.ExitError` (answers the function's name and the pid);
- `{"kind": "gpu-error", "host_id": H, "gpu": G, "xid": N}` (G an index or UUID, default 0; N default
  79, "fallen off the bus"): the simulated GPU G of host H's real agent process reports XID N (a line
  appended to the agent's `gpu-faults.jsonl`, which its GPU health watcher polls): its agent reports
  the fault on its next heartbeat and the control plane takes the GPU out of placement and stops the
  job on it, until an admin clears it (`berth gpu-clear`); `clear` does not clear it;
- `{"kind": "clear"}`: no more outages, capacity faults, partitions, throttling or duplicates.

`GET /_berth/fault` answers the faults in force. Bad input answers 400 with a message, an unknown job,
host or function 404.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from berth_tools.localcloud.metering import LOCAL_ADDRESSES, Answer, ObservedRequest

FAULT_PATH = "/_berth/fault"
KINDS = (
    "region-outage",
    "capacity",
    "spot-interrupt",
    "control-plane-outage",
    "partition",
    "heal",
    "ddb-throttle",
    "sqs-duplicate",
    "agent-kill",
    "lambda-kill",
    "gpu-error",
    "clear",
)
#: The APIs a region outage takes down.
OUTAGE_SERVICES = frozenset({"batch", "ec2"})
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_INSTANCE_TYPE = re.compile(r"^[a-z0-9-]+(\.[a-z0-9-]+)?$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_HOST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_FUNCTION = re.compile(r"^[A-Za-z0-9_-]{1,140}$")
_GPU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,95}$")
#: The XID `gpu-error` injects unless told: "GPU has fallen off the bus" (berth.domain.gpu_health).
DEFAULT_XID = 79
#: The DynamoDB API's X-Amz-Target prefix (not DynamoDB Streams').
_DYNAMODB_TARGET = "DynamoDB_20120810."


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


@dataclass
class Fraction:
    """A fault that bites a fraction of calls, drawn from a random generator of its own (seeded)."""

    fraction: float
    seed: int | None = None
    calls: int = 0  # how many calls were drawn for
    hits: int = 0  # how many the fault bit
    _random: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def draw(self) -> bool:
        """Whether this call is faulted (the caller holds the state's lock)."""
        self.calls += 1
        hit = self._random.random() < self.fraction
        self.hits += hit
        return hit

    def as_json(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "seed": self.seed, "calls": self.calls, "hits": self.hits}


class FaultState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outages: set[str] = set()
        self._capacity: set[tuple[str, str]] = set()
        self._control_plane_down = False
        self._partitioned: set[str] = set()
        self._ddb_throttle: Fraction | None = None
        self._sqs_duplicate: Fraction | None = None
        #: Set by the local Batch runner: kills a Berth job's running Batch job; False when none runs.
        self.spot_interrupt_handler: Callable[[str], str | None] | None = None
        #: Set by the local cloud that owns the process agents: SIGKILLs host H's agent (restarted
        #: shortly after) and returns the killed pid; None when no process agent of H runs.
        self.agent_kill_handler: Callable[[str], int | None] | None = None
        #: Set by the local cloud that owns the process agents: makes GPU G (index or UUID) of host H
        #: report XID N; answers what it injected, None when no agent process of H runs (ValueError:
        #: no such GPU).
        self.gpu_error_handler: Callable[[str, str, int], dict[str, Any] | None] | None = None
        #: Set by the local cloud that owns the Lambda runtime: SIGKILLs one sandbox of a function
        #: whose name contains the given text; returns (function name, pid), None when none is alive.
        self.lambda_kill_handler: Callable[[str], tuple[str, int] | None] | None = None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "region_outages": sorted(self._outages),
                "capacity": [{"region": r, "instance_type": t} for r, t in sorted(self._capacity)],
                "control_plane_outage": self._control_plane_down,
                "partitions": sorted(self._partitioned),
                "ddb_throttle": self._ddb_throttle.as_json() if self._ddb_throttle else None,
                "sqs_duplicate": self._sqs_duplicate.as_json() if self._sqs_duplicate else None,
            }

    def clear(self) -> None:
        with self._lock:
            self._outages.clear()
            self._capacity.clear()
            self._control_plane_down = False
            self._partitioned.clear()
            self._ddb_throttle = None
            self._sqs_duplicate = None

    def partitioned(self, host_id: str) -> bool:
        with self._lock:
            return host_id in self._partitioned

    def throttle_dynamodb(self) -> bool:
        """Whether this DynamoDB call is throttled (`ddb-throttle`; draws from its generator)."""
        with self._lock:
            return self._ddb_throttle is not None and self._ddb_throttle.draw()

    def duplicate_sqs_delivery(self) -> bool:
        """Whether this received SQS message is delivered again (`sqs-duplicate`; draws)."""
        with self._lock:
            return self._sqs_duplicate is not None and self._sqs_duplicate.draw()

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
        elif kind in ("partition", "heal"):
            host_id = _field(body, "host_id", _HOST_ID)
            with self._lock:
                if kind == "partition":
                    self._partitioned.add(host_id)
                else:
                    self._partitioned.discard(host_id)
            result["host_id"] = host_id
        elif kind in ("ddb-throttle", "sqs-duplicate"):
            fault = Fraction(_fraction(body), _seed(body))
            with self._lock:
                if kind == "ddb-throttle":
                    self._ddb_throttle = fault
                else:
                    self._sqs_duplicate = fault
            result.update(fraction=fault.fraction, seed=fault.seed)
        elif kind == "agent-kill":
            host_id = _field(body, "host_id", _HOST_ID)
            kill_agent = self.agent_kill_handler
            pid = kill_agent(host_id) if kill_agent is not None else None
            if pid is None:
                raise FaultError(404, f"no running process agent of host {host_id} (--agent-kind process)")
            result.update(host_id=host_id, killed_pid=pid)
        elif kind == "gpu-error":
            result.update(self._gpu_error(body))
        elif kind == "lambda-kill":
            name = _field(body, "function", _FUNCTION)
            kill_sandbox = self.lambda_kill_handler
            killed = kill_sandbox(name) if kill_sandbox is not None else None
            if killed is None:
                raise FaultError(404, f"no live sandbox of a Lambda function whose name contains {name!r}")
            result.update(function=killed[0], pid=killed[1])
        else:
            job_id = _field(body, "job_id", _JOB_ID)
            handler = self.spot_interrupt_handler
            batch_job = handler(job_id) if handler is not None else None
            if batch_job is None:
                raise FaultError(404, f"no running Batch job of Berth job {job_id} on a berth-* queue")
            result["batch_job_id"] = batch_job
        result["faults"] = self.snapshot()
        return result

    def _gpu_error(self, body: dict[str, Any]) -> dict[str, Any]:
        host_id, gpu, xid = _gpu_error_args(body)
        inject = self.gpu_error_handler
        try:
            injected = inject(host_id, gpu, xid) if inject is not None else None
        except ValueError as exc:
            raise FaultError(404, str(exc)) from None
        if injected is None:
            raise FaultError(404, f"no running process agent of host {host_id} (--agent-kind process)")
        return injected


def _gpu_error_args(body: dict[str, Any]) -> tuple[str, str, int]:
    host_id = _field(body, "host_id", _HOST_ID)
    gpu = str(body.get("gpu", "0"))
    if not _GPU.match(gpu):
        raise FaultError(400, "'gpu' must be a GPU index or UUID")
    xid = body.get("xid", DEFAULT_XID)
    if not isinstance(xid, int) or isinstance(xid, bool) or not 0 < xid < 100_000:
        raise FaultError(400, "'xid' must be a positive integer")
    return host_id, gpu, xid


def _field(body: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not pattern.match(value):
        raise FaultError(400, f"{name} is missing or malformed")
    return value


def _fraction(body: dict[str, Any]) -> float:
    value = body.get("fraction")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise FaultError(400, "fraction must be a number, 0 < fraction <= 1")
    return float(value)


def _seed(body: dict[str, Any]) -> int | None:
    value = body.get("seed")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise FaultError(400, "seed must be an integer")
    return value


def host_of(principal_arn: str) -> str | None:
    """The host id of an on-prem host's identity (IAM user `host-<id>`), else None."""
    if ":user/" not in principal_arn:
        return None
    name = principal_arn.rsplit("/", 1)[-1]
    return name[len("host-") :] if name.startswith("host-") and len(name) > len("host-") else None


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


def fault_answer(request: ObservedRequest, state: FaultState | None = None) -> Answer | None:
    """What a faulted AWS API call answers instead of moto (a region outage, DynamoDB throttling),
    else None. Both ways into moto ask it: the server's middleware and the in-process transport."""
    return outage_answer(request, state) or throttle_answer(request, state)


def throttle_answer(request: ObservedRequest, state: FaultState | None = None) -> Answer | None:
    """DynamoDB's HTTP 400 `ProvisionedThroughputExceededException` for a throttled DynamoDB call."""
    if request.service != "dynamodb" or not request.headers.get("x-amz-target", "").startswith(
        _DYNAMODB_TARGET
    ):
        return None
    if not (state or FAULTS).throttle_dynamodb():
        return None
    error = "ProvisionedThroughputExceededException"
    payload = json.dumps(
        {
            "__type": f"com.amazonaws.dynamodb.v20120810#{error}",
            "message": "The level of configured provisioned throughput for the table was exceeded. "
            "Consider increasing your provisioning level with the UpdateTable API. "
            "(berth local fault ddb-throttle)",
        }
    ).encode()
    return 400, [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-ErrorType", error)], payload


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
