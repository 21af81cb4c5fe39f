"""The state directory of `berth local up`: AWS profiles for the seeded users and the `env` file.

Layout (the brief's CLI contract):

    <state-dir>/aws/config        profiles alice, bob, admin (region, endpoint_url of moto)
    <state-dir>/aws/credentials   their access keys
    <state-dir>/env               shell exports: BERTH_API_URL, AWS_CONFIG_FILE,
                                  AWS_SHARED_CREDENTIALS_FILE, AWS_REGION, AWS_ENDPOINT_URL

Directories are 0700 and files 0600 (they hold secrets). Every file is written atomically (a temporary
file renamed into place), so a reader polling for `env` never sees half of it. `env` is written only
once the API answers and removed on shutdown, so a stale file never points at a dead server.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = Path(".berth/local")


@dataclass(frozen=True)
class Profile:
    name: str
    access_key_id: str
    secret_access_key: str


@dataclass(frozen=True)
class StateDir:
    root: Path

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

    def prepare(self) -> None:
        """Create the directories (0700) and drop a stale `env` left by a killed run."""
        for directory in (self.root, self.aws_dir):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o700)
        self.env_file.unlink(missing_ok=True)

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
            "AWS_CONFIG_FILE": str(self.config_file.resolve()),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.credentials_file.resolve()),
            "AWS_REGION": region,
            "AWS_ENDPOINT_URL": endpoint_url,
        }

    def write_env(self, exports: dict[str, str]) -> None:
        _write_private(self.env_file, render_exports(exports))

    def write_json(self, name: str, value: Any) -> None:
        """``outputs.json`` (the stack's outputs by name), ``agents.json`` (``{host_id, pid, gpus}``)."""
        _write_private(self.root / name, json.dumps(value, indent=2) + "\n")

    def remove_env(self) -> None:
        self.env_file.unlink(missing_ok=True)


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
