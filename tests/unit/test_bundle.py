"""Deterministic bundle packing on the user's side (issue 9)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from berth_tools.bundle import BundleError, local_code_dir, pack


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_same_tree_same_digest_whatever_the_mtimes_or_order(tmp_path: Path) -> None:
    a = pack(_tree(tmp_path / "a"))
    b_root = _tree(tmp_path / "b")
    os.utime(b_root / "train.py", (1, 1))
    b = pack(b_root)
    assert a.digest == b.digest and a.data == b.data and a.files == 3
    assert a.code == f"sha256:{a.digest}"


def test_a_changed_file_changes_the_digest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    before = pack(root).digest
    (root / "pkg" / "model.py").write_text("W = 2\n")
    assert pack(root).digest != before


def test_entries_are_normalised(tmp_path: Path) -> None:
    bundle = pack(_tree(tmp_path / "a"))
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["pkg/model.py", "run.sh", "train.py"]
    assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in members)
    assert {m.name: m.mode for m in members}["run.sh"] == 0o755


def test_gitignore_and_berthignore_are_honoured(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)
    (root / "notes.log").write_text("log")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    (root / ".gitignore").write_text("*.log\n")
    (root / ".berthignore").write_text("data/\n")
    with tarfile.open(fileobj=io.BytesIO(pack(root).data), mode="r:gz") as tar:
        names = tar.getnames()
    assert "notes.log" not in names and "data/big.bin" not in names and ".git/HEAD" not in names
    assert ".gitignore" in names and "train.py" in names


def test_oversized_bundle_is_refused_before_any_upload(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    (root / "weights.bin").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(BundleError, match="at most"):
        pack(root, max_bytes=16 * 1024)


def test_links_are_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    (root / "escape").symlink_to("/etc/passwd")
    with pytest.raises(BundleError, match="not a regular file"):
        pack(root)


def test_code_dir_is_relative_to_the_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "jobs" / "job.yaml"
    assert local_code_dir("./src", spec) == (tmp_path / "jobs" / "src").resolve()
    assert local_code_dir("sha256:" + "a" * 64, spec) is None
    assert local_code_dir("s3://b/k.tar.gz", spec) is None
