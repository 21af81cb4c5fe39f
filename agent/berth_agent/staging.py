"""Staging an attempt's inputs: on-prem datasets, the S3 object cache, code bundles, job dirs.

- ``resolve_dataset("dataset://name/sub/path", roots)``: the real path under the dataset's
  registered root, refused (``StagingError``) when it would leave the root through ``..`` or a
  symbolic link anywhere on the way, or does not exist. The executors mount it read-only. The roots
  are the host admin's (not writable by jobs), so the path cannot be swapped between check and mount.
- ``ObjectCache``: S3 objects cached per host, keyed by (bucket, key, version id or ETag), so an
  object changed in S3 is a new entry and an unchanged one is downloaded once for every job.
  Bounded in bytes, least-recently-used entries evicted first, entries in use by a running job
  (pinned) never evicted. Safe for concurrent jobs: one lock for the index, one per object so a
  second job waits for the first one's download instead of repeating it, downloads into a temporary
  file renamed into place, and an ``flock`` on the cache dir around index changes for a second
  process sharing it. The download itself is the caller's ``fetch`` (it holds the attempt's scoped
  credentials; this module never sees credentials). It also remembers which data sources
  (``note_dataset``) it holds in full, by version, for the heartbeat's ``cached_datasets``
  (``cached_datasets()``: data locality, docs/data.md), in ``datasets.json`` so a restart keeps it.
- ``unpack_bundle``: verify a code bundle's SHA-256 (the ``sha256:<hex>`` of ``berth.domain.storage``;
  the bundle lives at ``bundle_key(tenant, digest)`` in the artifacts bucket) and unpack it
  (``.tar.gz`` as ``berth_tools.bundle`` packs it, any tar or zip) into the per-job dir, refusing
  absolute names, ``..``, links leaving the dir, devices, and archives over a size or file-count
  bound. Nothing is unpacked from a bundle whose digest does not match.
- ``JobDirs``: the per-attempt directories (work, outputs, checkpoints) and their removal.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import logging
import lzma
import os
import shutil
import tarfile
import threading
import uuid
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from berth.domain.agent_wire import MAX_CACHED_DATASETS, MAX_CACHED_SOURCE_CHARS, CachedDataset
from berth.domain.storage import bundle_key, parse_digest

log = logging.getLogger(__name__)

__all__ = [
    "BundleDigestMismatch",
    "InvalidBundle",
    "JobDirs",
    "ObjectCache",
    "ObjectRef",
    "StagingError",
    "UnsafeArchive",
    "bundle_key",
    "parse_digest",
    "resolve_dataset",
    "safe_join",
    "stage_bundle",
    "unpack_bundle",
]

DATASET_SCHEME = "dataset://"
#: Data sources the cache's index remembers (more than it reports: some may be partly evicted).
_DATASETS_KEPT = 4 * MAX_CACHED_DATASETS
MAX_UNPACKED_BYTES = 8 * 1024**3
MAX_FILES = 200_000


class StagingError(Exception):
    """An input cannot be staged; the attempt fails with failure ``staging`` (transient: another host
    or a later try may stage it), or the subclass's ``failure``."""

    failure = "staging"


class BundleDigestMismatch(StagingError):
    pass


class InvalidBundle(StagingError):
    """The code bundle itself is broken (a corrupt or truncated archive, not an archive at all, or
    one that is unsafe to unpack): the same on every host, so the attempt fails at once as the
    permanent ``invalid_bundle`` (``Berth.InvalidBundle``) and frees its GPUs."""

    failure = "invalid_bundle"


class UnsafeArchive(InvalidBundle):
    pass


#: What reading a broken archive raises (beyond ``StagingError``): a bad zip, a bad tar, a truncated
#: or corrupt compressed stream, an encrypted or unsupported zip member.
_BROKEN_ARCHIVE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    tarfile.TarError,
    gzip.BadGzipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,
    RuntimeError,
)


# -- datasets -----------------------------------------------------------------------------------
def resolve_dataset(uri: str, roots: Mapping[str, Path]) -> Path:
    """The host path ``uri`` names, proven to lie under its dataset's registered root."""
    if not uri.startswith(DATASET_SCHEME):
        raise StagingError(f"{uri} is not a dataset:// source")
    name, _, sub = uri[len(DATASET_SCHEME) :].partition("/")
    if name not in roots:
        raise StagingError(f"dataset {name!r} is not registered on this host")
    segments = [s for s in sub.split("/") if s]
    if "\x00" in sub or any(s in (".", "..") for s in segments):
        raise StagingError(f"{uri}: '.' and '..' are not allowed in a dataset path")
    root = Path(os.path.realpath(roots[name]))
    # realpath resolves every symlink on the way, so a link pointing out of the root shows up here.
    target = Path(os.path.realpath(root.joinpath(*segments)))
    if not target.is_relative_to(root):
        raise StagingError(f"{uri} resolves outside its dataset root")
    if not target.exists():
        raise StagingError(f"{uri} does not exist on this host")
    return target


# -- the S3 object cache ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ObjectRef:
    bucket: str
    key: str
    version: str  # the version id, else the ETag (from HeadObject); a content digest for bundles
    size: int | None = None

    @property
    def cache_name(self) -> str:
        return hashlib.sha256(f"{self.bucket}\0{self.key}\0{self.version}".encode()).hexdigest()


#: Writes the object's bytes to the given path (with the attempt's credentials).
Fetch = Callable[[ObjectRef, Path], None]


class ObjectCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._objects = root / "objects"
        self._tmp = root / "tmp"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)
        for stale in self._tmp.iterdir():  # left by a crash mid-download
            stale.unlink(missing_ok=True)
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._pins: dict[str, int] = {}
        self._lru: OrderedDict[str, int] = OrderedDict()
        entries = sorted(self._objects.iterdir(), key=lambda p: p.stat().st_mtime)
        for p in entries:
            self._lru[p.name] = p.stat().st_size
        self.hits = self.misses = self.evictions = 0
        #: source -> (version, cache names of its objects, bytes), least recently staged first.
        self._datasets: OrderedDict[str, tuple[str, tuple[str, ...], int]] = OrderedDict()
        self._load_datasets()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._lru.values())

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        with (self.root / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _key_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(name, threading.Lock())

    def acquire(self, ref: ObjectRef, fetch: Fetch) -> Path:
        """The cached file of ``ref`` (downloaded if absent), pinned until ``release(ref)``."""
        if ref.size is not None and ref.size > self.max_bytes:
            raise StagingError(f"s3://{ref.bucket}/{ref.key} ({ref.size} bytes) is larger than the cache")
        name = ref.cache_name
        path = self._objects / name
        with self._key_lock(name):
            with self._lock:
                present = name in self._lru and path.exists()
                self._pins[name] = self._pins.get(name, 0) + 1
                if present:
                    self._lru.move_to_end(name)
                    self.hits += 1
            if present:
                os.utime(path)  # the LRU order survives a restart through mtimes
                return path
            try:
                size = self._download(ref, path, fetch)
            except BaseException:
                self._unpin(name)
                raise
            with self._lock:
                self.misses += 1
                self._lru[name] = size
                self._lru.move_to_end(name)
        self._evict()
        return path

    def _download(self, ref: ObjectRef, path: Path, fetch: Fetch) -> int:
        tmp = self._tmp / f"{ref.cache_name}.{uuid.uuid4().hex}"
        try:
            fetch(ref, tmp)
            size = tmp.stat().st_size
            if ref.size is not None and size != ref.size:
                raise StagingError(f"s3://{ref.bucket}/{ref.key}: got {size} bytes, expected {ref.size}")
            tmp.chmod(0o444)
            with self._flock():
                os.replace(tmp, path)
            return size
        except StagingError:
            raise
        except Exception as exc:
            raise StagingError(f"s3://{ref.bucket}/{ref.key} could not be fetched: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)

    def _unpin(self, name: str) -> None:
        with self._lock:
            left = self._pins.get(name, 0) - 1
            if left > 0:
                self._pins[name] = left
            else:
                self._pins.pop(name, None)

    def release(self, ref: ObjectRef) -> None:
        self._unpin(ref.cache_name)
        self._evict()

    def _evict(self) -> None:
        with self._lock, self._flock():
            total = sum(self._lru.values())
            for name in list(self._lru):
                if total <= self.max_bytes:
                    break
                if self._pins.get(name):
                    continue
                total -= self._lru.pop(name)
                (self._objects / name).unlink(missing_ok=True)
                self.evictions += 1
            if total > self.max_bytes:
                log.warning("object cache over its bound: all entries in use", extra={"bytes": total})

    # -- which data sources it holds (data locality) -------------------------------------------
    @property
    def _datasets_file(self) -> Path:
        return self.root / "datasets.json"

    def _load_datasets(self) -> None:
        try:
            rows = json.loads(self._datasets_file.read_text())
            for source, version, names, size in rows[-_DATASETS_KEPT:]:
                self._datasets[str(source)] = (str(version), tuple(str(n) for n in names), int(size))
        except (OSError, ValueError, TypeError):
            self._datasets.clear()  # absent or unreadable: it only costs a preference

    def _save_datasets(self) -> None:
        rows = [[s, v, list(n), b] for s, (v, n, b) in self._datasets.items()]
        tmp = self._tmp / f"datasets.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, self._datasets_file)

    def note_dataset(self, source: str, refs: list[ObjectRef]) -> None:
        """Remember that ``source`` (a job's ``s3://`` data source) was staged whole from ``refs``.
        Its version is a digest of its objects' keys and versions, so a changed object is a new one."""
        if not refs or len(source) > MAX_CACHED_SOURCE_CHARS or not source.startswith("s3://"):
            return
        digest = hashlib.sha256()
        for ref in sorted(refs, key=lambda r: (r.bucket, r.key)):
            digest.update(f"{ref.bucket}\0{ref.key}\0{ref.version}\n".encode())
        names = tuple(r.cache_name for r in refs)
        with self._lock:
            size = sum(self._lru.get(n, 0) for n in names)
            self._datasets[source] = (digest.hexdigest()[:32], names, size)
            self._datasets.move_to_end(source)
            while len(self._datasets) > _DATASETS_KEPT:
                self._datasets.popitem(last=False)
            try:
                self._save_datasets()
            except OSError as exc:
                log.warning("could not save the cache's dataset index", extra={"error": str(exc)})

    def cached_datasets(self, limit: int = MAX_CACHED_DATASETS) -> list[CachedDataset]:
        """The data sources whose objects are all still cached, most recently staged first (at most
        ``limit``): what the heartbeat reports."""
        out: list[CachedDataset] = []
        with self._lock:
            for source, (version, names, size) in reversed(self._datasets.items()):
                if len(out) >= limit:
                    break
                if all(n in self._lru for n in names):
                    out.append(CachedDataset(source=source, version=version, size_bytes=size))
        return out

    @contextlib.contextmanager
    def staged(self, refs: list[tuple[ObjectRef, str]], dest: Path, fetch: Fetch) -> Iterator[list[Path]]:
        """Each ``(ref, relative path)`` linked (or copied) under ``dest``; pinned while in use."""
        held: list[ObjectRef] = []
        try:
            out = []
            for ref, rel in refs:
                target = safe_join(dest, rel)
                src = self.acquire(ref, fetch)
                held.append(ref)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, target)
                except OSError:  # another filesystem
                    shutil.copyfile(src, target)
                    target.chmod(0o444)
                out.append(target)
            yield out
        finally:
            for ref in held:
                self.release(ref)


def safe_join(dest: Path, rel: str) -> Path:
    """``dest/rel`` for a relative POSIX path with no ``.``/``..`` segments; StagingError otherwise."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in (".", "..") for p in parts) or "\x00" in rel:
        raise StagingError(f"{rel!r} is not a safe relative path")
    return dest.joinpath(*parts)


# -- code bundles -------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


def _check_name(name: str) -> None:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\x00" in name or "\\" in name:
        raise UnsafeArchive(f"archive member {name!r} would land outside the job directory")


def _unpack_tar(archive: Path, dest: Path, max_bytes: int, max_files: int) -> int:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        if len(members) > max_files:
            raise UnsafeArchive(f"archive holds more than {max_files} entries")
        total = 0
        for m in members:
            _check_name(m.name)
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                raise UnsafeArchive(f"archive member {m.name!r} is a device, fifo or other special file")
            total += m.size
        if total > max_bytes:
            raise UnsafeArchive(f"archive unpacks to {total} bytes; at most {max_bytes}")
        try:
            # The "data" filter refuses links that leave dest, strips set-uid bits and ownership.
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise UnsafeArchive(str(exc)) from exc
        return len(members)


def _unpack_zip(archive: Path, dest: Path, max_bytes: int, max_files: int) -> int:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > max_files:
            raise UnsafeArchive(f"archive holds more than {max_files} entries")
        for info in infos:
            _check_name(info.filename)
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise UnsafeArchive(f"archive member {info.filename!r} is a symbolic link")
        total = sum(i.file_size for i in infos)
        if total > max_bytes:
            raise UnsafeArchive(f"archive unpacks to {total} bytes; at most {max_bytes}")
        zf.extractall(dest)
        return len(infos)


def unpack_bundle(
    archive: Path,
    dest: Path,
    *,
    expected_sha256: str | None,
    max_bytes: int = MAX_UNPACKED_BYTES,
    max_files: int = MAX_FILES,
) -> int:
    """Verify then unpack ``archive`` into ``dest``; returns the number of entries.

    ``expected_sha256`` is the bundle's hex digest (``parse_digest(spec.code)``); None only for an
    ``s3://`` code archive, which has no digest to check (its ETag/version keys the cache).
    """
    if expected_sha256 is not None:
        actual = file_sha256(archive)
        if actual != expected_sha256:
            raise BundleDigestMismatch(
                f"code bundle digest is sha256:{actual}, expected sha256:{expected_sha256}"
            )
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if tarfile.is_tarfile(archive):
            return _unpack_tar(archive, dest, max_bytes, max_files)
        if zipfile.is_zipfile(archive):
            return _unpack_zip(archive, dest, max_bytes, max_files)
    except _BROKEN_ARCHIVE as exc:
        raise InvalidBundle(f"the code bundle is a broken archive: {type(exc).__name__}: {exc}") from exc
    raise UnsafeArchive("the code bundle is neither a tar nor a zip archive")


def stage_bundle(fetch: Callable[[Path], None], digest: str, archive: Path, dest: Path) -> int:
    """Fetch a code bundle into ``archive`` (``fetch(path)``), verify it against ``digest`` and unpack it
    into ``dest``; the archive is removed whatever happens. The one path both the agent's attempts and
    the cloud launcher (``berth_agent.launch``) take, so a bundle is checked the same on both sites."""
    try:
        fetch(archive)
        return unpack_bundle(archive, dest, expected_sha256=digest)
    finally:
        archive.unlink(missing_ok=True)


# -- per-attempt directories --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JobDirs:
    """``<work_dir>/<job>-<attempt>/{work,outputs,checkpoints}``; ``remove()`` after the attempt."""

    base: Path

    @classmethod
    def create(cls, work_dir: Path, job_id: str, attempt: int) -> JobDirs:
        safe_join(work_dir, job_id)  # a job id is never a path
        dirs = cls(work_dir / f"{job_id}-{attempt}")
        # base: traversable, not listable; the three below become the job's (0700, its uid) when the
        # process executor gives it a uid, or are reached only through a container's mounts.
        dirs.base.mkdir(parents=False, exist_ok=True)
        dirs.base.chmod(0o711)
        for d in (dirs.work, dirs.outputs, dirs.checkpoints):
            d.mkdir(mode=0o700, exist_ok=True)
        return dirs

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def outputs(self) -> Path:
        return self.base / "outputs"

    @property
    def checkpoints(self) -> Path:
        return self.base / "checkpoints"

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
