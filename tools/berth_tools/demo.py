"""`make demo`: bring the local cloud up with real agent processes, drive a scenario through the public API.

Every step is checked; the process exits 0 only when all of them behaved. The scenario uses the
real CLI (a subprocess, as a user would) and a plain SigV4 client for the checks a CLI hides.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from berth_tools.client import BerthClient, ClientConfig, ClientError
from berth_tools.localcloud import launcher

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "jobs"
console = Console()


@dataclass
class Scenario:
    env: dict[str, str]
    state_dir: Path = Path()
    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def client(self, profile: str) -> BerthClient:
        os.environ.update(self.env)
        return BerthClient(ClientConfig(self.env["BERTH_API_URL"], self.env["AWS_REGION"], profile))

    def cli(self, profile: str, *args: str) -> tuple[int, Any, str]:
        cmd = [sys.executable, "-m", "berth_tools.cli.main", *args, "--output", "json"]
        env = {**os.environ, **self.env, "AWS_PROFILE": profile}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
        try:
            out = json.loads(proc.stdout) if proc.stdout.strip() else None
        except ValueError:
            out = proc.stdout
        shown = f"AWS_PROFILE={profile} berth {shlex.join(args)} -o json"
        console.print(f"  [dim]$ {shown}  → exit {proc.returncode}[/]")
        return proc.returncode, out, proc.stderr

    def step(self, title: str, fn: Callable[[], str]) -> None:
        console.print(f"[bold]▶ {title}[/]")
        try:
            detail = fn()
            ok = True
        except AssertionError as exc:
            ok, detail = False, f"unexpected: {exc}"
        except (ClientError, OSError, ValueError, KeyError, TypeError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        mark = "[green]✔[/]" if ok else "[red]✘[/]"
        console.print(f"  {mark} {escape(detail)}")
        self.results.append((title, ok, detail))


def _start_local_cloud(state_dir: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    console.print(f"[bold]Starting the local cloud[/] (berth local up --state-dir {state_dir}) …")
    t0 = time.monotonic()
    try:
        # real berth-agent processes: each job runs as a process on its host's simulated GPUs
        proc, env = launcher.start(
            state_dir, ["--agent-kind", "process"], state_dir.parent / "demo-local-cloud.log", cwd=ROOT
        )
    except launcher.LocalCloudNotReady as exc:
        raise SystemExit(str(exc)) from exc
    console.print(f"  local cloud ready in {time.monotonic() - t0:.1f}s at {env['BERTH_API_URL']}")
    return proc, env


def _training(seconds: float, marker: str = "") -> list[str]:
    """A stand-in training loop (one line per second) that really runs on an agent's host: it prints the
    GPUs it was given and writes a checkpoint where Berth says. ``marker`` names its process."""
    code = (
        "import os, sys, time, pathlib\n"
        f"# {marker}\n"
        f"n = {max(1, round(seconds))}\n"
        "gpus = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "for epoch in range(1, n + 1):\n"
        "    time.sleep(1)\n"
        "    print(f'epoch {epoch}/{n} loss {1 / epoch:.3f} gpus {gpus}', flush=True)\n"
        "ck = pathlib.Path(os.environ.get('BERTH_CHECKPOINT_DIR') or '.') / 'last.txt'\n"
        "ck.write_text(str(n))\n"
    )
    return ["python3", "-c", code]


def _runnable(example: str, seconds: float, **changes: Any) -> dict[str, Any]:
    """An example spec whose command is a stand-in training loop (the example's own program needs its
    image, which the local cloud's process executor does not run)."""
    spec = {**_yaml(EXAMPLES / example), "command": _training(seconds, changes.pop("marker", "")), **changes}
    return spec


def _pids_running(marker: str) -> list[int]:
    """Processes whose command line carries ``marker``."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def run(s: Scenario) -> None:
    alice, admin = s.client("alice"), s.client("admin")
    ids: dict[str, str] = {}
    specs = s.state_dir / "specs"
    specs.mkdir(exist_ok=True)

    def spec_file(name: str, spec: dict[str, Any]) -> str:
        import yaml

        path = specs / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return str(path)

    def alice_submits() -> str:
        resnet = spec_file("resnet-vision.yaml", _runnable("resnet-vision.yaml", 6))
        code, job, err = s.cli("alice", "submit", "-f", resnet)
        assert code == 0, f"exit {code}: {err} {job}"
        # The agents may have placed it by the time the CLI prints it.
        assert job["status"] in ("QUEUED", "STARTING", "RUNNING", "COMPLETED"), job
        assert job["tenant"] == "vision", job
        ids["alice"] = job["id"]
        return f"alice's job {job['id']} is {job['status']} in tenant {job['tenant']}"

    def bob_submits() -> str:
        bert = spec_file("bert-nlp.yaml", _runnable("bert-nlp.yaml", 4))
        code, job, err = s.cli("bob", "submit", "-f", bert)
        assert code == 0, f"exit {code}: {err} {job}"
        assert job["tenant"] == "nlp", job
        ids["bob"] = job["id"]
        return f"bob's job {job['id']} is {job['status']} in tenant {job['tenant']}"

    def each_sees_own() -> str:
        _, a, _ = s.cli("alice", "ls")
        _, b, _ = s.cli("bob", "ls")
        a_ids, b_ids = {j["id"] for j in a["jobs"]}, {j["id"] for j in b["jobs"]}
        assert ids["alice"] in a_ids and ids["bob"] not in a_ids, a_ids
        assert ids["bob"] in b_ids and ids["alice"] not in b_ids, b_ids
        return f"alice sees {len(a_ids)} job(s), bob sees {len(b_ids)}; neither sees the other's"

    def bob_cannot_read_alice() -> str:
        code, out, _ = s.cli("bob", "status", ids["alice"])
        assert code == 3 and out["error"]["code"] == "NotFound", (code, out)
        return f"bob asking for {ids['alice']} gets 404 NotFound (exit 3)"

    def wait_for(job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = alice.get(job_id)
            if done(job):
                return dict(job)
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id} stayed {job['status']}: {job['reason']}")
            time.sleep(0.3)

    def is_(*statuses: str) -> Callable[[dict[str, Any]], bool]:
        return lambda j: j["status"] in statuses

    def runs_to_completion() -> str:
        done = wait_for(ids["alice"], is_("COMPLETED", "FAILED", "CANCELED"))
        assert done["status"] == "COMPLETED", done
        _, hist, _ = s.cli("alice", "events", ids["alice"])
        moves = [e["to"] for e in hist["events"]]
        assert moves == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"], moves
        seen = _bus_events(s.env, s.state_dir, ids["alice"], 4)
        assert seen == moves, seen
        host = done["placement"]["hosts"][0]
        return (
            f"{ids['alice']} ran as a process on {host['host_id']} ({host['gpus']} GPUs "
            f"{done['placement']['gpu_type']}, imagenet staged from S3): "
            f"{' → '.join(moves)}; the same 4 changes arrived on the JobEventsQueueUrl queue"
        )

    def logs_follow() -> str:
        epochs = 15
        spec = _runnable("resnet-vision.yaml", epochs, name="live-logs")
        spec["resources"] = {**spec["resources"], "gpus": 1, "cpu": 4, "memory_gib": 16}
        spec["data"] = []
        job = alice.submit(spec)
        env = {**os.environ, **s.env, "AWS_PROFILE": "alice"}
        cmd = ["logs", "-f", "--poll", "0.5", job["id"]]
        console.print(f"  [dim]$ AWS_PROFILE=alice berth {shlex.join(cmd)}[/]")
        # Started at once, while the job is placed: on a loaded machine the CLI's own start-up can take
        # longer than the job's run, and the follower must be reading while the job runs.
        follower = subprocess.Popen(
            [sys.executable, "-m", "berth_tools.cli.main", *cmd],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert follower.stdout is not None
        wait_for(job["id"], is_("RUNNING"), 60)
        lines: list[str] = []
        status_at_first_line = None
        for line in follower.stdout:
            if status_at_first_line is None:
                status_at_first_line = alice.get(job["id"])["status"]
            lines.append(line.rstrip("\n"))
            console.print(f"  [dim]│ {escape(lines[-1])}[/]")
        code = follower.wait(timeout=60)
        assert code == 0, follower.stderr.read() if follower.stderr else code
        assert status_at_first_line == "RUNNING", status_at_first_line
        printed = [int(x.split()[1].split("/")[0]) for x in lines if x.startswith("epoch ")]
        assert printed == list(range(1, epochs + 1)), lines
        assert alice.get(job["id"])["status"] == "COMPLETED"
        code, usage, err = s.cli("alice", "metrics", job["id"])
        assert code == 0, err
        summary = usage["summary"]
        assert usage["samples"] and summary["rss_max_mib"], usage
        return (
            f"berth logs -f printed {len(lines)} lines as {job['id']} ran (the first while it was RUNNING) "
            f"and exited when it COMPLETED; berth metrics: {len(usage['samples'])} samples, "
            f"peak RSS {summary['rss_max_mib']:.0f} MiB"
        )

    def bob_completes() -> str:
        done = s.client("bob").get(ids["bob"])
        deadline = time.monotonic() + 60
        while done["status"] not in ("COMPLETED", "FAILED", "CANCELED") and time.monotonic() < deadline:
            time.sleep(0.5)
            done = s.client("bob").get(ids["bob"])
        assert done["status"] == "COMPLETED", done
        host = done["placement"]["hosts"][0]["host_id"]
        return f"{ids['bob']} COMPLETED on {host} with dataset://glue mounted read-only from the host's disk"

    def agent_killed() -> str:
        spec = _runnable("resnet-vision.yaml", 20, name="host-dies-trial")
        spec["resources"] = {**spec["resources"], "gpu_type": "A100", "gpus": 1, "cpu": 4, "memory_gib": 16}
        spec["data"] = []
        job = alice.submit(spec)
        running = wait_for(job["id"], is_("RUNNING"), 60)
        host = running["placement"]["hosts"][0]["host_id"]
        agents = json.loads((s.state_dir / "agents.json").read_text())
        pid = next(a["pid"] for a in agents if a["host_id"] == host)
        time.sleep(2)
        os.kill(pid, signal.SIGKILL)
        done = wait_for(job["id"], is_("COMPLETED", "FAILED", "CANCELED"), 120)
        assert done["status"] == "COMPLETED" and done["attempts"] == 2, done
        events = alice.events(job["id"])["events"]
        retry = next(e for e in events if e["to"] == "RETRYING")
        second = done["placement"]["hosts"][0]["host_id"]
        agents = json.loads((s.state_dir / "agents.json").read_text())
        restarted = next(a["pid"] for a in agents if a["host_id"] == host)
        assert restarted != pid, "the killed agent was not started again"
        return (
            f"agent {host} (pid {pid}) killed with SIGKILL while {job['id']} ran: {retry['reason']}; "
            f"attempt 2 ran on {second} → COMPLETED; the agent came back as pid {restarted} "
            "(restarted as systemd would)"
        )

    def failure_in_berths_words() -> str:
        code = (
            "import os, sys\n"
            "print('\\x1b]0;owned\\x07\\x1b[2Jthis line tried to retitle and clear the terminal')\n"
            "print('Error: the API refused token ' + os.environ['WANDB_API_KEY'], file=sys.stderr)\n"
            "sys.exit(3)\n"
        )
        spec = {
            "name": "prints-its-secret",
            "image": "python:3.11-slim",
            "command": ["python3", "-c", code],
            "resources": {"gpu_type": "A100", "gpus": 1, "cpu": 1, "memory_gib": 4},
            "secrets": {"WANDB_API_KEY": "berth/vision/wandb"},
            "retry": {"max_attempts": 1},
        }
        job = alice.submit(spec)
        done = wait_for(job["id"], is_("COMPLETED", "FAILED", "CANCELED"), 90)
        assert done["status"] == "FAILED" and "code 3" in done["reason"], done
        kept = json.dumps([done, alice.events(job["id"])])
        assert "local-placeholder" not in kept, "the secret reached the job's reason or events"
        env = {**os.environ, **s.env, "AWS_PROFILE": "alice"}
        logs = subprocess.run(
            [sys.executable, "-m", "berth_tools.cli.main", "logs", job["id"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert "\x1b" not in logs.stdout and "\\x1b" in logs.stdout, logs.stdout
        assert "local-placeholder" in logs.stdout, logs.stdout  # the job's own output keeps what it printed
        return (
            f"FAILED: {done['reason']!r}; the secret it printed is in its log only, and berth logs shows "
            "its terminal escapes as \\x1b instead of obeying them"
        )

    def outage_ridden_out() -> str:
        from berth_tools.cli.fault_cmd import fault_url, send

        spec = _runnable("resnet-vision.yaml", 30, name="rides-out-an-outage")
        spec["resources"] = {**spec["resources"], "gpu_type": "A100", "gpus": 1, "cpu": 4, "memory_gib": 16}
        spec["data"] = []
        job = alice.submit(spec)
        wait_for(job["id"], is_("RUNNING"), 60)
        url = fault_url(s.state_dir)
        assert send(url, {"kind": "control-plane-outage"})[0] == 200
        try:
            time.sleep(24)  # longer than the 20 s host lease; every API call answers 503 meanwhile
        finally:
            assert send(url, {"kind": "clear"})[0] == 200
        done = wait_for(job["id"], is_("COMPLETED", "FAILED", "CANCELED"), 90)
        assert done["status"] == "COMPLETED" and done["attempts"] == 1, done
        return (
            "Berth's API answered 503 for 24 s (past the 20 s lease): the agent kept the job running "
            f"(outage tolerance), heartbeated again, and {job['id']} COMPLETED in its first attempt"
        )

    def gpu_fault_moves_a_job() -> str:
        spec = _runnable("resnet-vision.yaml", 40, name="gpu-falls-off")
        spec["resources"] = {**spec["resources"], "gpu_type": "A100", "gpus": 1, "cpu": 4, "memory_gib": 16}
        spec["data"] = []
        spec["retry"] = {"max_attempts": 1}  # the GPU's fault uses none of them
        job = alice.submit(spec)
        running = wait_for(job["id"], is_("RUNNING"), 60)
        first = running["placement"]["hosts"][0]
        host, gpu = first["host_id"], first["gpu_ids"][0]
        code, _, err = s.cli(
            "admin", "local", "fault", "--state-dir", str(s.state_dir), "gpu-error", host, gpu
        )
        assert code == 0, err
        moved = wait_for(job["id"], lambda j: j["status"] == "RUNNING" and j["attempts"] == 2, 90)
        second = moved["placement"]["hosts"][0]
        assert (second["host_id"], second["gpu_ids"][0]) != (host, gpu), second
        retry = next(e for e in alice.events(job["id"])["events"] if e["to"] == "RETRYING")
        _, cap, _ = s.cli("admin", "capacity")
        faulted = cap["totals"].get("faulted_gpus")
        code, _, err = s.cli("admin", "gpu-clear", host, gpu)
        assert code == 0, err
        alice.cancel(job["id"])
        return (
            f"XID 79 on {host} GPU {gpu} while {job['id']} ran: {retry['reason'][:150]}…; attempt 2 on "
            f"{second['host_id']} with 1 allowed (not counted); capacity showed {faulted} faulted GPU(s); "
            "berth gpu-clear put it back"
        )

    def cancel_running() -> str:
        marker = f"berth-demo-long-run-{uuid.uuid4().hex[:8]}"
        spec = _runnable("resnet-vision.yaml", 300, name="long-run", marker=marker)
        spec["resources"] = {**spec["resources"], "gpus": 2, "cpu": 8, "memory_gib": 32}
        job = alice.submit(spec)
        wait_for(job["id"], is_("RUNNING"))
        deadline = time.monotonic() + 10
        while not _pids_running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_running(marker), "the job's process never appeared"
        code, out, err = s.cli("alice", "cancel", job["id"])
        assert code == 0 and out["status"] == "CANCELING", (code, out, err)
        done = wait_for(job["id"], is_("CANCELED", "COMPLETED", "FAILED"), 30)
        assert done["status"] == "CANCELED", done
        moves = [e["to"] for e in alice.events(job["id"])["events"]]
        assert moves[-2:] == ["CANCELING", "CANCELED"], moves
        left = _pids_running(marker)
        assert not left, f"the job's processes are still running: {left}"
        return f"{job['id']}: {' → '.join(moves)} (its agent stopped the process group and confirmed)"

    def waits_and_explains() -> str:
        blocker = _runnable("resnet-vision.yaml", 300)
        for i in range(2):
            ids[f"blocker{i}"] = alice.submit({**blocker, "name": f"resnet-long-{i}"})["id"]
        for i in range(2):
            wait_for(ids[f"blocker{i}"], is_("RUNNING"))
        code, job, err = s.cli("alice", "submit", "-f", spec_file("resnet-vision.yaml", blocker))
        assert code == 0, err
        ids["waiting"] = job["id"]
        time.sleep(2.5)
        code, out, err = s.cli("alice", "explain", job["id"])
        assert code == 0, (code, err)
        ex = out["explanation"]
        assert out["status"] == "QUEUED" and ex is not None, out
        assert "capacity" in json.dumps(ex["rules"]), ex
        return f"{job['id']} waits: {ex['summary'][:110]}"

    def idempotent_retry() -> str:
        spec = _runnable("resnet-vision.yaml", 5, name="resnet-sweep")
        key = str(uuid.uuid4())
        first, second = alice.submit(spec, key), alice.submit(spec, key)
        assert first["id"] == second["id"], (first["id"], second["id"])
        try:
            alice.submit({**spec, "name": "another-trial"}, key)
        except ClientError as exc:
            assert exc.status == 409, exc
        else:
            raise AssertionError("reusing the key with another body was accepted")
        ids["sweep"] = first["id"]
        return f"same Idempotency-Key twice → same job {first['id']}; with another body → 409"

    def cancel() -> str:
        code, job, err = s.cli("alice", "cancel", ids["sweep"])
        assert code == 0 and job["status"] == "CANCELED", (code, job, err)
        _, hist, _ = s.cli("alice", "events", ids["sweep"])
        moves = [f"{e['from'] or '∅'}→{e['to']}" for e in hist["events"]]
        assert moves == ["∅→QUEUED", "QUEUED→CANCELED"], moves
        for key in ("waiting", "blocker0", "blocker1"):
            alice.cancel(ids[key])
        for key in ("waiting", "blocker0", "blocker1"):
            wait_for(ids[key], is_("CANCELED"), 30)
        return f"{ids['sweep']} CANCELED at once; history {' , '.join(moves)} (and the blockers canceled)"

    def sweep() -> str:
        spec = _yaml(EXAMPLES / "sweep.yaml")
        spec["array"] = {"parameters": [{"lr": round(0.0001 * (i + 1), 4), "batch": 32} for i in range(50)]}
        t0 = time.monotonic()
        code, arr, err = s.cli("alice", "submit", "-f", spec_file("sweep-50.yaml", spec))
        accepted_s = time.monotonic() - t0
        assert code == 0 and arr["array"]["size"] == 50, (code, arr, err)
        array_id = arr["id"]
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while True:  # progress: what berth submit --wait draws as a bar
            counts = alice.get(array_id)["array"]["counts"]
            line = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            if not seen or seen[-1] != line:
                seen.append(line)
                console.print(f"  [dim]{array_id}: {line}[/]")
            if counts.get("COMPLETED", 0) >= 3:
                break
            assert time.monotonic() < deadline, counts
            time.sleep(1)
        task = alice.get(f"{array_id}:0")
        assert task["spec"]["command"][-2:] == ["0.0001", "32"], task["spec"]["command"]
        want = "trial 0/50: lr=0.0001 batch=32 (env lr=0.0001)"
        deadline = time.monotonic() + 60
        while True:
            lines = [e["message"] for e in alice.logs(f"{array_id}:0")["events"]]
            if want in lines:
                break
            assert time.monotonic() < deadline, lines
            time.sleep(1)
        code, listed, err = s.cli("alice", "ls", "--array", array_id, "--limit", "100")
        assert code == 0 and len(listed["jobs"]) == 50, (code, err)
        # the team's queue in the order the scheduler serves it (the head its last pass ranked)
        code, queue, err = s.cli("alice", "queue", "--limit", "5")
        assert code == 0 and queue["tenant"] == "vision", (code, queue, err)
        positions = [j["queue_position"] for j in queue["jobs"]]
        assert positions == sorted(positions), positions
        head = ", ".join(f"#{j['queue_position']} {j['id']}" for j in queue["jobs"][:3]) or "none"
        console.print(f"  [dim]berth queue: {queue['waiting']} waiting; head {head}[/]")
        code, out, err = s.cli("alice", "cancel", array_id)
        assert code == 0 and out["id"] == array_id, (code, out, err)
        deadline = time.monotonic() + 120
        while True:
            counts = alice.get(array_id)["array"]["counts"]
            if sum(counts.get(k, 0) for k in ("COMPLETED", "FAILED", "CANCELED")) == 50:
                break
            assert time.monotonic() < deadline, counts
            time.sleep(1)
        console.print(f"  [dim]{array_id}: {counts}[/]")
        assert set(counts) <= {"COMPLETED", "CANCELED"} and counts.get("CANCELED", 0) >= 1, counts
        code, rows, _ = s.cli("alice", "ls")
        row = next(j for j in rows["jobs"] if j["id"] == array_id)
        assert row["array"]["counts"] == counts and not any(
            j["id"].startswith(array_id + ":") for j in rows["jobs"]
        )
        return (
            f"one submit of a 50-task array {array_id} answered in {accepted_s:.1f}s (CLI included); "
            f"tasks ran with their BERTH_PARAM_*; one bulk cancel: {counts.get('COMPLETED', 0)} COMPLETED, "
            f"{counts['CANCELED']} CANCELED; berth ls shows it as one row"
        )

    def bad_spec() -> str:
        before = len(alice.list(limit=100)["jobs"])
        code, out, _ = s.cli("alice", "submit", "-f", str(EXAMPLES / "bad-shell-command.yaml"))
        assert code == 2 and out["error"]["code"] == "ValidationError", (code, out)
        after = len(alice.list(limit=100)["jobs"])
        assert before == after, (before, after)
        return f"refused with 422: {out['error']['message']!r}; nothing stored"

    def unsigned() -> str:
        req = urllib.request.Request(s.env["BERTH_API_URL"] + "/v1/jobs")
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == 403, exc.code
            return "an unsigned request gets 403"
        raise AssertionError("unsigned request was accepted")

    def quotas() -> str:
        try:
            alice.put_quota("vision", {"max_active_jobs": 1000})
        except ClientError as exc:
            assert exc.status == 403, exc
        else:
            raise AssertionError("a member set a quota")
        q = admin.put_quota("vision", {"gpus": {"V100": {"guaranteed": 64, "borrow_limit": 32}}, "weight": 2})
        assert alice.get_quota("vision") == q
        return "alice may not set quotas (403); admin sets vision's V100 guarantee to 64"

    def code_bundle() -> str:
        bundle_spec = EXAMPLES / "mnist-bundle.yaml"
        code, first, err = s.cli("alice", "submit", "-f", str(bundle_spec))
        assert code == 0, f"exit {code}: {err} {first}"
        digest = first["spec"]["code"]
        assert digest.startswith("sha256:"), first["spec"]
        code, second, err2 = s.cli("alice", "submit", "-f", str(bundle_spec))
        assert code == 0 and "nothing uploaded" in err2, (code, err2)
        assert second["spec"]["code"] == digest
        ids["bundle"] = first["id"]
        secret_shown = "local-placeholder" in json.dumps([first, second])
        assert not secret_shown, "a secret's value reached the API's answer"
        done = wait_for(first["id"], is_("COMPLETED", "FAILED", "CANCELED"), 90)
        assert done["status"] == "COMPLETED", done
        return (
            f"./mnist packed and uploaded once as {digest[:19]}…, fetched, verified and run to COMPLETED on "
            f"{done['placement']['hosts'][0]['host_id']}; the second submit uploaded nothing; "
            f"data s3://vision-datasets/mnist/ (granted to vision) and secret berth/vision/wandb by name"
        )

    def foreign_code_and_data() -> str:
        bob = s.client("bob")
        digest = alice.get(ids["bundle"])["spec"]["code"]
        for spec, status in (
            ({"name": "x", "code": digest, "command": ["python", "train.py"]}, 422),
            (
                {
                    "name": "x",
                    "image": "busybox",
                    "data": [{"source": "s3://vision-datasets/mnist/", "mount": "/d"}],
                },
                403,
            ),
            ({"name": "x", "image": "busybox", "secrets": {"T": "berth/vision/wandb"}}, 403),
        ):
            try:
                bob.submit(spec)
            except ClientError as exc:
                assert exc.status == status, (exc.status, exc.message)
            else:
                raise AssertionError(f"bob's job was accepted: {spec}")
        return "bob may not use vision's bundle (422), its data (403) or its secret (403)"

    def outputs_and_checkpoint() -> str:
        job_id = ids["alice"]
        code, job, err = s.cli("alice", "status", job_id)
        assert code == 0, err
        ckpt = job.get("checkpoint")
        assert ckpt and ckpt["size_bytes"] > 0, job
        dest = s.state_dir / "outputs" / job_id
        code, _, err = s.cli("alice", "outputs", job_id, "--get", str(dest))
        assert code == 0, err
        fetched = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
        assert any(name.endswith("last.txt") for name in fetched), fetched
        code, _, _ = s.cli("bob", "outputs", job_id)
        assert code == 3, f"bob listed alice's outputs (exit {code})"
        return (
            f"{job_id}'s last checkpoint: {ckpt['size_bytes']} bytes at {ckpt['at']} (attempt "
            f"{ckpt['attempt']}); berth outputs --get fetched {', '.join(fetched)}; bob gets 404 (exit 3)"
        )

    def admin_lists_every_team() -> str:
        code, out, err = s.cli("admin", "ls", "--all-tenants", "--since", "1h")
        assert code == 0, err
        tenants = {j["tenant"] for j in out["jobs"]}
        assert {"vision", "nlp"} <= tenants, tenants
        code, _, _ = s.cli("alice", "ls", "--all-tenants")
        assert code == 2 or code == 4, f"a member listed every team's jobs (exit {code})"
        return f"admin sees {len(out['jobs'])} job(s) of {', '.join(sorted(tenants))}; alice is refused"

    def dry_run() -> str:
        spec = spec_file("plan-v100.yaml", _runnable("resnet-vision.yaml", 5, name="planned"))
        _, before, _ = s.cli("alice", "ls", "--all")
        code, plan, err = s.cli("alice", "submit", "-f", spec, "--dry-run")
        assert code == 0, f"exit {code}: {err}"
        assert plan["stored"] is False and plan["outcome"] in ("onprem", "cloud", "pending"), plan
        _, after, _ = s.cli("alice", "ls", "--all")
        assert len(after["jobs"]) == len(before["jobs"]), "a dry run stored a job"
        price = "-" if plan.get("hourly_usd") is None else f"{plan['hourly_usd']:.2f} USD/h"
        return f"outcome {plan['outcome']} ({plan['summary']}); price {price}; nothing stored"

    def did_you_mean() -> str:
        spec = {
            "name": "typo",
            "comand": ["python3", "-c", "print(1)"],
            "resources": {"gpu_type": "a100", "gpus": 1},
        }
        try:
            alice.submit(spec)
        except ClientError as exc:
            assert exc.status == 422 and exc.code == "ValidationError", (exc.status, exc.code)
            by_field = {d["field"]: d for d in exc.details or []}
            assert by_field["comand"].get("did_you_mean") == "command", exc.details
            return f"422: {by_field['comand']['message']} (did you mean 'command'?)"
        raise AssertionError("a spec with 'comand' was accepted")

    def shapes() -> str:
        spec = {
            "name": "one-huge-node",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "A100", "gpus": 64, "nodes": 1},
        }
        try:
            alice.submit(spec)
        except ClientError as exc:
            assert exc.status == 422 and exc.code == "Infeasible", (exc.status, exc.code)
            assert (exc.details or {}).get("rule") == "shape", exc.details
            return f"refused with 422 Infeasible, rule 'shape': {exc.message}"
        raise AssertionError("a 64-GPU single-node job was accepted")

    def infeasible() -> str:
        spec = {
            "name": "h200-only",
            "image": "busybox",
            "command": ["true"],
            "resources": {"gpu_type": "H200", "gpus": 8},
        }
        try:
            alice.submit(spec)
        except ClientError as exc:
            assert exc.status == 422 and exc.code == "Infeasible", (exc.status, exc.code)
            rule = (exc.details or {}).get("rule")
            assert rule == "gpu_type", exc.details
            return f"refused with 422 Infeasible, rule {rule!r}: {exc.message}"
        raise AssertionError("an 8xH200 job was accepted though no host or offer has H200s")

    def capacity() -> str:
        code, cap, err = s.cli("admin", "capacity")
        assert code == 0 and cap["totals"]["hosts"] >= 1, (code, err)
        tot = cap["totals"]
        return (
            f"capacity: {tot['hosts']} hosts, {tot['free_gpus']}/{tot['gpus']} GPUs free, "
            f"{len(cap['cloud']['regions'])} cloud regions, each with its circuit state"
        )

    def drain_host() -> str:
        code, cap, err = s.cli("admin", "capacity")
        assert code == 0, err
        host = min(h["host_id"] for h in cap["hosts"] if h["alive"])
        code, out, err = s.cli("alice", "drain", host)
        assert code != 0 and out["error"]["code"] == "Forbidden", (code, out, err)  # members may not
        code, out, err = s.cli("admin", "drain", host)
        assert code == 0 and out == {"host_id": host, "drain_requested": True}, (code, out, err)
        _, cap, _ = s.cli("admin", "capacity")
        draining = {h["host_id"]: h["draining"] for h in cap["hosts"]}
        assert draining[host] is True, draining
        code, out, err = s.cli("admin", "drain", host, "--undo")
        assert code == 0 and out["drain_requested"] is False, (code, out, err)
        return f"an admin drained {host} (no new work; capacity says draining), then lifted it; alice may not"

    def only_vision_bursts() -> str:
        code, current, err = s.cli("admin", "policy")
        assert code == 0, err
        doc = current["document"]
        doc["burst"] = {**doc["burst"], "tenants": ["vision"], "min_wait_s": 3.0, "wait_fraction": 0.0}
        code, stored, err = s.cli("admin", "policy", "--set", spec_file("policy.yaml", doc))
        assert code == 0, err
        return (
            f"policy v{stored['version']}: team vision may burst after 3 s of waiting for on-prem; "
            "other teams stay on-prem"
        )

    burst: dict[str, list[str]] = {"first": [], "rerouted": []}

    def cloud_job(name: str) -> dict[str, Any]:
        spec = _runnable("resnet-vision.yaml", 8, name=name)
        # V100, like the full on-prem hosts: in the cloud, the p3 queues of us-east-1 and us-west-2.
        spec["resources"] = {**spec["resources"], "gpu_type": "V100", "gpus": 1, "cpu": 4, "memory_gib": 16}
        spec["data"] = []
        spec["expected_duration_minutes"] = 30
        return spec

    def bursts_to_cloud() -> str:
        blocker = _runnable("resnet-vision.yaml", 300, name="resnet-fills-v100")
        blocker["expected_duration_minutes"] = 600
        blocker["constraints"] = {**blocker["constraints"], "placement": "onprem"}
        for i in range(2):
            ids[f"full{i}"] = alice.submit({**blocker, "name": f"resnet-fills-v100-{i}"})["id"]
        for i in range(2):
            wait_for(ids[f"full{i}"], is_("RUNNING"), 60)
        nlp = _runnable("bert-nlp.yaml", 5, name="bert-stays-onprem")
        nlp["resources"] = {**nlp["resources"], "gpu_type": "V100", "gpus": 1, "cpu": 4, "memory_gib": 16}
        ids["nlp_waits"] = s.client("bob").submit(nlp)["id"]
        burst["first"] = [alice.submit(cloud_job(f"vision-burst-{i}"))["id"] for i in range(3)]
        done = [wait_for(j, is_("COMPLETED", "FAILED", "CANCELED"), 90) for j in burst["first"]]
        assert all(d["status"] == "COMPLETED" and d["site"] == "cloud" for d in done), done
        # one Batch queue per instance type: the one the scheduler priced is the one Batch launches
        assert all(d["placement"]["instance_type"].replace(".", "_") in d["placement"]["queue"] for d in done)
        where = sorted({f"{d['placement']['region']} {d['placement']['queue']}" for d in done})
        nlp_job = s.client("bob").get(ids["nlp_waits"])
        assert nlp_job["status"] == "QUEUED" and nlp_job["site"] is None, nlp_job
        return (
            f"V100 hosts full: vision's 3 V100 jobs burst to AWS Batch ({', '.join(where)}) and COMPLETED; "
            f"bob's V100 job waits on-prem ({nlp_job['reason'][:60]}…)"
        )

    def region_outage() -> str:
        last = alice.get(burst["first"][-1])
        region = last["placement"]["region"]
        fault = ("local", "fault", "--state-dir", str(s.state_dir))
        code, out, err = s.cli("admin", *fault, "region-outage", region)
        assert code == 0, (code, out, err)
        burst["rerouted"] = [alice.submit(cloud_job(f"vision-reroute-{i}"))["id"] for i in range(3)]
        done = [wait_for(j, is_("COMPLETED", "FAILED", "CANCELED"), 120) for j in burst["rerouted"]]
        assert all(d["status"] == "COMPLETED" for d in done), done
        regions = {d["placement"]["region"] for d in done if d["site"] == "cloud"}
        assert region not in regions, (region, regions)
        code, cap, err = s.cli("admin", "capacity")
        assert code == 0, err
        state = {r["region"]: r["circuit"] for r in cap["cloud"]["regions"]}
        failed = [e["reason"] for d in done for e in alice.events(d["id"])["events"] if e["to"] == "RETRYING"]
        code, out, err = s.cli("admin", *fault, "clear")
        assert code == 0, err
        return (
            f"{region}'s Batch API answers 503: {len(failed)} attempt(s) there failed "
            f"({failed[0][:50] if failed else 'none placed there'}…), the jobs COMPLETED in "
            f"{', '.join(sorted(regions)) or 'on-prem'}; circuits now {state}"
        )

    def cloud_sweep() -> str:
        spec = _yaml(EXAMPLES / "mnist-bundle.yaml")
        n = 8
        spec.update(
            name="mnist-cloud-sweep",
            code=str(EXAMPLES / "mnist"),
            command=["python3", "train.py", "--epochs", "{epochs}"],
            constraints={"placement": "cloud"},
            array={"parameters": [{"epochs": i + 1} for i in range(n)]},
        )
        for key in ("data", "secrets"):
            spec.pop(key, None)
        code, arr, err = s.cli("alice", "submit", "-f", spec_file("mnist-cloud-sweep.yaml", spec))
        assert code == 0 and arr["array"]["size"] == n, (code, arr, err)
        array_id = arr["id"]
        deadline = time.monotonic() + 150
        while True:
            counts = alice.get(array_id)["array"]["counts"]
            if sum(counts.get(k, 0) for k in ("COMPLETED", "FAILED", "CANCELED")) == n:
                break
            assert time.monotonic() < deadline, counts
            time.sleep(1)
        assert counts == {"COMPLETED": n}, counts
        tasks = [alice.get(f"{array_id}:{i}") for i in range(n)]
        assert all(t["site"] == "cloud" for t in tasks), [t["site"] for t in tasks]
        groups = {json.dumps(t["placement"].get("group"), sort_keys=True) for t in tasks}
        singles = sum(1 for t in tasks if t["placement"].get("group") is None)
        submits = len(groups - {"null"}) + singles
        assert submits < n, [t["placement"] for t in tasks]
        return (
            f"{n} tasks of ./mnist ran in the cloud as {submits} Batch SubmitJob(s) "
            f"(array jobs of the tasks each pass placed together); each task COMPLETED with its own logs"
        )

    def cloud_gang() -> str:
        code, job, err = s.cli("alice", "submit", "-f", str(EXAMPLES / "gang-cloud.yaml"))
        assert code == 0, f"exit {code}: {err} {job}"
        done = wait_for(job["id"], is_("COMPLETED", "FAILED", "CANCELED"), 150)
        assert done["status"] == "COMPLETED", done
        p = done["placement"]
        assert p["instances"] == 2 and not p["spot"], p
        lines = [e["message"] for e in alice.logs(done["id"])["events"]]
        heard = next((line for line in lines if "heard" in line), "")
        assert heard, lines[-5:]
        ids["gang"] = done["id"]
        deadline = time.monotonic() + 30  # rank 1's stream is named by its node's own Batch event
        rank1: list[str] = []
        while not rank1 and time.monotonic() < deadline:
            rank1 = [e["message"] for e in alice.logs(done["id"], rank=1)["events"]]
            time.sleep(0 if rank1 else 1)
        assert any("rank 1 of 2" in line for line in rank1), rank1
        return (
            f"{done['id']}: one Batch multi-node parallel job of {p['instances']} {p['instance_type']} "
            f"on-demand in {p['region']}; rank 0's log: {heard.strip()}; `berth logs --rank 1`: "
            f"{rank1[0].strip()}"
        )

    def locality_sim() -> str:
        cmd = [
            sys.executable,
            "-m",
            "berth_tools.cli.main",
            "sim",
            "--trace",
            str(ROOT / "examples" / "traces" / "tiresias-60.csv"),
            "--cluster",
            str(ROOT / "examples" / "clusters" / "small.yaml"),
            "--data-locality",
            "--output",
            "json",
        ]
        console.print(
            "  [dim]$ berth sim --trace examples/traces/tiresias-60.csv --cluster "
            "examples/clusters/small.yaml --data-locality -o json[/]"
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-400:]
        out = json.loads(proc.stdout)
        result = out[0] if isinstance(out, list) else out.get("results", [out])[0]
        loc = result["data_locality"]
        ratio = loc["with"]["second_job_staging_ratio_p50"]
        assert loc["bytes_saved"] > 0 and ratio <= 0.10, loc
        return (
            f"preferring hosts that cache a job's dataset staged {loc['bytes_saved_fraction']:.1%} fewer "
            f"bytes; a repeat job's staging took {ratio:.1%} of the first's (p50)"
        )

    def alarms_and_dashboard() -> str:
        import boto3

        session = boto3.session.Session(profile_name="admin")
        cw = session.client(
            "cloudwatch", endpoint_url=s.env["AWS_ENDPOINT_URL"], region_name=s.env["AWS_REGION"]
        )
        alarms = [a["AlarmName"] for a in cw.describe_alarms(AlarmNamePrefix="Berth-")["MetricAlarms"]]
        boards = [d["DashboardName"] for d in cw.list_dashboards()["DashboardEntries"]]
        assert len(alarms) >= 10 and "Berth-operations" in boards, (alarms, boards)
        return (
            f"{len(alarms)} alarms (e.g. {', '.join(sorted(alarms)[:3])}) and the dashboard Berth-operations"
        )

    def console_serves() -> str:
        import urllib.request

        from berth_tools.console.server import ConsoleInfo, ConsoleServer

        server = ConsoleServer(alice, ConsoleInfo(s.env["BERTH_API_URL"], "alice", s.env["AWS_REGION"]), 0)
        server.start()
        try:
            with urllib.request.urlopen(server.url, timeout=10) as page:
                html = page.read().decode()
            with urllib.request.urlopen(server.url + "api/v1/jobs?limit=100", timeout=30) as answer:
                jobs = json.loads(answer.read())["jobs"]
        finally:
            server.stop()
        assert "<html" in html.lower() and any(j["id"] == ids["alice"] for j in jobs), len(jobs)
        return (
            f"berth ui served the console and alice's {len(jobs)} jobs through it, signed with her "
            f"credentials; run `AWS_PROFILE=alice .venv/bin/berth ui` for {server.url} "
            "(screenshots of every page: docs/img/console-*.png)"
        )

    def where_and_cost() -> str:
        rows = []
        for key in ("alice", "full0", *burst["first"], *burst["rerouted"]):
            job = alice.get(ids.get(key, key))
            p = job.get("placement") or {}
            where = (
                f"{p.get('region')} {p.get('instance_type')}{' spot' if p.get('spot') else ''}"
                if job.get("site") == "cloud"
                else ", ".join(h["host_id"] for h in p.get("hosts", []))
            )
            rows.append((job["spec"]["name"], job["status"], job.get("site") or "-", where, job["cost_usd"]))
        table = Table("job", "status", "site", "where", "cost USD", title="where each job ran")
        for name, status, site, where, cost in rows:
            table.add_row(name, status, site, where, f"{cost:.4f}")
        console.print(table)
        for key in ("full0", "full1", "nlp_waits"):
            (s.client("bob") if key == "nlp_waits" else alice).cancel(ids[key])
        code, usage, err = s.cli("alice", "usage")
        assert code == 0, err
        cloud_rows = [r for r in rows if r[2] == "cloud"]
        assert cloud_rows and all(r[4] > 0 for r in cloud_rows), rows
        return (
            f"{len(cloud_rows)} cloud jobs cost {sum(r[4] for r in cloud_rows):.4f} USD; vision's usage this "
            f"month: {usage['total_cost_usd']:.4f} USD"
        )

    for title, fn in [
        ("alice submits an 8xV100 training job with the CLI", alice_submits),
        ("bob submits a 2xA100 fine-tuning job", bob_submits),
        ("each team sees only its own jobs", each_sees_own),
        ("an admin lists every team's jobs at once (berth ls --all-tenants)", admin_lists_every_team),
        ("bob cannot see alice's job", bob_cannot_read_alice),
        (
            "alice's job runs to completion on an on-prem host; its events reach EventBridge",
            runs_to_completion,
        ),
        ("bob's job reads an on-prem dataset and completes", bob_completes),
        (
            "berth status shows the last checkpoint; berth outputs fetches what the job wrote",
            outputs_and_checkpoint,
        ),
        ("berth logs -f follows a running job live; berth metrics shows its usage", logs_follow),
        ("an agent is killed mid-job: the job is retried and completes; the agent comes back", agent_killed),
        (
            "a GPU fails mid-job (XID 79): the job moves, using no attempt; an admin clears it",
            gpu_fault_moves_a_job,
        ),
        ("a running job is canceled: the host stops it", cancel_running),
        ("a failing job printed its secret: its reason is Berth's own words", failure_in_berths_words),
        ("the control plane is down past the host lease: a running job rides it out", outage_ridden_out),
        ("with the V100 hosts full, berth explain says why a job waits", waits_and_explains),
        ("a retried submit with the same Idempotency-Key is one job", idempotent_retry),
        ("alice cancels a queued job", cancel),
        ("a 50-task sweep: one submit, its progress, one bulk cancel", sweep),
        ("a dry run says where a job would go and what it would cost, and stores nothing", dry_run),
        ("a bad spec is refused with a clear message", bad_spec),
        ("a misspelt field is refused with a 'did you mean'", did_you_mean),
        ("a job no host or cloud offer could ever take is refused at submit", infeasible),
        ("a node too big for any host or instance is refused, naming the largest shape", shapes),
        ("berth capacity shows the fleet", capacity),
        ("an admin drains a host for maintenance, then lifts it", drain_host),
        ("requests without a SigV4 signature are refused", unsigned),
        ("quotas are an admin's business", quotas),
        ("alice submits a code-bundle job: the CLI uploads ./mnist once", code_bundle),
        ("another team cannot use vision's code, data or secrets", foreign_code_and_data),
        ("an admin lets team vision burst to the cloud", only_vision_bursts),
        ("on-prem V100s fill up: vision's jobs burst to AWS Batch, bob's wait on-prem", bursts_to_cloud),
        ("a region's Batch API goes down: jobs go to another region", region_outage),
        ("a cloud sweep of a code bundle runs as Batch array jobs", cloud_sweep),
        ("a 2-node cloud gang runs as one Batch multi-node parallel job", cloud_gang),
        ("berth sim: preferring hosts that cache the data stages fewer bytes", locality_sim),
        ("operators get alarms and a dashboard from the CDK app", alarms_and_dashboard),
        ("where each job ran and what it cost", where_and_cost),
        ("berth ui: the web console, signed with the user's own credentials", console_serves),
    ]:
        s.step(title, fn)


def _bus_events(env: dict[str, str], state_dir: Path, job_id: str, count: int) -> list[str]:
    """The state changes of ``job_id`` that reached the example rule's queue (JobEventsQueueUrl)."""
    import boto3

    outputs = json.loads((state_dir / "outputs.json").read_text())
    sqs = boto3.session.Session(profile_name="admin").client(
        "sqs", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"]
    )
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 15
    while len(seen) < count and time.monotonic() < deadline:
        got = sqs.receive_message(
            QueueUrl=outputs["JobEventsQueueUrl"], MaxNumberOfMessages=10, WaitTimeSeconds=1
        )
        for m in got.get("Messages", []):
            detail = json.loads(m["Body"])["detail"]
            if detail["job_id"] == job_id:
                seen[detail["seq"]] = detail["to"]
    return [seen[k] for k in sorted(seen)]


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


def main() -> int:
    state_dir = ROOT / ".berth" / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)
    proc, env = _start_local_cloud(state_dir)
    scenario = Scenario(env, state_dir)
    try:
        run(scenario)
    finally:
        stopped = launcher.stop(proc)
    scenario.results.append(("the local cloud stops cleanly on Ctrl-C", stopped == 0, f"exit {stopped}"))
    table = Table("step", "result", "detail", title="Berth demo")
    for title, ok, detail in scenario.results:
        table.add_row(title, "[green]ok[/]" if ok else "[red]FAILED[/]", escape(detail))
    console.print(table)
    failed = [t for t, ok, _ in scenario.results if not ok]
    if failed:
        console.print(f"[bold red]{len(failed)} step(s) failed[/]")
        return 1
    console.print(f"[bold green]all {len(scenario.results)} steps behaved[/]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
