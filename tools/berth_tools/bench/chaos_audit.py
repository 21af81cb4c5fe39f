"""What `berth bench chaos` counts, from the jobs' own records rather than Berth's.

Every chaos job runs `JOB_SCRIPT`: each run (one process of one attempt, wherever it runs: an agent's
host or the local Batch) appends JSON lines to a file of its own in the run's records directory,
`<job>.<attempt>.<pid>`: `start` (with its GPUs, `CUDA_VISIBLE_DEVICES`), a `tick` every
`TICK_S`, and `end` when it finishes its work. A job asked to (`DETACH=1`) first leaves a detached
grandchild behind (`setsid` and a double fork, as a daemonising tool does) that records its pid
(`child`) and sleeps: it must die with its job.

From those files:

- **run twice at once**: two runs of one job whose lives (`start` to last tick or `end`) overlap
  by more than a tick;
- **GPUs double-booked**: two runs of different jobs on one GPU (simulated GPU ids name their host)
  whose lives overlap;
- **orphans**: processes a run recorded (`start` and `child` pids) still alive once every job has
  ended and the settle time has passed (checked against the run's marker in `/proc/<pid>/environ`,
  so a reused pid is not counted);
- **completed without a finished run**: a job Berth says COMPLETED with no run that wrote `end`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICK_S = 0.5

JOB_SCRIPT = r"""
import json, os, time
d, run_s = os.environ["CHAOS_DIR"], float(os.environ["RUN_S"])
name = "%s.%s.%d" % (os.environ.get("BERTH_JOB_ID", "x"), os.environ.get("BERTH_ATTEMPT", "0"), os.getpid())
fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
def note(kind, **kw):
    os.write(fd, (json.dumps({"k": kind, "t": time.time(), **kw}) + "\n").encode())
note("start", pid=os.getpid(), gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
if os.environ.get("DETACH") == "1":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            note("child", pid=os.getpid())
            time.sleep(float(os.environ.get("DETACH_S", "900")))
            os._exit(0)
        os._exit(0)
    os.wait()
end = time.time() + run_s
while time.time() < end:
    time.sleep(TICK)
    note("tick")
note("end")
""".replace("TICK", repr(TICK_S))


@dataclass
class Run:
    job_id: str
    attempt: int
    pid: int
    start: float
    last: float
    ended: bool = False
    gpus: tuple[str, ...] = ()
    children: list[int] = field(default_factory=list)

    def overlaps(self, other: Run, slack_s: float = TICK_S) -> bool:
        return self.start < other.last - slack_s and other.start < self.last - slack_s


def parse_run(path: Path) -> Run | None:
    """One run's record file, or None when it has no `start` (a run killed before its first line)."""
    job_id, _, rest = path.name.partition(".")
    attempt, _, pid = rest.partition(".")
    run: Run | None = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        kind, at = rec.get("k"), float(rec.get("t", 0))
        if kind == "start":
            gpus = tuple(g for g in str(rec.get("gpus", "")).split(",") if g)
            run = Run(job_id, int(attempt or 0), int(pid or 0), at, at, gpus=gpus)
        elif run is None:
            continue
        elif kind == "child":
            run.children.append(int(rec["pid"]))
        else:
            run.last = max(run.last, at)
            run.ended = run.ended or kind == "end"
    return run


def read_runs(records: Path) -> list[Run]:
    runs = (parse_run(p) for p in sorted(records.iterdir()) if p.is_file())
    return [r for r in runs if r is not None]


def twice_at_once(runs: Iterable[Run]) -> list[tuple[str, int, int]]:
    """(job, attempt a, attempt b) for every pair of one job's runs that lived at the same time."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    found = []
    for job_id, mine in by_job.items():
        mine.sort(key=lambda r: r.start)
        for i, a in enumerate(mine):
            found += [(job_id, a.attempt, b.attempt) for b in mine[i + 1 :] if a.overlaps(b)]
    return found


def double_booked(runs: Iterable[Run]) -> list[tuple[str, str, str]]:
    """(GPU, job a, job b) for every GPU two different jobs' runs held at the same time."""
    by_gpu: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        for gpu in run.gpus:
            by_gpu[gpu].append(run)
    found = []
    for gpu, users in by_gpu.items():
        users.sort(key=lambda r: r.start)
        for i, a in enumerate(users):
            found += [
                (gpu, a.job_id, b.job_id) for b in users[i + 1 :] if b.job_id != a.job_id and a.overlaps(b)
            ]
    return found


def _carries(pid: int, marker: str) -> bool:
    """Whether process ``pid`` is alive and has ``marker`` (``NAME=value``) in its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z" and marker.encode() in environ


def orphans(runs: Iterable[Run], marker: str) -> list[int]:
    """Pids recorded by the runs that are still alive with the run's marker in their environment."""
    pids = {p for run in runs for p in (run.pid, *run.children)}
    return sorted(p for p in pids if _carries(p, marker))


def kill(pids: Iterable[int]) -> None:
    """The bench's own clean-up of what it found (after counting it)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def audit(records: Path, marker: str, final: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures, from the runs' records and each job's final state (``final[job_id]``)."""
    runs = read_runs(records)
    finished = {r.job_id for r in runs if r.ended}
    completed = [j for j, job in final.items() if job.get("status") == "COMPLETED"]
    twice = twice_at_once(runs)
    booked = double_booked(runs)
    left = orphans(runs, marker)
    owner = {
        p: (r.job_id, r.attempt, "main" if p == r.pid else "detached")
        for r in runs
        for p in (r.pid, *r.children)
    }
    return {
        "runs": len(runs),
        "run_twice_at_once": len(twice),
        "run_twice_examples": [list(x) for x in twice[:5]],
        "gpus_double_booked": len(booked),
        "double_booked_examples": [list(x) for x in booked[:5]],
        "orphan_processes": len(left),
        "orphan_pids": left[:20],
        "orphan_examples": [[p, *owner[p], final.get(owner[p][0], {}).get("site")] for p in left[:5]],
        "completed_without_a_finished_run": sorted(set(completed) - finished)[:20],
    }
