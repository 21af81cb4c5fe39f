"""`berth bench replay`: one trace through `berth sim` and through the real service, side by side.

The service side is the local cloud (`berth local up`): real `berth-agent` processes on the cluster's
on-prem hosts, the local AWS Batch running cloud jobs as host processes, the whole control plane
(Step Functions, scheduler, dispatch, Batch events) as deployed. Time is compressed by ``factor``:
a job arrives at ``submit_s / factor`` and runs ``sleep duration_s / factor``; the stored policy's
durations (``*_s``) and money thresholds (``*_usd``) are divided by the same factor (its rates are
not), and the local Batch's own delays too (``BERTH_TIME_FACTOR``). The service knows what it knows
in production: no run time is given, it learns them from completed jobs (``berth.logic.runtimes``),
exactly the ``predictor`` estimate mode of the simulator.

What is compared is where the GPU-hours went: the service's usage ledger (every attempt, per
site) against the simulator's per-job GPU-seconds per site, on the same trace, cluster and policy.
The simulator's cluster gets what the service is really like: its passes every ``LOCAL_TIMER_S``,
its cloud start latency (the local Batch starts at once; dispatch takes about a second), both
times ``factor``.
"""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from berth.scheduler.policy import SchedulingPolicy, load_policy
from berth_tools.client import BerthClient, ClientConfig, ClientError
from berth_tools.localcloud import launcher
from berth_tools.localcloud.seed import process_environment
from berth_tools.sim.cluster import ClusterSpec
from berth_tools.sim.engine import Simulator
from berth_tools.sim.estimates import EstimateMode
from berth_tools.sim.trace import TraceJob

TERMINAL = ("COMPLETED", "FAILED", "CANCELED")
#: The local cloud's member profiles and their tenants (``berth local up`` seeds them); trace tenants
#: are mapped onto them in order of first appearance.
LOCAL_TENANTS = (("alice", "vision"), ("bob", "nlp"))
#: The local cloud's timer (``LOCAL_TIMER_S``) and its cloud dispatch latency, in real seconds.
SERVICE_PASS_S = 2.0
SERVICE_CLOUD_START_S = 1.5
#: Seconds for the local cloud to come up.
START_TIMEOUT_S = 240.0


class ReplayError(ValueError):
    """The trace or cluster cannot be replayed through the local cloud (a clear message)."""


@dataclass(frozen=True)
class ReplayPlan:
    trace: list[TraceJob]
    cluster: ClusterSpec
    policy: SchedulingPolicy
    factor: float
    timeout_minutes: int
    tenants: dict[str, tuple[str, str]]
    """Trace tenant -> (local profile, local tenant)."""


def plan(trace: list[TraceJob], cluster: ClusterSpec, policy: SchedulingPolicy, factor: float) -> ReplayPlan:
    """Check the cluster fits the local cloud and fix what both sides are told."""
    if factor < 1:
        raise ReplayError("--factor compresses time: 1 or more")
    pools = cluster.pools
    if len(pools) != 1:
        raise ReplayError("the local cloud runs one pool of identical hosts: the cluster needs one pool")
    if cluster.tenants:
        raise ReplayError("per-tenant quotas are not replayed: leave `tenants:` empty")
    if cluster.cloud.spot.interruptions_per_hour:
        raise ReplayError("simulated spot interruptions have no local counterpart: set them to 0")
    gpu_type = pools[0].gpu_type
    if any(t.gpu_type != gpu_type for t in trace):
        raise ReplayError(f"every trace job must ask for the pool's GPU model ({gpu_type}); use --gpu-type")
    if any(t.gpus > pools[0].gpus_per_host for t in trace):
        raise ReplayError("a job larger than one host: multi-node jobs are not replayed")
    names: dict[str, tuple[str, str]] = {}
    for t in trace:
        if t.tenant not in names:
            if len(names) == len(LOCAL_TENANTS):
                raise ReplayError(f"at most {len(LOCAL_TENANTS)} tenants (the local cloud's member profiles)")
            names[t.tenant] = LOCAL_TENANTS[len(names)]
    # Both sides know the same limit: the spec's whole minutes, stretched back by the factor.
    limit_s = cluster.jobs.timeout_s or 4 * max(t.duration_s for t in trace)
    timeout_minutes = max(1, math.ceil(limit_s / factor / 60.0))
    jobs = cluster.jobs.model_copy(update={"timeout_s": timeout_minutes * 60.0 * factor})
    cloud = cluster.cloud.model_copy(update={"startup_delay_s": SERVICE_CLOUD_START_S * factor})
    sim_cluster = cluster.model_copy(
        update={"jobs": jobs, "cloud": cloud, "pass_interval_s": SERVICE_PASS_S * factor}
    )
    renamed = [replace(t, tenant=names[t.tenant][1]) for t in trace]
    return ReplayPlan(renamed, sim_cluster, policy, factor, timeout_minutes, names)


def scaled_policy(policy: SchedulingPolicy, factor: float) -> dict[str, Any]:
    """The policy as the compressed service needs it: durations and money thresholds / factor."""

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and (key.endswith("_s") or (key.endswith("_usd") and "per" not in key)):
            return value / factor
        return value

    doc = walk(policy.model_dump(mode="json"))
    load_policy(doc)  # still a valid policy
    return doc


def _site_hours(gpu_s: dict[str, float]) -> dict[str, Any]:
    onprem, cloud = gpu_s.get("onprem", 0.0) / 3600.0, gpu_s.get("cloud", 0.0) / 3600.0
    total = onprem + cloud
    return {
        "onprem_gpu_hours": round(onprem, 3),
        "cloud_gpu_hours": round(cloud, 3),
        "cloud_share": round(cloud / total, 4) if total else 0.0,
    }


def simulate_plan(p: ReplayPlan) -> dict[str, Any]:
    """The simulator's side, in trace time (the service's view of run times: the predictor)."""
    state = Simulator(p.trace, p.cluster, p.policy, EstimateMode.PREDICTOR).run()
    gpu_s: dict[str, float] = {"onprem": 0.0, "cloud": 0.0}
    sites: Counter[str] = Counter()
    for job in state.jobs.values():
        gpu_s["onprem"] += job.onprem_gpu_s
        gpu_s["cloud"] += job.cloud_gpu_s
        sites[_sim_site(job.onprem_gpu_s, job.cloud_gpu_s)] += 1
    completed = sum(1 for j in state.jobs.values() if j.end_s is not None)
    return {
        **_site_hours(dict(gpu_s)),
        "jobs": len(state.jobs),
        "completed": completed,
        "jobs_by_site": dict(sites),
        "site_of": {j: _sim_site(x.onprem_gpu_s, x.cloud_gpu_s) for j, x in state.jobs.items()},
    }


def _sim_site(onprem_gpu_s: float, cloud_gpu_s: float) -> str:
    """Where a simulated job ran most (a repatriated one ran on both)."""
    return "cloud" if cloud_gpu_s > onprem_gpu_s else "onprem"


def job_spec(t: TraceJob, p: ReplayPlan, cpu_per_gpu: float, memory_per_gpu: float) -> dict[str, Any]:
    family = re.sub(r"[^a-z0-9-]+", "-", (t.model or "job").lower()).strip("-")[:63] or "job"
    return {
        "name": family,
        "image": "busybox",
        "command": ["sleep", f"{t.duration_s / p.factor:.2f}"],
        "resources": {
            "gpu_type": t.gpu_type,
            "gpus": t.gpus,
            "cpu": cpu_per_gpu * t.gpus,
            "memory_gib": memory_per_gpu * t.gpus,
        },
        "timeout_minutes": p.timeout_minutes,
        "retry": {"max_attempts": 3},
    }


def start_local_cloud(
    p: ReplayPlan, state_dir: Path, log_path: Path
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    pool = p.cluster.pools[0]
    args = [
        "--agents", str(pool.hosts), "--gpus-per-agent", str(pool.gpus_per_host),
        "--gpu-type", pool.gpu_type, "--agent-kind", "process", "--quiet",
    ]  # fmt: skip
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        return launcher.start(
            state_dir, args, log_path, env={"BERTH_TIME_FACTOR": str(p.factor)}, timeout_s=START_TIMEOUT_S
        )
    except launcher.LocalCloudNotReady as exc:
        raise ReplayError(str(exc)) from exc


def run_service(p: ReplayPlan, env: dict[str, str], deadline_s: float) -> dict[str, Any]:
    """Submit the trace on its (compressed) schedule, wait for every job, read the usage ledger (the
    local cloud's ``env`` already in this process's environment)."""

    def client(profile: str) -> BerthClient:
        return BerthClient(ClientConfig(env["BERTH_API_URL"], env["AWS_REGION"], profile))

    try:
        client("admin").put_document("policy", scaled_policy(p.policy, p.factor))
    except ClientError as exc:
        raise ReplayError(f"storing the scaled policy failed: {exc}") from exc
    pool = p.cluster.pools[0]
    cpu, mem = p.cluster.jobs.cpu_per_gpu, p.cluster.jobs.memory_gib_per_gpu
    if cpu * pool.gpus_per_host > pool.cpu or mem * pool.gpus_per_host > pool.memory_gib:
        raise ReplayError("the cluster's per-GPU CPU/memory do not fit its hosts")
    profiles = {tenant: profile for profile, tenant in p.tenants.values()}
    clients = {tenant: client(profile) for tenant, profile in profiles.items()}
    ids: dict[str, tuple[str, str]] = {}  # trace job -> (tenant, service job id)
    errors: list[str] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def submit(t: TraceJob) -> None:
        delay = t0 + t.submit_s / p.factor - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        spec = job_spec(t, p, cpu, mem)
        try:
            job = clients[t.tenant].submit(spec)  # retries 429 and 5xx with backoff
        except ClientError as exc:
            with lock:
                errors.append(f"{t.job_id}: {exc}")
            return
        with lock:
            ids[t.job_id] = (t.tenant, str(job["id"]))

    with ThreadPoolExecutor(max_workers=16) as pool_ex:
        list(pool_ex.map(submit, sorted(p.trace, key=lambda t: t.submit_s)))
    final: dict[str, dict[str, Any]] = {}
    while len(final) < len(ids) and time.monotonic() - t0 < deadline_s:
        for trace_id, (tenant, job_id) in ids.items():
            if trace_id not in final:
                with contextlib.suppress(ClientError):
                    job = clients[tenant].get(job_id)
                    if job.get("status") in TERMINAL:
                        final[trace_id] = job
        time.sleep(1.0)
    wall = time.monotonic() - t0
    gpu_s: dict[str, float] = {"onprem": 0.0, "cloud": 0.0}
    for tenant, c in clients.items():
        usage = c.usage(tenant)
        for site in usage.get("sites", []):
            # the ledger is in compressed time: stretched back to the trace's
            key = str(site["site"])
            gpu_s[key] = gpu_s.get(key, 0.0) + float(site["gpu_hours"]) * 3600.0 * p.factor
    statuses = Counter(j["status"] for j in final.values())
    sites = Counter(str(j.get("site")) for j in final.values() if j.get("status") == "COMPLETED")
    return {
        **_site_hours(gpu_s),
        "jobs": len(p.trace),
        "submitted": len(ids),
        "completed": statuses.get("COMPLETED", 0),
        "statuses": dict(statuses),
        "unfinished": len(ids) - len(final),
        "jobs_by_site": dict(sites),
        "site_of": {t: str(j.get("site")) for t, j in final.items()},
        "submit_errors": errors[:5],
        "wall_s": round(wall, 1),
    }


def replay(
    trace: list[TraceJob],
    cluster: ClusterSpec,
    policy: SchedulingPolicy,
    factor: float,
    *,
    work_dir: Path | None = None,
    deadline_s: float = 1800.0,
) -> dict[str, Any]:
    p = plan(trace, cluster, policy, factor)
    sim = simulate_plan(p)
    root = Path(work_dir or tempfile.mkdtemp(prefix="berth-replay-"))
    root.mkdir(parents=True, exist_ok=True)
    proc, env = start_local_cloud(p, root / "state", root / "local-cloud.log")
    try:
        # the local cloud's env for the run, the caller's back after it (the local cloud is then gone)
        with process_environment(env):
            service = run_service(p, env, deadline_s)
    finally:
        launcher.stop(proc, timeout_s=60)
    diff = service["cloud_share"] - sim["cloud_share"]
    sim_sites, service_sites = sim.pop("site_of"), service.pop("site_of")
    same = sum(1 for j, site in service_sites.items() if sim_sites.get(j) == site)
    return {
        "trace_jobs": len(trace),
        "factor": factor,
        "policy": policy.name,
        "onprem_gpus": cluster.onprem_gpus,
        "estimates": "predictor",
        "sim": sim,
        "service": service,
        "cloud_share_diff": round(diff, 4),
        "cloud_share_rel_diff": round(diff / sim["cloud_share"], 4) if sim["cloud_share"] else None,
        "within_10pct": abs(diff) <= 0.10 * max(sim["cloud_share"], 1e-9),
        "jobs_on_the_same_site": same,
        "local_cloud_log": str(root / "local-cloud.log"),
    }
