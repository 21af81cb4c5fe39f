"""The fault schedule of `berth bench chaos`: a seeded timeline of faults for the local cloud.

Two streams, both from one `random.Random(seed)`:

- **Windows**: faults that last (a control-plane outage, a host's partition, DynamoDB throttling, SQS
  duplicates, a region outage), one at a time, back to back with a short gap. Each ends with its own
  undo (`heal HOST` for a partition, `clear` for the rest), so two never overlap and an undo never
  cuts another short. The kinds come round in a shuffled cycle, so every kind is drawn before any is
  drawn twice. A partition lasts longer than the host lease (the point of it), sometimes longer than
  lease + outage tolerance too (the agent must then stop its jobs before they are placed again).
- **Shots**: instant faults at exponential intervals during the whole run: an agent SIGKILLed (and
  restarted, as systemd would), a scheduler or workflow Lambda sandbox killed mid-invocation, a
  running cloud job's spot instance reclaimed.

The plan is data (`FaultEvent`s); `chaos_bench` sends each to `POST /_berth/fault` at its time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

WINDOW_KINDS = ("control-plane-outage", "partition", "ddb-throttle", "sqs-duplicate", "region-outage")
SHOT_KINDS = ("agent-kill", "lambda-kill", "spot-interrupt")
ALL_KINDS = WINDOW_KINDS + SHOT_KINDS
#: Functions whose sandboxes `lambda-kill` picks from (substrings of the deployed functions' names).
KILLED_FUNCTIONS = ("Scheduler", "Workflow")


@dataclass(frozen=True)
class Timings:
    """The local cloud's (docs/workflow.md): what the windows are sized against."""

    lease_s: float = 20.0
    outage_tolerance_s: float = 20.0


@dataclass(frozen=True)
class FaultEvent:
    at_s: float
    kind: str
    #: The body's other fields (`host_id`, `region`, `fraction`, `function`); a `spot-interrupt` is
    #: given its job when it fires (a cloud job running then), so it has none here.
    args: dict[str, Any] = field(default_factory=dict)
    #: How long a window lasts (0 for a shot).
    duration_s: float = 0.0

    def body(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.args}

    def undo(self) -> dict[str, Any] | None:
        """The request that ends this window (None for a shot)."""
        if not self.duration_s:
            return None
        if self.kind == "partition":
            return {"kind": "heal", "host_id": self.args["host_id"]}
        return {"kind": "clear"}


def _window(
    rng: random.Random, kind: str, at_s: float, hosts: list[str], regions: list[str], t: Timings
) -> FaultEvent:
    if kind == "partition":
        # past the lease always; past lease + tolerance one time in three
        beyond = rng.random() < 1 / 3
        low = t.lease_s + t.outage_tolerance_s + 5 if beyond else t.lease_s + 3
        high = low + (15 if beyond else t.outage_tolerance_s - 6)
        return FaultEvent(at_s, kind, {"host_id": rng.choice(hosts)}, round(rng.uniform(low, high), 1))
    if kind == "control-plane-outage":
        return FaultEvent(at_s, kind, {}, round(rng.uniform(8, t.lease_s + t.outage_tolerance_s - 10), 1))
    if kind == "region-outage":
        return FaultEvent(at_s, kind, {"region": rng.choice(regions)}, round(rng.uniform(15, 40), 1))
    fraction = round(rng.uniform(0.05, 0.3), 2)
    return FaultEvent(
        at_s, kind, {"fraction": fraction, "seed": rng.randrange(2**31)}, round(rng.uniform(10, 25), 1)
    )


def _shot(rng: random.Random, kind: str, at_s: float, hosts: list[str]) -> FaultEvent:
    if kind == "agent-kill":
        return FaultEvent(at_s, kind, {"host_id": rng.choice(hosts)})
    if kind == "lambda-kill":
        return FaultEvent(at_s, kind, {"function": rng.choice(KILLED_FUNCTIONS)})
    return FaultEvent(at_s, kind)


def plan(
    seed: int,
    minutes: float,
    hosts: list[str],
    regions: list[str],
    *,
    timings: Timings | None = None,
    kinds: tuple[str, ...] = ALL_KINDS,
    shot_every_s: float = 25.0,
    gap_s: tuple[float, float] = (3.0, 8.0),
) -> list[FaultEvent]:
    """Every fault of a run of ``minutes``, in time order. Deterministic in ``seed``."""
    if not hosts:
        raise ValueError("a chaos plan needs at least one host")
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    rng = random.Random(seed)
    t = timings or Timings()
    end_s = minutes * 60
    events: list[FaultEvent] = []
    window_kinds = [k for k in WINDOW_KINDS if k in kinds]
    cycle: list[str] = []
    at = rng.uniform(*gap_s)
    while window_kinds:
        if not cycle:
            cycle = rng.sample(window_kinds, len(window_kinds))
        event = _window(rng, cycle.pop(), round(at, 1), hosts, regions, t)
        if event.at_s + event.duration_s > end_s:
            break
        events.append(event)
        at = event.at_s + event.duration_s + rng.uniform(*gap_s)
    shot_kinds = [k for k in SHOT_KINDS if k in kinds]
    shots: list[str] = []
    at = rng.expovariate(1 / shot_every_s)
    while shot_kinds and at < end_s:
        if not shots:
            shots = rng.sample(shot_kinds, len(shot_kinds))
        events.append(_shot(rng, shots.pop(), round(at, 1), hosts))
        at += rng.expovariate(1 / shot_every_s)
    return sorted(events, key=lambda e: e.at_s)
