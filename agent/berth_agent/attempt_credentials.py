"""An attempt's STS credentials over a long job: refreshed before they expire, for the agent and the job.

The agent API vends an attempt's credentials for at most an hour, and never longer than what is
left of its time limit (``Expiration`` in the answer of ``POST /v1/agent/credentials``). A job may run
for days, so:

- ``AttemptCredentials`` holds the current set. The runner calls ``maybe_refresh()`` every
  supervision tick; once ``min(10 min, half the lifetime)`` before ``Expiration`` it asks the agent
  API again (same attempt, same fencing token) and hands the new set to ``on_refresh``: the runner
  rebuilds its ``AttemptIO`` (so output sync and the log shipper, through ``LogShipper.set_client``,
  use the new set) and rewrites the job's file. A failed refresh is retried every ``retry_s`` and
  the old set is kept meanwhile; ``Fenced`` is raised (the attempt is no longer this host's).
- The job (process executor) gets them through the AWS SDKs' ``credential_process``:
  ``AWS_CONFIG_FILE`` names ``<work>/.aws/config`` whose default profile runs
  ``cat <work>/.aws/credentials.json``, a JSON document with ``Version: 1`` and ``Expiration``. The
  SDKs (botocore, the AWS CLI, the Java, Go and JavaScript SDKs) treat such credentials as
  refreshable: from 15 minutes before ``Expiration`` they run the process again and pick up the set
  the agent wrote meanwhile, with no restart of the job. No ``AWS_ACCESS_KEY_ID`` is put in the
  job's environment, since the SDKs would prefer it and never refresh. Container and Kubernetes
  jobs still get the first set as ``AWS_*`` variables (their paths differ; docs/agent.md).

``CredentialsFile`` writes through directory file descriptors opened with ``O_NOFOLLOW`` and
replaces the file atomically, so a job (which owns its work dir) cannot turn the agent's write into
a write elsewhere by planting a symbolic link; the files are given to the directory's owner.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from berth_agent.client import AgentApiError, Fenced

log = logging.getLogger(__name__)

#: Refresh this long before expiry at most (the SDKs re-read from 15 min before; they stop trusting
#: the old set at 10 min: a refresh by then is in their hands before they need it).
MAX_MARGIN_S = 600.0


def expiration(creds: Mapping[str, Any]) -> float | None:
    """``Expiration`` (ISO 8601) as a POSIX time, or None when absent or unreadable."""
    raw = creds.get("Expiration")
    if not raw:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AttemptCredentials:
    def __init__(
        self,
        first: Mapping[str, Any],
        fetch: Callable[[], Mapping[str, Any]],
        *,
        on_refresh: Callable[[Mapping[str, Any]], None],
        clock: Callable[[], float] = time.time,
        max_margin_s: float = MAX_MARGIN_S,
        retry_s: float = 5.0,
    ) -> None:
        self._fetch, self._on_refresh, self._clock = fetch, on_refresh, clock
        self._max_margin_s, self._retry_s = max_margin_s, retry_s
        self.refreshes = 0
        self._set(first)

    def _set(self, creds: Mapping[str, Any]) -> None:
        self.current = creds
        now = self._clock()
        expires = expiration(creds)
        if expires is None:
            self.refresh_at: float | None = None
            return
        margin = min(self._max_margin_s, max(0.0, expires - now) / 2)
        self.refresh_at = expires - margin

    def maybe_refresh(self) -> bool:
        """Refresh when due; True when a new set was taken. Raises ``Fenced``."""
        if self.refresh_at is None or self._clock() < self.refresh_at:
            return False
        try:
            fresh = self._fetch()
        except Fenced:
            raise
        except AgentApiError as exc:  # keep the old set; try again shortly
            log.warning("credential refresh failed; retrying", extra={"error": str(exc)})
            self.refresh_at = self._clock() + self._retry_s
            return False
        try:
            self._on_refresh(fresh)  # first: a set the agent could not put in place is not taken
        except BaseException:
            self.refresh_at = self._clock() + self._retry_s
            raise
        self._set(fresh)
        self.refreshes += 1
        log.info("attempt credentials refreshed", extra={"expiration": fresh.get("Expiration")})
        return True


class CredentialsFile:
    """``<work>/.aws/config`` and ``<work>/.aws/credentials.json`` for the job's SDK."""

    def __init__(self, work: Path, region: str) -> None:
        self.work, self.region = work, region
        self.dir = work / ".aws"
        self.config = self.dir / "config"
        self.json = self.dir / "credentials.json"

    def env(self) -> dict[str, str]:
        """What the job's environment gets instead of ``AWS_ACCESS_KEY_ID`` and friends."""
        return {
            "AWS_CONFIG_FILE": str(self.config),
            "AWS_SDK_LOAD_CONFIG": "1",  # the Go (v1) and JavaScript (v2) SDKs read config only then
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def write(self, creds: Mapping[str, Any]) -> None:
        document: dict[str, Any] = {
            "Version": 1,
            "AccessKeyId": str(creds["AccessKeyId"]),
            "SecretAccessKey": str(creds["SecretAccessKey"]),
            "SessionToken": str(creds["SessionToken"]),
        }
        if creds.get("Expiration"):
            document["Expiration"] = str(creds["Expiration"])
        config = f"[default]\ncredential_process = cat {self.json}\nregion = {self.region}\n"
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        wfd = os.open(self.work, flags)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(".aws", 0o700, dir_fd=wfd)
            dfd = os.open(".aws", flags, dir_fd=wfd)
        finally:
            os.close(wfd)
        try:
            owner = os.fstat(dfd)
            for name, text in (("credentials.json", json.dumps(document)), ("config", config)):
                self._replace(dfd, name, text.encode(), owner.st_uid, owner.st_gid)
        finally:
            os.close(dfd)

    @staticmethod
    def _replace(dfd: int, name: str, data: bytes, uid: int, gid: int) -> None:
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            try:
                os.write(fd, data)
                os.fsync(fd)
                if (uid, gid) != (os.geteuid(), os.getegid()):
                    os.fchown(fd, uid, gid)  # the job's, when it has a uid of its own
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            raise
