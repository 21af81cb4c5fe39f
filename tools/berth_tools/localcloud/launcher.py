"""`berth local up` as a child process, for tools that drive a whole local cloud (the demo,
`berth bench replay`): start it, wait for its env file, stop it with Ctrl-C as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from berth_tools.localcloud.state_dir import parse_exports


class LocalCloudNotReady(RuntimeError):
    """It exited, or did not write its env file in time (the message names its log)."""


def start(
    state_dir: Path,
    args: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 180.0,
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """Start `berth local up --state-dir STATE_DIR ARGS...`, output to ``log_path``; return the process
    and the exports of its env file once it is ready."""
    env_file = state_dir / "env"
    env_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "berth_tools.cli.main", "local", "up", "--state-dir", str(state_dir), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env={**os.environ, **(env or {})}
        )
    t0 = time.monotonic()
    while not env_file.exists():
        if proc.poll() is not None:
            raise LocalCloudNotReady(f"berth local up exited with {proc.returncode}; see {log_path}")
        if time.monotonic() - t0 > timeout_s:
            stop(proc)
            raise LocalCloudNotReady(f"berth local up was not ready after {timeout_s:.0f} s; see {log_path}")
        time.sleep(0.2)
    return proc, parse_exports(env_file.read_text())


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """Ctrl-C, then kill after ``timeout_s``; its exit status (-9 when killed)."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9
