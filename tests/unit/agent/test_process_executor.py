"""The process executor with real processes: env isolation, GPUs, output, cancel, timeout, limits."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from berth_agent.executors import FailureKind, Launch, Limits, ProcessExecutor, Rendezvous, StartError
from berth_agent.executors.base import classify


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, stream: str, line: str) -> None:
        with self.lock:
            self.lines.append((stream, line))

    def of(self, stream: str) -> list[str]:
        return [text for s, text in self.lines if s == stream]


def _launch(tmp_path: Path, *command: str, **kw: object) -> Launch:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return Launch(job_id="j-1", attempt=2, tenant="vision", command=command, workdir=work, **kw)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_environment_is_only_the_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "agent-secret")
    monkeypatch.setenv("AGENT_ONLY", "x")
    out = Lines()
    launch = _launch(
        tmp_path,
        "/usr/bin/env",
        env={"EPOCHS": "3", "LD_PRELOAD": "/evil.so", "AWS_PROFILE": "agent"},
        secrets={"WANDB_KEY": "s3cret"},
        credentials={"AWS_ACCESS_KEY_ID": "ASIAJOB", "AWS_SECRET_ACCESS_KEY": "job-secret"},
        gpu_uuids=("GPU-a", "GPU-b"),
        output_dir=tmp_path,
        rendezvous=Rendezvous("10.0.0.1", 29500, 2, 1),
    )
    result = ProcessExecutor().start(launch, out).wait(10)
    assert result is not None and result.succeeded
    env = dict(line.split("=", 1) for line in out.of("stdout"))
    assert env["EPOCHS"] == "3" and env["WANDB_KEY"] == "s3cret"
    assert env["AWS_SECRET_ACCESS_KEY"] == "job-secret" and env["AWS_ACCESS_KEY_ID"] == "ASIAJOB"
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["BERTH_JOB_ID"] == "j-1" and env["BERTH_ATTEMPT"] == "2"
    assert env["BERTH_OUTPUT_DIR"] == str(tmp_path) and env["HOME"] == str(launch.workdir)
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"]) == (
        "10.0.0.1",
        "2",
        "1",
        "1",
    )
    assert "AGENT_ONLY" not in env and "LD_PRELOAD" not in env and "AWS_PROFILE" not in env
    assert env["PATH"].startswith("/usr/local/sbin")


def test_no_gpus_hides_all(tmp_path: Path) -> None:
    out = Lines()
    ProcessExecutor().start(_launch(tmp_path, "/usr/bin/env"), out).wait(10)
    env = dict(line.split("=", 1) for line in out.of("stdout"))
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_credentials_only_accept_credential_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="AWS_PROFILE"):
        ProcessExecutor().start(_launch(tmp_path, "true", credentials={"AWS_PROFILE": "x"}), Lines())


def test_cwd_own_session_and_exit_code(tmp_path: Path) -> None:
    out = Lines()
    script = "import os; print(os.getcwd()); print(os.getsid(0) == os.getpid()); raise SystemExit(3)"
    result = ProcessExecutor().start(_launch(tmp_path, sys.executable, "-c", script), out).wait(10)
    assert out.of("stdout") == [str(tmp_path / "work"), "True"]
    assert result is not None and result.exit_code == 3 and result.failure is FailureKind.NONZERO_EXIT


def test_stdout_and_stderr_in_order_per_stream(tmp_path: Path) -> None:
    out = Lines()
    script = "import sys\nfor i in range(5000):\n print(i)\n print('e', i, file=sys.stderr)"
    ProcessExecutor().start(_launch(tmp_path, sys.executable, "-c", script), out).wait(20)
    assert out.of("stdout") == [str(i) for i in range(5000)]
    assert out.of("stderr") == [f"e {i}" for i in range(5000)]


def test_long_line_is_split_not_buffered(tmp_path: Path) -> None:
    out = Lines()
    script = "import sys; sys.stdout.write('x' * 200000 + '\\n')"
    ProcessExecutor().start(_launch(tmp_path, sys.executable, "-c", script), out).wait(10)
    pieces = out.of("stdout")
    assert "".join(pieces) == "x" * 200000 and max(map(len, pieces)) <= 64 * 1024


def test_cancel_kills_the_whole_group_after_grace(tmp_path: Path) -> None:
    out = Lines()
    # The parent ignores SIGTERM, a child in the same group sleeps: both must be gone after the grace.
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen(['sleep', '300'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    handle = ProcessExecutor().start(_launch(tmp_path, sys.executable, "-c", script), out)
    deadline = time.monotonic() + 10
    while not out.of("stdout") and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(out.of("stdout")[0])
    t0 = time.monotonic()
    handle.cancel(grace_s=0.5)
    assert handle.poll() is None  # cancel does not block
    result = handle.wait(10)
    assert result is not None and result.failure is FailureKind.CANCELED
    assert 0.4 < time.monotonic() - t0 < 5
    assert handle.pid is not None and not _alive(handle.pid)
    gone_by = time.monotonic() + 3  # SIGKILL is delivered asynchronously to the orphaned child
    while _alive(child) and time.monotonic() < gone_by:
        time.sleep(0.02)
    assert not _alive(child)


def test_graceful_sigterm_lets_the_job_exit(tmp_path: Path) -> None:
    out = Lines()
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('saving', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\ntime.sleep(300)\n"
    )
    handle = ProcessExecutor().start(_launch(tmp_path, sys.executable, "-c", script), out)
    deadline = time.monotonic() + 10
    while "up" not in out.of("stdout") and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # let print('up') return: a handler printing inside it hits a reentrant-write error
    handle.cancel(grace_s=30)
    result = handle.wait(20)
    assert result is not None and result.failure is FailureKind.CANCELED, (result, out.lines)
    assert "saving" in out.of("stdout"), out.lines


def test_wall_clock_timeout(tmp_path: Path) -> None:
    handle = ProcessExecutor(timeout_grace_s=0.2).start(
        _launch(tmp_path, "sleep", "30", timeout_s=0.3), Lines()
    )
    result = handle.wait(10)
    assert result is not None and result.failure is FailureKind.TIMEOUT


def test_rlimits_apply_in_the_child(tmp_path: Path) -> None:
    out = Lines()
    script = "import resource as r; print(r.getrlimit(r.RLIMIT_NOFILE)[0], r.getrlimit(r.RLIMIT_CPU)[0])"
    limits = Limits(nofile=256, cpu_seconds=77)
    ProcessExecutor().start(_launch(tmp_path, sys.executable, "-c", script, limits=limits), out).wait(10)
    assert out.of("stdout") == ["256 77"]


def test_address_space_limit_turns_into_oom(tmp_path: Path) -> None:
    script = "b = bytearray(512 * 1024 * 1024)"
    launch = _launch(tmp_path, sys.executable, "-c", script, limits=Limits(address_space_bytes=256 * 1024**2))
    result = ProcessExecutor().start(launch, Lines()).wait(20)
    assert result is not None and result.failure is FailureKind.OOM


def test_sigkill_from_outside_is_oom_and_missing_command_cannot_start(tmp_path: Path) -> None:
    handle = ProcessExecutor().start(_launch(tmp_path, "sleep", "30"), Lines())
    assert handle.pid is not None
    os.kill(handle.pid, signal.SIGKILL)
    result = handle.wait(10)
    assert result is not None and result.failure is FailureKind.OOM
    with pytest.raises(StartError):
        ProcessExecutor().start(_launch(tmp_path, "/nonexistent/cmd"), Lines())


def test_a_raising_sink_does_not_stall_the_job(tmp_path: Path) -> None:
    def sink(stream: str, line: str) -> None:
        raise RuntimeError("sink down")

    result = ProcessExecutor().start(_launch(tmp_path, "seq", "1000"), sink).wait(10)
    assert result is not None and result.succeeded


def test_classify_rules() -> None:
    assert (
        classify(
            1, canceled=False, timed_out=False, stderr_tail=["torch.OutOfMemoryError: CUDA out of memory"]
        ).failure
        is FailureKind.OOM
    )
    assert (
        classify(
            125, canceled=False, timed_out=False, stderr_tail=["Unable to find image 'x'"], container=True
        ).failure
        is FailureKind.BAD_IMAGE
    )
    assert (
        classify(125, canceled=False, timed_out=False, stderr_tail=["daemon error"], container=True).failure
        is FailureKind.AGENT_ERROR
    )
    assert (
        classify(137, canceled=False, timed_out=False, stderr_tail=[], container=True).failure
        is FailureKind.OOM
    )
    assert classify(-15, canceled=True, timed_out=False, stderr_tail=[]).failure is FailureKind.CANCELED
    assert (
        classify(-11, canceled=False, timed_out=False, stderr_tail=[]).message
        == "killed by signal 11 (SIGSEGV)"
    )
    assert classify(0, canceled=False, timed_out=False, stderr_tail=["warn"]).succeeded


@pytest.mark.parametrize(
    ("code", "container", "tail_line", "kind", "message"),
    [
        (3, False, "Error: token=hunter2-s3cr3t rejected", FailureKind.NONZERO_EXIT, "exited with code 3"),
        (
            1,
            False,
            "CUDA out of memory; token=hunter2-s3cr3t",
            FailureKind.OOM,
            "out of memory: the job said so (exited with code 1)",
        ),
        (
            125,
            True,
            "Unable to find image hunter2-s3cr3t",
            FailureKind.BAD_IMAGE,
            "the image could not be pulled (exited with code 125)",
        ),
        (
            125,
            True,
            "hunter2-s3cr3t",
            FailureKind.AGENT_ERROR,
            "the container runtime failed (exited with code 125)",
        ),
        (
            137,
            True,
            "hunter2-s3cr3t",
            FailureKind.OOM,
            "out of memory (exited with code 137 (128 + SIGKILL))",
        ),
        (-6, False, "hunter2-s3cr3t", FailureKind.NONZERO_EXIT, "killed by signal 6 (SIGABRT)"),
    ],
)
def test_the_message_is_berths_words_never_the_jobs_output(
    code: int, container: bool, tail_line: str, kind: FailureKind, message: str
) -> None:
    result = classify(
        code, canceled=False, timed_out=False, stderr_tail=["before", tail_line], container=container
    )
    assert result.failure is kind and result.message == message
    assert "hunter2" not in result.message


def test_rendezvous_checks() -> None:
    with pytest.raises(ValueError):
        Rendezvous("a", 29500, 2, 2)
    with pytest.raises(ValueError):
        Rendezvous("a", 0, 2, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a job its own uid needs root")
def test_each_job_gets_its_own_uid_and_private_dirs() -> None:
    import tempfile

    from berth_agent.executors import Mount, UidPool
    from berth_agent.staging import JobDirs

    # pytest's tmp dirs are 0700 root: a work dir like the agent's must be traversable (0711).
    tmp_path = Path(tempfile.mkdtemp(prefix="berth-agent-test-"))
    tmp_path.chmod(0o711)
    pool = UidPool(range(3_000_100, 3_000_102))
    ex = ProcessExecutor(uids=pool)
    a, b = JobDirs.create(tmp_path, "ja", 1), JobDirs.create(tmp_path, "jb", 1)
    (b.work / "secret.txt").write_text("b's data")
    out_a, out_b = Lines(), Lines()
    # b holds its uid while a runs and tries to read b's files
    hb = ex.start(
        Launch("jb", 1, "t", ("sleep", "5"), b.work, output_dir=b.outputs, checkpoint_dir=b.checkpoints),
        out_b,
    )
    staged = a.base / "data" / "0"
    staged.mkdir(parents=True)
    (staged / "x.bin").write_text("cached")
    (staged / "x.bin").chmod(0o444)
    script = f"id -u; id -G; cat {b.work}/secret.txt; ls {b.base}; touch {a.outputs}/ok; cat data/x/x.bin"
    la = Launch(
        "ja",
        1,
        "t",
        ("/bin/sh", "-c", script),
        a.work,
        output_dir=a.outputs,
        mounts=(Mount(staged, "/data/x"),),
    )
    result = ex.start(la, out_a).wait(10)
    assert result is not None and result.succeeded  # the last command (touch in its own dir) worked
    assert out_a.of("stdout")[:2] == ["3000101", "3000101"]
    assert sum("Permission denied" in line for line in out_a.of("stderr")) == 2  # cat and ls
    assert "b's data" not in out_a.of("stdout")
    assert (a.outputs / "ok").stat().st_uid == 3000101
    assert out_a.of("stdout")[-1] == "cached"
    assert (
        staged.stat().st_uid == 3000101 and (staged / "x.bin").stat().st_uid == 0
    )  # the file stays the cache's
    assert (b.work / "secret.txt").stat().st_uid == 3000100 and b.work.stat().st_mode & 0o777 == 0o700
    hb.cancel(0)
    hb.wait(10)
    assert sorted(pool._free) == [3_000_100, 3_000_101]  # both uids back
    a.remove()
    b.remove()
    assert not a.base.exists()
    tmp_path.rmdir()


def test_mounts_appear_under_the_workdir(tmp_path: Path) -> None:
    from berth_agent.executors import Mount

    src = tmp_path / "dataset"
    src.mkdir()
    (src / "a.txt").write_text("A")
    out = Lines()
    launch = _launch(tmp_path, "cat", "data/train/a.txt", mounts=(Mount(src, "/data/train"),))
    result = ProcessExecutor().start(launch, out).wait(10)
    assert result is not None and result.succeeded and out.of("stdout") == ["A"]
    with pytest.raises(StartError):  # a second launch into the same dir would collide
        ProcessExecutor().start(launch, Lines())
    with pytest.raises(StartError):
        ProcessExecutor().start(_launch(tmp_path, "true", mounts=(Mount(src, "/"),)), Lines())


def test_rlimits_are_capped_at_the_agents_hard_limit(tmp_path: Path) -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limits = ProcessExecutor().rlimits(_launch(tmp_path, "true", limits=Limits(nofile=10**9)))
    assert limits[resource.RLIMIT_NOFILE] == (10**9 if hard == resource.RLIM_INFINITY else hard)


def test_a_failing_child_setup_is_a_start_error(tmp_path: Path) -> None:
    import resource

    from berth_agent.executors.process import ProcessRun

    # RLIMIT_NOFILE above fs.nr_open fails in the child even for root
    with pytest.raises(StartError) as e:
        ProcessRun(
            ["true"],
            env={},
            cwd=tmp_path,
            on_line=Lines(),
            timeout_s=None,
            timeout_grace_s=1,
            rlimits={resource.RLIMIT_NOFILE: 10**9},
        )
    assert e.value.failure is FailureKind.AGENT_ERROR
    with pytest.raises(StartError) as e:
        ProcessExecutor().start(Launch("j", 1, "t", ("true",), tmp_path / "absent-dir"), Lines())
    assert e.value.failure is FailureKind.STAGING
