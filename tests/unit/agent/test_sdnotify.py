import os
import socket
from pathlib import Path

import pytest

from berth_agent import sdnotify


def _listen(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2)
    return sock


def test_messages_reach_the_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with _listen(path) as server:
        env = {"NOTIFY_SOCKET": path}
        assert sdnotify.ready("registered", environ=env)
        assert server.recv(4096) == b"READY=1\nSTATUS=registered"
        assert sdnotify.watchdog(environ=env)
        assert server.recv(4096) == b"WATCHDOG=1"
        assert sdnotify.stopping(environ=env)
        assert server.recv(4096) == b"STOPPING=1"
        assert sdnotify.status("2 jobs", environ=env)
        assert server.recv(4096) == b"STATUS=2 jobs"


def test_abstract_socket() -> None:
    name = f"berth-test-{os.getpid()}"
    with _listen("\0" + name) as server:
        assert sdnotify.watchdog(environ={"NOTIFY_SOCKET": "@" + name})
        assert server.recv(64) == b"WATCHDOG=1"


def test_outside_systemd_is_a_no_op() -> None:
    assert sdnotify.ready(environ={}) is False
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": "vsock:2:1"}) is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "x"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert sdnotify.watchdog_interval_s(env) == expected
