"""The local cloud's agent supervisor restarts agents as berth-agent.service's systemd settings do."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from berth_tools.localcloud.agent_supervisor import (
    START_LIMIT_BURST,
    START_LIMIT_INTERVAL_S,
    AgentSupervisor,
)


@dataclass
class FakeAgent:
    host_id: str
    code: int | None = None
    starts: int = 0

    def exit_code(self) -> int | None:
        return self.code

    def start(self) -> FakeAgent:
        self.starts += 1
        self.code = None
        return self


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    agents: list[FakeAgent]
    clock: Clock = field(default_factory=Clock)
    said: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def supervisor(self) -> AgentSupervisor:
        return AgentSupervisor(
            agents=lambda: list(self.agents),
            lock=threading.Lock(),
            stopping=self.stopping,
            restart_s=1.0,
            say=self.said.append,
            on_restart=lambda agent: self.restarted.append(agent.host_id),
            clock=self.clock,
        )


def test_a_killed_agent_is_restarted_once_its_restart_delay_has_passed() -> None:
    a, b = FakeAgent("a"), FakeAgent("b")
    rig = Rig([a, b])
    sup = rig.supervisor()
    assert sup.check() == []
    a.code = -9
    assert sup.check() == []  # it just died: RestartSec has not passed
    rig.clock.now += 0.5
    assert sup.check() == []
    rig.clock.now += 0.6
    assert sup.check() == ["a"]
    assert (a.starts, b.starts) == (1, 0)
    assert rig.restarted == ["a"]
    assert "agent a restarted after it exited with -9" in rig.said
    assert sup.check() == []  # running again: nothing more


def test_a_clean_stop_and_a_configuration_error_are_not_restarted() -> None:
    ok, bad_config = FakeAgent("ok", code=0), FakeAgent("cfg", code=2)
    rig = Rig([ok, bad_config])
    sup = rig.supervisor()
    sup.check()
    rig.clock.now += 60
    assert sup.check() == []
    assert ok.starts == bad_config.starts == 0


def test_nothing_is_restarted_once_the_local_cloud_is_stopping() -> None:
    a = FakeAgent("a", code=1)
    rig = Rig([a])
    sup = rig.supervisor()
    sup.check()
    rig.stopping.set()
    rig.clock.now += 5
    assert sup.check() == []
    assert a.starts == 0


def test_an_agent_failing_in_a_loop_is_given_up_as_systemd_start_limits_do() -> None:
    a = FakeAgent("a")
    rig = Rig([a])
    sup = rig.supervisor()
    for _ in range(START_LIMIT_BURST):
        a.code = 1
        sup.check()
        rig.clock.now += 1.1
        assert sup.check() == ["a"]
    a.code = 1
    sup.check()
    rig.clock.now += 1.1
    assert sup.check() == []  # a sixth start within the interval: given up
    assert a.starts == START_LIMIT_BURST
    assert any("not restarted again" in line for line in rig.said)
    rig.clock.now += START_LIMIT_INTERVAL_S
    assert sup.check() == []  # and it stays given up


def test_failures_spread_over_time_keep_being_restarted() -> None:
    a = FakeAgent("a")
    rig = Rig([a])
    sup = rig.supervisor()
    for _ in range(START_LIMIT_BURST * 2):
        a.code = -9
        sup.check()
        rig.clock.now += START_LIMIT_INTERVAL_S / 2
        assert sup.check() == ["a"]
    assert a.starts == START_LIMIT_BURST * 2
