"""Outputs and checkpoints: uploaded to the job's prefix while it runs and at its end, restored on retry.

Keys: ``<tenant>/jobs/<job>/outputs/<path>`` and ``<tenant>/jobs/<job>/checkpoints/<path>`` in the
data bucket (``berth.domain.storage.job_output_prefix``: every attempt of a job gets the same prefix,
which its scoped credentials may read and write). Use from the daemon::

    out = DirSync(dirs.outputs, keys.outputs, put)          # put(fileobj, key, size) with the
    ckpt = DirSync(dirs.checkpoints, keys.checkpoints, put) # attempt's credentials (S3 PutObject)
    restore(dirs.checkpoints, keys.checkpoints, list_keys, get)   # before start, for attempt > 1
    every N seconds: out.sync(); ckpt.sync()               # and once more after the job ends

The agent reads what a job wrote, so a job must not be able to make it read anything else: the
walk is ``os.fwalk`` (directory fds, never following a symlink, safe against a directory swapped
for a link mid-walk), each file is opened relative to its directory with ``O_NOFOLLOW`` and checked
after opening (a regular file with one link: a hard link to a host file is skipped, as are
symlinks, fifos and devices). A file is uploaded again only when its size or mtime changed.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from berth.domain.storage import job_output_prefix
from berth_agent.staging import StagingError, safe_join

log = logging.getLogger(__name__)

#: Uploads ``size`` bytes from the open file to ``key``.
Put = Callable[[BinaryIO, str, int], None]


@dataclass(frozen=True, slots=True)
class OutputKeys:
    outputs: str
    checkpoints: str

    @classmethod
    def of(cls, tenant: str, job_id: str) -> OutputKeys:
        prefix = job_output_prefix(tenant, job_id)
        return cls(outputs=prefix + "outputs/", checkpoints=prefix + "checkpoints/")


@dataclass
class SyncResult:
    uploaded: int = 0
    skipped_unsafe: int = 0
    failed: int = 0


class DirSync:
    def __init__(self, local: Path, key_prefix: str, put: Put) -> None:
        if not key_prefix.endswith("/"):
            raise ValueError("key prefix must end with '/'")
        self.local = local
        self.key_prefix = key_prefix
        self._put = put
        self._seen: dict[str, tuple[int, int]] = {}
        self.last_upload_at: datetime | None = None
        """When a sync last uploaded something (UTC): a checkpoint's time, for the control plane."""

    @property
    def total_bytes(self) -> int:
        """Bytes of every file uploaded so far, at its last uploaded size (a checkpoint's size)."""
        return sum(size for size, _ in self._seen.values())

    def sync(self) -> SyncResult:
        result = SyncResult()
        if not self.local.is_dir():
            return result
        for dirpath, _dirnames, filenames, dirfd in os.fwalk(self.local, follow_symlinks=False):
            rel_dir = os.path.relpath(dirpath, self.local)
            for name in filenames:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                self._one(dirfd, name, rel, result)
        if result.uploaded:
            self.last_upload_at = datetime.now(UTC)
        return result

    def _one(self, dirfd: int, name: str, rel: str, result: SyncResult) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError:  # a symlink (ELOOP), vanished, or unreadable
            result.skipped_unsafe += 1
            return
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                result.skipped_unsafe += 1
                return
            sig = (st.st_size, st.st_mtime_ns)
            if self._seen.get(rel) == sig:
                return
            try:
                self._put(fh, self.key_prefix + rel, st.st_size)
            except Exception as exc:  # the next round tries again
                log.warning("output upload failed", extra={"key": self.key_prefix + rel, "error": str(exc)})
                result.failed += 1
                return
            self._seen[rel] = sig
            result.uploaded += 1


def restore(
    local: Path,
    key_prefix: str,
    list_keys: Callable[[str], Iterable[str]],
    get: Callable[[str, Path], None],
) -> int:
    """Download every object under ``key_prefix`` into ``local`` (a retried attempt's checkpoints)."""
    count = 0
    for key in list_keys(key_prefix):
        if not key.startswith(key_prefix) or key.endswith("/"):
            continue
        try:
            dest = safe_join(local, key[len(key_prefix) :])
        except StagingError:
            log.warning("checkpoint key skipped: not a safe path", extra={"key": key})
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        get(key, dest)
        count += 1
    return count


class PeriodicSync:
    """The syncs of one attempt, run every ``interval_s`` while it runs (``tick``) and once at its end
    (``final``): what the agent's attempts and the cloud launcher both do with outputs and checkpoints."""

    def __init__(
        self, syncs: list[DirSync], interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.syncs, self.interval_s, self._clock = syncs, interval_s, clock
        self._next = clock() + interval_s

    def tick(self) -> None:
        now = self._clock()
        if now >= self._next:
            for sync in self.syncs:
                sync.sync()
            self._next = now + self.interval_s

    def final(self) -> list[SyncResult]:
        return [sync.sync() for sync in self.syncs]

    def now(self) -> list[SyncResult]:
        """Sync at once (before a kill), and restart the interval."""
        self._next = self._clock() + self.interval_s
        return self.final()
