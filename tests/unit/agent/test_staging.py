"""Datasets under their roots, the S3 object cache, code bundle verification and safe unpacking."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from berth_agent.staging import (
    BundleDigestMismatch,
    JobDirs,
    ObjectCache,
    ObjectRef,
    StagingError,
    UnsafeArchive,
    bundle_key,
    parse_digest,
    resolve_dataset,
    unpack_bundle,
)


# -- datasets -----------------------------------------------------------------------------------
@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "datasets" / "imagenet"
    (root / "train").mkdir(parents=True)
    (root / "train" / "a.jpg").write_bytes(b"x")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("no")
    (root / "escape").symlink_to(tmp_path / "secret")
    (root / "inside").symlink_to(root / "train")
    return {"imagenet": root}


def test_dataset_resolves_under_its_root(roots: dict[str, Path]) -> None:
    root = roots["imagenet"]
    assert resolve_dataset("dataset://imagenet/train", roots) == root / "train"
    assert resolve_dataset("dataset://imagenet", roots) == root
    assert resolve_dataset("dataset://imagenet/inside/a.jpg", roots) == root / "train" / "a.jpg"


@pytest.mark.parametrize(
    "uri",
    [
        "dataset://imagenet/../secret",
        "dataset://imagenet/train/../../secret/key",
        "dataset://imagenet/./train",
        "dataset://imagenet/escape",  # a symlink out of the root
        "dataset://imagenet/escape/key",
    ],
)
def test_dataset_escape_is_refused(roots: dict[str, Path], uri: str) -> None:
    with pytest.raises(StagingError):
        resolve_dataset(uri, roots)


def test_dataset_root_that_is_itself_a_link_and_unknown_names(roots: dict[str, Path], tmp_path: Path) -> None:
    link = tmp_path / "ds-link"
    link.symlink_to(roots["imagenet"])
    assert resolve_dataset("dataset://alias/train", {"alias": link}) == roots["imagenet"] / "train"
    with pytest.raises(StagingError, match="not registered"):
        resolve_dataset("dataset://coco/x", roots)
    with pytest.raises(StagingError, match="does not exist"):
        resolve_dataset("dataset://imagenet/val", roots)
    with pytest.raises(StagingError):
        resolve_dataset("s3://b/k", roots)


# -- object cache -------------------------------------------------------------------------------
class Store:
    def __init__(self, objects: dict[tuple[str, str], bytes], delay: float = 0.0) -> None:
        self.objects = objects
        self.delay = delay
        self.fetches: list[str] = []
        self.lock = threading.Lock()

    def fetch(self, ref: ObjectRef, dest: Path) -> None:
        with self.lock:
            self.fetches.append(ref.key)
        time.sleep(self.delay)
        dest.write_bytes(self.objects[(ref.bucket, ref.key)])


def _ref(key: str, version: str = "v1", size: int | None = None) -> ObjectRef:
    return ObjectRef("data", key, version, size)


def test_cache_hit_miss_and_version_keying(tmp_path: Path) -> None:
    store = Store({("data", "a"): b"A" * 10})
    cache = ObjectCache(tmp_path / "c", max_bytes=100)
    p1 = cache.acquire(_ref("a"), store.fetch)
    cache.release(_ref("a"))
    p2 = cache.acquire(_ref("a"), store.fetch)
    cache.release(_ref("a"))
    assert p1 == p2 and p1.read_bytes() == b"A" * 10 and store.fetches == ["a"]
    assert (cache.hits, cache.misses) == (1, 1)
    cache.acquire(_ref("a", "v2"), store.fetch)  # a new version is a new entry
    assert store.fetches == ["a", "a"]
    assert p1.stat().st_mode & 0o777 == 0o444


def test_cache_evicts_least_recently_used_and_never_pinned(tmp_path: Path) -> None:
    store = Store({("data", k): k.encode() * 40 for k in "abcd"})
    cache = ObjectCache(tmp_path / "c", max_bytes=100)
    for k in "ab":
        cache.acquire(_ref(k), store.fetch)
        cache.release(_ref(k))
    cache.acquire(_ref("a"), store.fetch)  # a is now the most recent (and pinned)
    cache.acquire(_ref("c"), store.fetch)  # 120 bytes: b goes (least recent), a is pinned anyway
    assert cache.evictions == 1 and cache.used_bytes == 80
    cache.release(_ref("c"))
    cache.acquire(_ref("d"), store.fetch)  # a pinned, so c goes
    assert cache.used_bytes == 80
    names = {p.name for p in (tmp_path / "c" / "objects").iterdir()}
    assert names == {_ref("a").cache_name, _ref("d").cache_name}


def test_cache_survives_restart_in_lru_order(tmp_path: Path) -> None:
    store = Store({("data", k): b"x" * 40 for k in "abc"})
    cache = ObjectCache(tmp_path / "c", max_bytes=100)
    for k in "ab":
        cache.acquire(_ref(k), store.fetch)
        cache.release(_ref(k))
        time.sleep(0.01)
    again = ObjectCache(tmp_path / "c", max_bytes=100)
    assert again.used_bytes == 80
    again.acquire(_ref("c"), store.fetch)
    assert not (tmp_path / "c" / "objects" / _ref("a").cache_name).exists()


def test_cache_reports_the_sources_it_holds_whole_by_version(tmp_path: Path) -> None:
    store = Store({("data", k): k.encode() * 40 for k in "abcd"})
    cache = ObjectCache(tmp_path / "c", max_bytes=100)

    def stage(source: str, *keys: str, version: str = "v1") -> None:
        refs = [_ref(k, version) for k in keys]
        for r in refs:
            cache.acquire(r, store.fetch)
            cache.release(r)
        cache.note_dataset(source, refs)

    stage("s3://data/ds1/", "a")
    stage("s3://data/ds2/", "b")
    held = cache.cached_datasets()
    assert [c.source for c in held] == ["s3://data/ds2/", "s3://data/ds1/"]  # most recent first
    assert held[0].size_bytes == 40 and held[0].version != held[1].version
    # the same source staged again at another version is the same entry, with a new version
    before = held[1].version
    stage("s3://data/ds1/", "a", version="v2")
    assert {c.source: c.version for c in cache.cached_datasets()}["s3://data/ds1/"] != before
    # a restart keeps the index
    assert [c.source for c in ObjectCache(tmp_path / "c", max_bytes=100).cached_datasets()] == [
        "s3://data/ds1/",
        "s3://data/ds2/",
    ]
    # once one of its objects is evicted, a source is no longer reported
    stage("s3://data/ds3/", "c", "d")
    assert [c.source for c in cache.cached_datasets()] == ["s3://data/ds3/"]
    # bounded: at most ``limit`` entries; nothing for a source that is not s3:// or held no object
    assert len(cache.cached_datasets(limit=0)) == 0
    cache.note_dataset("dataset://glue", [_ref("c")])
    cache.note_dataset("s3://data/empty/", [])
    assert [c.source for c in cache.cached_datasets()] == ["s3://data/ds3/"]


def test_an_unreadable_dataset_index_costs_only_the_preference(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "datasets.json").write_text("{not json")
    assert ObjectCache(tmp_path / "c", max_bytes=100).cached_datasets() == []


def test_concurrent_jobs_download_once(tmp_path: Path) -> None:
    store = Store({("data", "big"): b"z" * 50}, delay=0.2)
    cache = ObjectCache(tmp_path / "c", max_bytes=1000)
    paths: list[Path] = []
    threads = [
        threading.Thread(target=lambda: paths.append(cache.acquire(_ref("big"), store.fetch)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.fetches == ["big"] and len(set(paths)) == 1


def test_cache_errors_leave_nothing_behind(tmp_path: Path) -> None:
    cache = ObjectCache(tmp_path / "c", max_bytes=100)

    def broken(ref: ObjectRef, dest: Path) -> None:
        dest.write_bytes(b"partial")
        raise ConnectionError("reset")

    with pytest.raises(StagingError, match="could not be fetched"):
        cache.acquire(_ref("a"), broken)
    with pytest.raises(StagingError, match="larger than the cache"):
        cache.acquire(_ref("a", size=101), broken)
    store = Store({("data", "a"): b"abc"})
    with pytest.raises(StagingError, match="expected 5"):
        cache.acquire(_ref("a", size=5), store.fetch)
    assert list((tmp_path / "c" / "tmp").iterdir()) == [] and cache.used_bytes == 0


def test_staged_links_into_the_job_and_unpins(tmp_path: Path) -> None:
    store = Store({("data", "x/1"): b"1", ("data", "x/2"): b"2"})
    cache = ObjectCache(tmp_path / "c", max_bytes=100)
    dest = tmp_path / "job"
    with cache.staged([(_ref("x/1"), "x/1"), (_ref("x/2"), "sub/2")], dest, store.fetch) as paths:
        assert [p.read_bytes() for p in paths] == [b"1", b"2"]
        assert cache._pins
    assert not cache._pins
    with pytest.raises(StagingError), cache.staged([(_ref("x/1"), "../out")], dest, store.fetch):
        pass


# -- bundles ------------------------------------------------------------------------------------
def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in entries:
            payload = data.get(info.name)
            if payload is not None:
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return buf.getvalue()


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _write(tmp_path: Path, data: bytes, name: str = "bundle.tar.gz") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_bundle_packed_by_the_cli_unpacks_with_its_digest(tmp_path: Path) -> None:
    from berth_tools.bundle import pack

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "m.py").write_text("x = 1\n")
    bundle = pack(src)
    archive = _write(tmp_path, bundle.data)
    assert parse_digest(bundle.code) == bundle.digest
    assert bundle_key("vision", bundle.digest) == f"bundles/vision/sha256/{bundle.digest}.tar.gz"
    n = unpack_bundle(archive, tmp_path / "job", expected_sha256=parse_digest(bundle.code))
    assert n == 2 and (tmp_path / "job" / "pkg" / "m.py").read_text() == "x = 1\n"


def test_digest_mismatch_refused_before_unpacking(tmp_path: Path) -> None:
    archive = _write(tmp_path, _tar([_file("a.py")], {"a.py": b"1"}))
    with pytest.raises(BundleDigestMismatch):
        unpack_bundle(archive, tmp_path / "job", expected_sha256="0" * 64)
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    "entries",
    [
        [_file("/etc/cron.d/x")],
        [_file("../outside.py")],
        [_file("a/../../outside.py")],
        [_link("evil", "/etc/passwd")],
        [_link("evil", "../../outside")],
        [_link("hard", "/etc/shadow", tarfile.LNKTYPE)],
    ],
)
def test_unsafe_tar_members_refused(tmp_path: Path, entries: list[tarfile.TarInfo]) -> None:
    data = {e.name: b"payload" for e in entries if e.type == tarfile.REGTYPE}
    archive = _write(tmp_path, _tar(entries, data))
    with pytest.raises(UnsafeArchive):
        unpack_bundle(
            archive, tmp_path / "job", expected_sha256=hashlib.sha256(archive.read_bytes()).hexdigest()
        )
    assert not (tmp_path / "outside.py").exists()


def test_device_and_size_bounds(tmp_path: Path) -> None:
    dev = tarfile.TarInfo("dev")
    dev.type = tarfile.CHRTYPE
    with pytest.raises(UnsafeArchive, match="special"):
        unpack_bundle(_write(tmp_path, _tar([dev], {})), tmp_path / "j", expected_sha256=None)
    big = _write(tmp_path, _tar([_file("a")], {"a": b"x" * 1000}), "big.tar.gz")
    with pytest.raises(UnsafeArchive, match="unpacks to"):
        unpack_bundle(big, tmp_path / "j", expected_sha256=None, max_bytes=999)
    with pytest.raises(UnsafeArchive, match="neither"):
        unpack_bundle(_write(tmp_path, b"plain text", "x.bin"), tmp_path / "j", expected_sha256=None)


def test_internal_symlink_allowed(tmp_path: Path) -> None:
    archive = _write(tmp_path, _tar([_file("lib/a.py"), _link("a.py", "lib/a.py")], {"lib/a.py": b"1"}))
    unpack_bundle(archive, tmp_path / "job", expected_sha256=None)
    assert (tmp_path / "job" / "a.py").read_bytes() == b"1"


def test_zip_bundles(tmp_path: Path) -> None:
    def zipped(entries: dict[str, bytes]) -> Path:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, payload in entries.items():
                zf.writestr(name, payload)
        return _write(tmp_path, buf.getvalue(), "b.zip")

    unpack_bundle(zipped({"train.py": b"ok"}), tmp_path / "job", expected_sha256=None)
    assert (tmp_path / "job" / "train.py").read_bytes() == b"ok"
    for bad in ("../x.py", "/abs.py", "a\\..\\b"):
        with pytest.raises(UnsafeArchive):
            unpack_bundle(zipped({bad: b"no"}), tmp_path / "job2", expected_sha256=None)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = (0o120777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="symbolic link"):
        unpack_bundle(_write(tmp_path, buf.getvalue(), "l.zip"), tmp_path / "job3", expected_sha256=None)


def test_job_dirs(tmp_path: Path) -> None:
    dirs = JobDirs.create(tmp_path, "j-1", 3)
    assert dirs.base == tmp_path / "j-1-3" and dirs.base.stat().st_mode & 0o777 == 0o711
    assert dirs.outputs.stat().st_mode & 0o777 == 0o700 and dirs.checkpoints.is_dir() and dirs.work.is_dir()
    dirs.remove()
    assert not dirs.base.exists()
    with pytest.raises(StagingError):
        JobDirs.create(tmp_path, "../x", 1)


def test_stage_bundle_removes_the_archive_even_when_the_digest_is_wrong(tmp_path: Path) -> None:
    from berth_agent.staging import BundleDigestMismatch, stage_bundle

    archive = tmp_path / "bundle"
    with pytest.raises(BundleDigestMismatch):
        stage_bundle(lambda path: path.write_bytes(b"not the bundle"), "0" * 64, archive, tmp_path / "work")
    assert not archive.exists()
    assert not (tmp_path / "work").exists()  # nothing unpacked


def _broken_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train.py", "print('x')\n" * 200)
    data = bytearray(buf.getvalue())
    start = 30 + len("train.py")
    data[start : start + 40] = b"\xff" * 40
    return bytes(data)


def _truncated_tar_gz() -> bytes:
    whole = _tar([_file("a.py")], {"a.py": b"x = 1\n" * 5000})
    return whole[: len(whole) // 2]


@pytest.mark.parametrize("make", [_broken_zip, _truncated_tar_gz], ids=["corrupt zip", "truncated tar.gz"])
def test_a_broken_archive_is_an_invalid_bundle_not_a_crash(tmp_path: Path, make: Any) -> None:
    """Finding 8b: whatever a broken archive raises while it is read becomes ``InvalidBundle`` (the
    permanent ``invalid_bundle`` failure), never an exception the attempt does not expect."""
    from berth_agent.staging import InvalidBundle

    archive = _write(tmp_path, make(), "bundle.bin")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    with pytest.raises(InvalidBundle, match="broken archive") as e:
        unpack_bundle(archive, tmp_path / "job", expected_sha256=digest)
    assert e.value.failure == "invalid_bundle"
