"""`berth bench chaos`: a mixed workload on a fresh `berth local up` while faults are injected.

It starts the local cloud (real agent processes on simulated GPUs, the local Batch), then for
``minutes``:

- submits jobs at a steady rate, as two tenants in turn: on-prem jobs and a share of cloud jobs, each
  running `chaos_audit.JOB_SCRIPT` for a few seconds, a share of them leaving a detached grandchild
  behind; a submit that fails (an outage, throttling) is sent again with the same idempotency key;
- sends the seeded fault plan (`chaos_plan`) to the local cloud's fault endpoint at its times.

Then it clears every fault, waits for every accepted job to end, lets the agents settle, and
counts from the jobs' own records (`chaos_audit`): jobs submitted, completed, failed (by reason),
lost (accepted and never ended, or unknown), run twice at once, GPUs double-booked, orphan processes
left, and each tenant's `active_jobs` counter against the truth (its jobs not yet ended). The
machine's load average is printed beside the figures.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from berth_tools.bench import chaos_audit
from berth_tools.bench.chaos_plan import ALL_KINDS, FaultEvent, plan

TERMINAL = ("COMPLETED", "FAILED", "CANCELED")
#: The tenants' profiles (`berth local up` seeds them) and their tenants.
PROFILES = {"alice": "vision", "bob": "nlp"}
CLOUD_REGIONS = ["us-east-1", "us-west-2"]
#: How long a submit is retried (same idempotency key) before it counts as not accepted.
SUBMIT_RETRY_S = 120.0
#: Submits in flight at once at most.
SUBMITTERS = 8


@dataclass
class Workload:
    jobs_per_minute: float = 24.0
    cloud_share: float = 0.2
    detach_share: float = 0.2
    run_s: tuple[float, float] = (4.0, 15.0)


@dataclass
class Ledger:
    """What the bench did, shared by its threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: dict[str, str] = field(default_factory=dict)  # job id -> profile
    refused: Counter[str] = field(default_factory=Counter)
    faults: list[dict[str, Any]] = field(default_factory=list)
    fault_errors: list[str] = field(default_factory=list)


def job_spec(rng: random.Random, i: int, records: Path, marker: str, w: Workload) -> dict[str, Any]:
    cloud = rng.random() < w.cloud_share
    env = {
        "CHAOS_DIR": str(records),
        "RUN_S": f"{rng.uniform(*w.run_s):.1f}",
        "CHAOS_RUN": marker.split("=", 1)[1],
    }
    if rng.random() < w.detach_share:
        env["DETACH"] = "1"
    return {
        "name": f"chaos-{i}",
        "image": "python:3.11-slim",
        "command": ["python3", "-c", chaos_audit.JOB_SCRIPT],
        "resources": {"gpu_type": "A10G" if cloud else "A100", "gpus": 1, "cpu": 1, "memory_gib": 1},
        "constraints": {"placement": "cloud" if cloud else "onprem"},
        "retry": {"max_attempts": 5},
        "timeout_minutes": 15,
        "env": env,
    }


def submit_all(
    clients: dict[str, Any], specs: list[dict[str, Any]], interval_s: float, stop_at: float, ledger: Ledger
) -> None:
    """Submit ``specs`` one every ``interval_s`` (a pool, so a slow or retried submit does not hold
    the next back), the tenants in turn, until ``stop_at``."""
    profiles = list(clients)
    start = time.monotonic()

    def one(i: int, spec: dict[str, Any]) -> None:
        profile = profiles[i % len(profiles)]
        job_id = _submit_with_retries(clients[profile], spec, ledger)
        if job_id is not None:
            with ledger.lock:
                ledger.accepted[job_id] = profile

    with ThreadPoolExecutor(max_workers=SUBMITTERS) as pool:
        for i, spec in enumerate(specs):
            due = start + i * interval_s
            if due > stop_at:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            pool.submit(one, i, spec)


def _submit_with_retries(client: Any, spec: dict[str, Any], ledger: Ledger) -> str | None:
    from berth_tools.client import ClientError

    key, deadline = str(uuid.uuid4()), time.monotonic() + SUBMIT_RETRY_S
    while True:
        try:
            return str(client.submit(spec, idempotency_key=key)["id"])
        except ClientError as exc:
            retryable = exc.status == 0 or exc.status == 429 or exc.status >= 500
            if not retryable or time.monotonic() > deadline:
                with ledger.lock:
                    ledger.refused[f"{exc.status} {exc.code}"] += 1
                return None
            time.sleep(1.0)


def inject(
    events: list[FaultEvent],
    send: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]],
    t0: float,
    running_cloud_job: Callable[[], str | None],
    ledger: Ledger,
) -> None:
    """Send each fault at its time, and each window's undo at its end."""
    timeline: list[tuple[float, dict[str, Any], FaultEvent]] = []
    for e in events:
        timeline.append((e.at_s, e.body(), e))
        undo = e.undo()
        if undo is not None:
            timeline.append((e.at_s + e.duration_s, undo, e))
    for at_s, body, event in sorted(timeline, key=lambda x: x[0]):
        time.sleep(max(0.0, t0 + at_s - time.monotonic()))
        if body["kind"] == "spot-interrupt":
            job = running_cloud_job()
            if job is None:
                with ledger.lock:
                    ledger.fault_errors.append(f"{at_s:.0f}s spot-interrupt: no cloud job running")
                continue
            body = {**body, "job_id": job}
        try:
            status, answer = send(body)
        except OSError as exc:
            status, answer = 0, {"message": str(exc)}
        with ledger.lock:
            if status == 200:
                if body["kind"] not in ("heal", "clear"):
                    ledger.faults.append({"at_s": at_s, **body, "duration_s": event.duration_s})
            else:
                ledger.fault_errors.append(f"{at_s:.0f}s {body['kind']}: {status} {answer.get('message')}")


def final_states(clients: dict[str, Any], ledger: Ledger) -> dict[str, dict[str, Any]]:
    from berth_tools.client import every_job

    seen: dict[str, dict[str, Any]] = {}
    for client in clients.values():
        for job in every_job(client):
            seen[str(job["id"])] = job
    return {job_id: seen.get(job_id, {"status": "UNKNOWN"}) for job_id in ledger.accepted}


def wait_for_ends(clients: dict[str, Any], ledger: Ledger, timeout_s: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        final = final_states(clients, ledger)
        if all(j["status"] in TERMINAL for j in final.values()) or time.monotonic() > deadline:
            return final
        time.sleep(3.0)


def counters(state: Path, final: dict[str, dict[str, Any]], ledger: Ledger) -> dict[str, Any]:
    """Each tenant's ``active_jobs`` counter (the Tenants table) next to the truth."""
    import boto3

    outputs = json.loads((state / "outputs.json").read_text())
    table = boto3.Session(profile_name="admin").resource("dynamodb").Table(outputs["TenantsTableName"])
    report: dict[str, Any] = {}
    for profile, tenant in PROFILES.items():
        item = table.get_item(Key={"pk": f"TENANT#{tenant}"}, ConsistentRead=True).get("Item") or {}
        truth = sum(
            1 for j, p in ledger.accepted.items() if p == profile and final[j]["status"] not in TERMINAL
        )
        report[tenant] = {"active_jobs": int(str(item.get("active_jobs", 0))), "truth": truth}
    return report


def summarise(final: dict[str, dict[str, Any]], ledger: Ledger, events: list[FaultEvent]) -> dict[str, Any]:
    statuses = Counter(j["status"] for j in final.values())
    failures = Counter(
        (j.get("reason") or "")[:80] for j in final.values() if j["status"] in ("FAILED", "CANCELED")
    )
    kinds = Counter(f["kind"] for f in ledger.faults)
    return {
        "jobs_submitted": len(ledger.accepted) + sum(ledger.refused.values()),
        "jobs_accepted": len(ledger.accepted),
        "submits_refused": dict(ledger.refused),
        "completed": statuses.get("COMPLETED", 0),
        "failed": statuses.get("FAILED", 0),
        "canceled": statuses.get("CANCELED", 0),
        "lost": sum(n for s, n in statuses.items() if s not in TERMINAL),
        "failure_reasons": dict(failures.most_common(8)),
        "attempts_total": sum(int(j.get("attempts") or 0) for j in final.values()),
        "faults_planned": len(events),
        "faults_injected": len(ledger.faults),
        "fault_kinds": dict(sorted(kinds.items())),
        "fault_errors": ledger.fault_errors[:10],
    }


def run_chaos(
    state: Path,
    send: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]],
    hosts: list[str],
    *,
    minutes: float,
    seed: int,
    workload: Workload,
    kinds: tuple[str, ...] = ALL_KINDS,
    drain_timeout_s: float = 900.0,
    settle_s: float = 20.0,
) -> dict[str, Any]:
    """One chaos run against the local cloud at ``state`` (its env already in ``os.environ``)."""
    from berth_tools.cli.jobs_cmd import client_for

    rng = random.Random(seed)
    events = plan(seed, minutes, hosts, CLOUD_REGIONS, kinds=kinds)
    records = state.parent / f"{state.name}-chaos-records"
    records.mkdir(mode=0o777, exist_ok=True)
    records.chmod(0o1777)  # every job's uid writes its own file here
    marker = f"CHAOS_RUN={uuid.uuid4().hex}"
    clients = {p: client_for(None, p) for p in PROFILES}
    count = max(1, int(workload.jobs_per_minute * minutes))
    specs = [job_spec(rng, i, records, marker, workload) for i in range(count)]
    ledger = Ledger()
    load_before = os.getloadavg()
    t0 = time.monotonic()
    stop_at = t0 + minutes * 60

    def running_cloud_job() -> str | None:
        from berth_tools.client import ClientError

        with ledger.lock:
            ids = list(ledger.accepted.items())
        for job_id, profile in reversed(ids[-40:]):
            try:
                job = clients[profile].get(job_id)
            except ClientError:
                continue  # the API is down (an outage in the plan): try another
            if job.get("status") == "RUNNING" and job.get("site") == "cloud":
                return job_id
        return None

    submitter = threading.Thread(
        target=submit_all, args=(clients, specs, 60.0 / workload.jobs_per_minute, stop_at, ledger)
    )
    injector = threading.Thread(target=inject, args=(events, send, t0, running_cloud_job, ledger))
    submitter.start()
    injector.start()
    submitter.join()
    injector.join()
    send({"kind": "clear"})
    chaos_s = time.monotonic() - t0
    load_during = os.getloadavg()
    final = wait_for_ends(clients, ledger, drain_timeout_s)
    # Agents reap what they stop (a partitioned one once its lease is gone): anything still alive
    # after settle_s is an orphan. Polled: a run whose processes are all gone goes on at once.
    settle_until = time.monotonic() + settle_s
    while chaos_audit.orphans(chaos_audit.read_runs(records), marker) and time.monotonic() < settle_until:
        time.sleep(1.0)
    report = summarise(final, ledger, events)
    report.update(chaos_audit.audit(records, marker, final))
    chaos_audit.kill(report["orphan_pids"])
    report["counters"] = counters(state, final, ledger)
    report["counters_exact"] = all(c["active_jobs"] == c["truth"] for c in report["counters"].values())
    report.update(
        seed=seed,
        minutes=minutes,
        chaos_s=round(chaos_s, 1),
        drain_s=round(time.monotonic() - t0 - chaos_s, 1),
        load_avg_before=[round(x, 2) for x in load_before],
        load_avg_after_chaos=[round(x, 2) for x in load_during],
    )
    return report
