"""memory_debug: the opt-in memory probes of `berth local up` (off unless BERTH_LOCAL_TRACEMALLOC is set)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
from berth_tools.localcloud import memory_debug

state = Path(sys.argv[1])
os.environ.pop(memory_debug.ENV, None)
assert memory_debug.install(state) is False and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
os.environ[memory_debug.ENV] = "5"
assert memory_debug.install(state) is True

class Node:
    pass

def snapshot(name):
    os.kill(os.getpid(), signal.SIGUSR2)
    for _ in range(200):
        found = sorted(state.glob("tracemalloc-*.snap"))
        if len(found) == name:
            return found[-1]
        time.sleep(0.05)
    raise SystemExit("no snapshot")

old = snapshot(1)
kept = [bytearray(1000) for _ in range(500)]
new = snapshot(2)
top = memory_debug.compare(old, new, limit=1).splitlines()[0]  # "+NNN.N KiB, +N blocks": the 500 KiB kept
assert float(top.split()[0]) > 450, top
for _ in range(50):  # cyclic garbage
    a, b = Node(), Node()
    a.b, b.a = b, a
del a, b
os.kill(os.getpid(), signal.SIGUSR1)
for _ in range(200):
    census = list(state.glob("gc-*.txt"))
    if census:
        break
    time.sleep(0.05)
text = census[0].read_text()
assert " Node" in text and "garbage since the last census" in text, text
print("ok")
"""


def test_snapshots_and_census_on_signals_only_when_asked(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.strip() == "ok"
