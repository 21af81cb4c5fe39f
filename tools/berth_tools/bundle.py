"""Code bundles on the user's side: pack a directory deterministically, upload it only if absent.

The same tree always gives the same bytes and so the same SHA-256 (sorted entries, zero mtimes and
owners, normalised modes, a gzip header without a name or time), so a second submit of unchanged
code uploads nothing. ``.gitignore`` and ``.berthignore`` at the directory's root are honoured
(git's wildmatch rules, through pathspec); ``.git/`` is never packed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec
import urllib3

IGNORE_FILES = (".gitignore", ".berthignore")
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc")
#: The control plane refuses larger bundles (berth.domain.storage.BUNDLE_MAX_BYTES).
MAX_BUNDLE_BYTES = 2 * 1024**3


class BundleError(Exception):
    """The directory cannot be packed (too large, unreadable, a link, not a directory)."""


@dataclass(frozen=True)
class PackedBundle:
    data: bytes
    digest: str
    files: int

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def code(self) -> str:
        return f"sha256:{self.digest}"


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines: list[str] = list(ALWAYS_IGNORED)
    for name in IGNORE_FILES:
        f = root / name
        if f.is_file():
            lines += f.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _files(root: Path, spec: pathspec.GitIgnoreSpec) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = f"{d}/" if rel_dir == "." else f"{rel_dir}/{d}/"
            if (Path(dirpath) / d).is_symlink():
                raise BundleError(f"{rel[:-1]} is a symbolic link; bundles hold regular files only")
            if not spec.match_file(rel):
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if spec.match_file(rel):
                continue
            path = Path(dirpath) / name
            if path.is_symlink() or not stat.S_ISREG(path.lstat().st_mode):
                raise BundleError(f"{rel} is not a regular file (links and devices are not bundled)")
            out.append((rel, path))
    return sorted(out)


def pack(directory: Path, max_bytes: int = MAX_BUNDLE_BYTES) -> PackedBundle:
    """The directory as a deterministic .tar.gz; BundleError before any upload if it is too large."""
    root = directory.resolve()
    if not root.is_dir():
        raise BundleError(f"{directory} is not a directory")
    files = _files(root, _ignore_spec(root))
    raw = sum(p.stat().st_size for _, p in files)
    if raw > 4 * max_bytes:  # cannot compress below the limit in any realistic case: refuse early
        raise BundleError(f"{directory} holds {raw} bytes; a bundle may be at most {max_bytes} bytes packed")
    buf = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, path in files:
            info = tarfile.TarInfo(rel)
            st = path.stat()
            info.size = st.st_size
            info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as fh:
                tar.addfile(info, fh)
            if buf.tell() > max_bytes:
                raise BundleError(f"{directory} packs to more than {max_bytes} bytes; use .berthignore")
    data = buf.getvalue()
    if len(data) > max_bytes:
        raise BundleError(f"{directory} packs to {len(data)} bytes; a bundle may be at most {max_bytes}")
    return PackedBundle(data=data, digest=hashlib.sha256(data).hexdigest(), files=len(files))


@dataclass(frozen=True)
class UploadResult:
    code: str
    uploaded: bool
    bytes: int
    files: int
    pack_s: float
    upload_s: float


def upload(client: Any, directory: Path) -> UploadResult:
    """Pack ``directory`` and upload it through the API's presigned upload unless already stored."""
    t0 = time.monotonic()
    bundle = pack(directory)
    t1 = time.monotonic()
    answer = client.request_bundle(bundle.digest, bundle.size)
    if answer.get("present"):
        return UploadResult(bundle.code, False, bundle.size, bundle.files, t1 - t0, time.monotonic() - t1)
    ticket = answer["upload"]
    # urllib3 (botocore's HTTP client) sends exactly the signed headers; urllib.request would add a
    # form Content-Type to a PUT with a body, which the signature does not cover.
    try:
        resp = urllib3.request(
            ticket["method"], ticket["url"], body=bundle.data, headers=ticket["headers"], timeout=600.0
        )
    except urllib3.exceptions.HTTPError as exc:
        raise BundleError(f"upload failed: {exc}") from exc
    if resp.status >= 300:
        raise BundleError(f"upload refused by the store: HTTP {resp.status} {resp.data[:300]!r}")
    return UploadResult(bundle.code, True, bundle.size, bundle.files, t1 - t0, time.monotonic() - t1)


def local_code_dir(code: str, spec_file: Path) -> Path | None:
    """The directory ``code: ./dir`` names (relative to the spec file), or None for sha256:/s3://."""
    if code.startswith(("sha256:", "s3://")):
        return None
    base = Path.cwd() if str(spec_file) == "-" else spec_file.resolve().parent
    return (base / code).resolve()
