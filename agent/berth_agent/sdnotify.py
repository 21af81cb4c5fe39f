"""A minimal ``sd_notify``: tell systemd READY=1, WATCHDOG=1, STOPPING=1, STATUS=... (no dependency).

The unit is ``Type=notify`` with ``WatchdogSec``: call ``ready()`` once registered, ``watchdog()``
at least every ``watchdog_interval_s()`` seconds (half of ``WatchdogSec``) from the main loop (so a
wedged loop gets the agent restarted), ``stopping()`` when draining starts. Outside systemd
(no ``$NOTIFY_SOCKET``) every call is a no-op returning False. The jobs never see the socket: their
environment is built from scratch (executors.base.job_environment).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``KEY=VALUE`` lines) to the service manager; False when not under systemd."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # vsock and other schemes: not used on an agent host
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
    return True


def ready(status: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    return notify("READY=1" + (f"\nSTATUS={status}" if status else ""), environ)


def watchdog(environ: Mapping[str, str] | None = None) -> bool:
    return notify("WATCHDOG=1", environ)


def stopping(status: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    return notify("STOPPING=1" + (f"\nSTATUS={status}" if status else ""), environ)


def status(text: str, environ: Mapping[str, str] | None = None) -> bool:
    return notify(f"STATUS={text}", environ)


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """How often to send WATCHDOG=1 (half the configured timeout), or None when no watchdog is set."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None
