"""The state directory of `berth local up`: AWS profiles for the seeded users and the `env` file.

Layout (the brief's CLI contract):

    <state-dir>/aws/config        profiles alice, bob, admin, host-* (region, endpoint_url of moto)
    <state-dir>/aws/credentials   their access keys
    <state-dir>/env               shell exports: BERTH_API_URL, AWS_CONFIG_FILE,
                                  AWS_SHARED_CREDENTIALS_FILE, AWS_REGION, AWS_ENDPOINT_URL and
                                  BERTH_LOCAL_STATE_DIR (this directory, so `berth local fault` finds it)
    <state-dir>/outputs.json, agents.json, batch-stacks.json, agents/<host>/{config.yaml,agent.log}
    <state-dir>/jobs-root         the path of the run's job directory (below)
    <state-dir>/lock              held (flock) while a `berth local up` uses the directory

The root is resolved to an absolute path once, when the object is made: agents run in their own
directories and get absolute paths only. Directories are 0700 and files 0600 (they hold the admin's,
the tenants' and the hosts' keys). Every file is written atomically (a temporary file renamed into
place), so a reader polling for `env` never sees half of it. `env` is written only once the API
answers and removed on shutdown, so a stale file never points at a dead server.

What jobs touch lives outside it: the job root (``jobs_root``), a fresh ``berth-jobs-*`` directory
in the system temp dir holding the agents' work and cache dirs, the example datasets and local Batch's
work dirs. It is 0711 when jobs run under their own uids (the local cloud runs as root): a job may
pass through it to its own attempt directory (0700, its uid), never list it nor enter the state dir.

The emulator's state lives in memory and is not kept across a restart. `prepare` says so when it
finds an earlier run's files and removes what this run will not use, credentials first (the old keys,
then the old job root with its attempts' credential files), before fresh keys are written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = Path(".berth/local")
#: The env file's export naming the state dir (absolute), read by `berth local fault`.
STATE_DIR_ENV = "BERTH_LOCAL_STATE_DIR"
JOBS_ROOT_PREFIX = "berth-jobs-"
#: What an earlier `berth local up` wrote, removed in this order (credentials first). Anything else
#: in the directory is the user's and is left alone.
_PREVIOUS_RUN_FILES = (
    "aws/credentials",
    "aws/config",
    "jobs-root",  # (its target, the old job root, is removed right after the keys)
    "agents",  # configs and logs (and, before the job root existed, attempt dirs with credentials)
    "env",
    "outputs.json",
    "agents.json",
    "batch-stacks.json",
    "datasets",
)


class StateDirBusy(RuntimeError):
    """Another `berth local up` holds this state dir."""


@dataclass(frozen=True)
class Profile:
    name: str
    access_key_id: str
    secret_access_key: str


@dataclass(frozen=True)
class PreviousRun:
    """What `prepare` found of an earlier run and removed (paths relative to the state dir)."""

    root: Path
    removed: tuple[str, ...]
    not_removed: tuple[str, ...] = ()

    def describe(self) -> str:
        text = (
            f"{self.root} holds an earlier run's files. The emulator's state is not kept across a "
            "restart: jobs, events, logs, secrets, bundles, drains, quotas and keys start afresh. "
            f"Removed: {', '.join(self.removed)}; fresh keys follow."
        )
        if self.not_removed:
            text += f" Could not remove: {', '.join(self.not_removed)}."
        return text


def jobs_run_as_other_users() -> bool:
    """True when job processes get unprivileged uids of their own (the local cloud runs as root)."""
    return os.geteuid() == 0


@dataclass
class StateDir:
    root: Path
    _lock_fd: int | None = field(default=None, repr=False, compare=False)
    _jobs_root: Path | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    @property
    def aws_dir(self) -> Path:
        return self.root / "aws"

    @property
    def config_file(self) -> Path:
        return self.aws_dir / "config"

    @property
    def credentials_file(self) -> Path:
        return self.aws_dir / "credentials"

    @property
    def env_file(self) -> Path:
        return self.root / "env"

    @property
    def agents_dir(self) -> Path:
        return self.root / "agents"

    def prepare(self) -> PreviousRun | None:
        """Create the directories (0700), take the directory's lock (StateDirBusy when another run
        holds it) and clear an earlier run's files, credentials first; what was found, or None."""
        for directory in (self.root, self.aws_dir):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o700)
        self._lock()
        previous = self._clear_previous()
        for directory in (self.root, self.aws_dir, self.agents_dir):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o700)
        return previous

    def _lock(self) -> None:
        if self._lock_fd is not None:
            return
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(
                f"{self.root} is in use by another `berth local up` (stop it first, or pass another "
                "--state-dir)"
            ) from None
        self._lock_fd = fd

    def release(self) -> None:
        """Let another run take the directory (the lock also goes when this process exits)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _clear_previous(self) -> PreviousRun | None:
        found = [name for name in _PREVIOUS_RUN_FILES if os.path.lexists(self.root / name)]
        if not found:
            return None
        removed: list[str] = []
        failed: list[str] = []
        # A killed run leaves its agents behind (their own sessions): they would heartbeat with the
        # old keys forever. Only processes whose config lies in this state dir are stopped.
        for pid in stop_orphan_agents(self.agents_dir):
            removed.append(f"agent process {pid}")
        for name in found:
            path = self.root / name
            if name == "jobs-root":
                old = _recorded_jobs_root(path)
                if old is not None and old.exists():
                    (removed if _remove(old) else failed).append(str(old))
            (removed if _remove(path) else failed).append(name)
        return PreviousRun(self.root, tuple(removed), tuple(failed))

    def jobs_root(self) -> Path:
        """This run's job root (made on first use, recorded in ``jobs-root`` so a restart removes it)."""
        if self._jobs_root is None:
            root = Path(tempfile.mkdtemp(prefix=JOBS_ROOT_PREFIX))
            root.chmod(0o711 if jobs_run_as_other_users() else 0o700)
            _write_private(self.root / "jobs-root", f"{root}\n")
            self._jobs_root = root
        return self._jobs_root

    def remove_jobs_root(self) -> None:
        """On shutdown: the attempts' files (their credentials among them) go with the run."""
        if self._jobs_root is not None:
            _remove(self._jobs_root)
            (self.root / "jobs-root").unlink(missing_ok=True)
            self._jobs_root = None

    def write_profiles(self, profiles: Iterable[Profile], region: str, endpoint_url: str) -> None:
        config, credentials = [], []
        for profile in profiles:
            config += [
                f"[profile {profile.name}]",
                f"region = {region}",
                f"endpoint_url = {endpoint_url}",
                "",
            ]
            credentials += [
                f"[{profile.name}]",
                f"aws_access_key_id = {profile.access_key_id}",
                f"aws_secret_access_key = {profile.secret_access_key}",
                "",
            ]
        _write_private(self.config_file, "\n".join(config))
        _write_private(self.credentials_file, "\n".join(credentials))

    def exports(self, api_url: str, region: str, endpoint_url: str) -> dict[str, str]:
        return {
            "BERTH_API_URL": api_url,
            "AWS_CONFIG_FILE": str(self.config_file),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.credentials_file),
            "AWS_REGION": region,
            "AWS_ENDPOINT_URL": endpoint_url,
            STATE_DIR_ENV: str(self.root),
        }

    def write_env(self, exports: dict[str, str]) -> None:
        _write_private(self.env_file, render_exports(exports))

    def write_json(self, name: str, value: Any) -> None:
        """``outputs.json`` (the stack's outputs by name), ``agents.json`` (``{host_id, pid, gpus}``)."""
        _write_private(self.root / name, json.dumps(value, indent=2) + "\n")

    def remove_env(self) -> None:
        self.env_file.unlink(missing_ok=True)


def stop_orphan_agents(agents_dir: Path, timeout_s: float = 10.0) -> list[int]:
    """SIGTERM (then SIGKILL after ``timeout_s``) the agent processes an earlier run of this state dir
    left running: those ``agents.json`` lists whose environment names a config under ``agents_dir``."""
    try:
        listed = json.loads((agents_dir.parent / "agents.json").read_text())
    except (OSError, ValueError):
        return []
    pids = []
    for entry in listed if isinstance(listed, list) else []:
        pid = entry.get("pid") if isinstance(entry, dict) else None
        if isinstance(pid, int) and pid != os.getpid() and _agent_of(pid, agents_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while _agent_of(pid, agents_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _agent_of(pid, agents_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return pids


def _agent_of(pid: int, agents_dir: Path) -> bool:
    """Is ``pid`` a live (not zombie) agent whose BERTH_AGENT_CONFIG lies under ``agents_dir``?"""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    prefix = f"BERTH_AGENT_CONFIG={agents_dir}{os.sep}".encode()
    return state != "Z" and any(item.startswith(prefix) for item in environ)


def _recorded_jobs_root(marker: Path) -> Path | None:
    """The job root an earlier run recorded, if it is one (a ``berth-jobs-*`` directory, not a link)."""
    try:
        path = Path(marker.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None
    if not path.is_absolute() or not path.name.startswith(JOBS_ROOT_PREFIX) or path.is_symlink():
        return None
    return path


def _remove(path: Path) -> bool:
    """Remove a file or a tree (never following links out of it); False when some of it stayed."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            # job dirs were 0500/0700 and owned by job uids: make them writable before removing
            for dirpath, dirnames, _files in os.walk(path):
                for name in dirnames:
                    with contextlib.suppress(OSError):
                        sub = os.path.join(dirpath, name)
                        if not os.path.islink(sub):
                            os.chmod(sub, stat.S_IRWXU)
            shutil.rmtree(path)
    except OSError:
        return not os.path.lexists(path)
    return True


def render_exports(exports: dict[str, str]) -> str:
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in exports.items())


def parse_exports(text: str) -> dict[str, str]:
    """Read back a file written by `render_exports` (shell quoting included)."""
    values = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            values[key] = value
    return values


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def locate(explicit: Path | None, environ: dict[str, str] | None = None) -> Path:
    """The running local cloud's state dir for commands that need one (`berth local fault`):
    ``--state-dir``, else ``$BERTH_LOCAL_STATE_DIR`` (set by sourcing its env file), else
    ``.berth/local`` here, else ``.berth/local`` at the top of the repository."""
    if explicit is not None:
        return Path(explicit).resolve()
    env = os.environ if environ is None else environ
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV])
    here = DEFAULT_STATE_DIR.resolve()
    if (here / "env").is_file():
        return here
    from berth_tools.localcloud.cli import find_repo_root

    root = find_repo_root()
    if root is not None and (root / DEFAULT_STATE_DIR / "env").is_file():
        return root / DEFAULT_STATE_DIR
    return here
