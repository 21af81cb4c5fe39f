"""systemd's part for the local cloud's real agents: an agent that dies is started again.

On a host, ``berth-agent.service`` (agent/packaging) restarts the agent when it fails
(``Restart=on-failure``), not when it exits 0 (a drained stop) or 2 (its configuration is wrong,
``RestartPreventExitStatus=2``), and gives up when it fails ``START_LIMIT_BURST`` times within
``START_LIMIT_INTERVAL_S`` (systemd's defaults). `AgentSupervisor` does the same for the agents of
`berth local up`, with the local cloud's compressed ``RestartSec``: a crashed agent, an agent SIGKILLed
by ``berth local fault agent-kill`` or by anything else comes back and re-adopts or reports its jobs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

#: Exit codes after which systemd does not restart the agent: 0 (it stopped as asked) and 2 (a
#: configuration error, which a restart would only repeat).
NO_RESTART_EXIT_CODES = frozenset({0, 2})
START_LIMIT_BURST = 5
START_LIMIT_INTERVAL_S = 10.0
POLL_S = 0.25


class Supervised(Protocol):
    host_id: str

    def exit_code(self) -> int | None:
        """None while it runs (or before it was started), else its exit code (-N: killed by signal N)."""

    def start(self) -> object: ...


@dataclass
class AgentSupervisor:
    """Restarts failed agents `restart_s` after they died. `agents()` is the current list, read under
    `lock`, which `stop()` of the local cloud also takes before it sets `stopping`; `on_restart(agent)`
    runs under the lock after each restart (the local cloud rewrites agents.json)."""

    agents: Callable[[], list[Supervised]]
    lock: threading.Lock
    stopping: threading.Event
    restart_s: float
    say: Callable[[str], None]
    on_restart: Callable[[Supervised], None] = lambda agent: None
    clock: Callable[[], float] = time.monotonic
    _died_at: dict[int, float] = field(default_factory=dict)
    _starts: dict[str, deque[float]] = field(default_factory=dict)
    _given_up: set[str] = field(default_factory=set)
    _thread: threading.Thread | None = None

    def start(self) -> AgentSupervisor:
        self._thread = threading.Thread(target=self._run, name="agent-supervisor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(POLL_S):
            self.check()

    def check(self) -> list[str]:
        """One look at every agent: restart those that failed long enough ago. The hosts restarted."""
        restarted: list[str] = []
        with self.lock:
            if self.stopping.is_set():
                return restarted
            for agent in self.agents():
                if self._due(agent):
                    code = agent.exit_code()
                    agent.start()
                    self._died_at.pop(id(agent), None)
                    self.on_restart(agent)
                    restarted.append(agent.host_id)
                    self.say(f"agent {agent.host_id} restarted after it exited with {code}")
        return restarted

    def _due(self, agent: Supervised) -> bool:
        code = agent.exit_code()
        if code is None or code in NO_RESTART_EXIT_CODES or agent.host_id in self._given_up:
            self._died_at.pop(id(agent), None)
            return False
        now = self.clock()
        died = self._died_at.setdefault(id(agent), now)
        if now - died < self.restart_s:
            return False
        starts = self._starts.setdefault(agent.host_id, deque(maxlen=START_LIMIT_BURST))
        if len(starts) == START_LIMIT_BURST and now - starts[0] < START_LIMIT_INTERVAL_S:
            self._given_up.add(agent.host_id)
            self.say(
                f"agent {agent.host_id} failed {START_LIMIT_BURST} times within "
                f"{START_LIMIT_INTERVAL_S:.0f} s (last exit {code}): not restarted again; see its agent.log"
            )
            return False
        starts.append(now)
        return True
