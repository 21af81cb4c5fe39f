"""Opt-in memory probes of the local cloud's own process (a debugging aid, off by default).

    BERTH_LOCAL_TRACEMALLOC=25 berth local up ...     # trace allocations, 25 frames each (slow: ~10x)
    kill -USR2 <pid of berth local up>                 # writes <state dir>/tracemalloc-<n>.snap
    kill -USR1 <pid of berth local up>                 # writes <state dir>/gc-<n>.txt (a gc census)

`BERTH_LOCAL_TRACEMALLOC=0` installs the census alone, without tracing (full speed). A census runs a full
collection that saves what it frees (`gc.DEBUG_SAVEALL`) and lists it by type: the cyclic garbage made
since the previous census, which reference counting never frees and which waits for the collector's
next full collection (rare in a process holding millions of long-lived objects).

`PYTHONTRACEMALLOC` would also trace every Lambda sandbox and agent the local cloud starts (they inherit
the environment); this variable is read by `berth local up` alone. Compare two snapshots with
`python -m berth_tools.localcloud.memory_debug OLD NEW [--limit 25]` (`Snapshot.compare_to(old,
"traceback")`, the largest growth first).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import threading
import tracemalloc
from pathlib import Path
from types import FrameType

ENV = "BERTH_LOCAL_TRACEMALLOC"
_counter = itertools.count(1)


def install(state_dir: Path) -> bool:
    """When `BERTH_LOCAL_TRACEMALLOC` is set (frames per traceback; 0: no tracing): trace, write a
    snapshot on each SIGUSR2 and a gc census on each SIGUSR1. True when it is set."""
    frames = os.environ.get(ENV, "").strip()
    if not frames:
        return False
    if int(frames) > 0:  # 0: the gc census (SIGUSR1) alone, at full speed
        tracemalloc.start(int(frames))

    def dump(signum: int, frame: FrameType | None) -> None:
        # Off the signal handler: taking a snapshot of a large heap takes seconds.
        # Written under a temporary name and renamed: a .snap file is always a whole one.
        path = state_dir / f"tracemalloc-{next(_counter)}.snap"
        threading.Thread(target=_dump, args=(path,), daemon=True).start()

    def census(signum: int, frame: FrameType | None) -> None:
        path = state_dir / f"gc-{next(_counter)}.txt"
        threading.Thread(target=_census, args=(path,), daemon=True).start()

    signal.signal(signal.SIGUSR2, dump)
    signal.signal(signal.SIGUSR1, census)
    return True


def _census(path: Path) -> None:
    """What a full collection frees (cyclic garbage since the last census), by type (SIGUSR1)."""
    import gc
    from collections import Counter

    lines = [f"enabled {gc.isenabled()} thresholds {gc.get_threshold()} counts {gc.get_count()}"]
    lines.append(f"frozen {gc.get_freeze_count()} traced before {tracemalloc.get_traced_memory()}")
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        collected = gc.collect()
        lines.append(f"collected {collected} traced after {tracemalloc.get_traced_memory()}")
        kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        size = sum(sys.getsizeof(o) for o in gc.garbage)  # shallow: buffers inside io objects not counted
        lines.append(f"garbage since the last census: {len(gc.garbage)} objects, {size / 1024:.1f} KiB")
        lines.extend(f"  {n:8d} {kind}" for kind, n in kinds.most_common(40))
        classes = Counter(o.__qualname__ for o in gc.garbage if isinstance(o, type))
        lines.extend(f"  class {n:6d} {name}" for name, n in classes.most_common(10))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()  # cycles still: collected again, now for good (not saved for the next census)
        gc.collect()
    partial = path.with_suffix(".part")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, path)


def _dump(path: Path) -> None:
    partial = path.with_suffix(".part")
    tracemalloc.take_snapshot().dump(str(partial))
    os.replace(partial, path)


def compare(old: Path, new: Path, limit: int = 25) -> str:
    """The `limit` largest differences of `new` over `old` by traceback, as text."""
    before = tracemalloc.Snapshot.load(str(old))
    after = tracemalloc.Snapshot.load(str(new))
    lines: list[str] = []
    for stat in after.compare_to(before, "traceback")[:limit]:
        lines.append(f"{stat.size_diff / 1024:+.1f} KiB, {stat.count_diff:+d} blocks")
        lines.extend(f"    {line}" for line in stat.traceback.format()[-12:])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Compare two tracemalloc snapshots of the local cloud.")
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--limit", type=int, default=25)
    args = parser.parse_args(argv)
    print(compare(args.old, args.new, args.limit))


if __name__ == "__main__":
    main()
