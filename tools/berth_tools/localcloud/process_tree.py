"""The processes below a process, read from /proc (Linux): what the local cloud stops on Ctrl-C.

A process is named by ``(pid, start time)`` so that a pid the kernel has since given to another
process is never signalled by mistake.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
                tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, now."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def identify(pids: list[int]) -> list[Proc]:
    """``(pid, start time)`` of those of `pids` that exist."""
    out = []
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            out.append((pid, int(fields[19])))
    return out


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` that exist and are not zombies."""
    return [pid for pid in pids if (fields := _stat(pid)) is not None and fields[0] != "Z"]


def still_running(procs: list[Proc]) -> list[Proc]:
    """Those of `procs` still running as the same process (same start time, not a zombie)."""
    return [
        (pid, start)
        for pid, start in procs
        if (fields := _stat(pid)) is not None and fields[0] != "Z" and int(fields[19]) == start
    ]


def kill(procs: list[Proc]) -> int:
    """SIGKILL each of `procs` that is still the same process; how many were signalled."""
    killed = 0
    for pid, _ in still_running(procs):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
