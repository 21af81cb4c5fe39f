"""Output/checkpoint sync: changed files only, never through links, restore for a retried attempt."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from berth_agent.outputs import DirSync, OutputKeys, restore


class Bucket:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[str] = []

    def put(self, fh: BinaryIO, key: str, size: int) -> None:
        data = fh.read()
        assert len(data) == size
        self.objects[key] = data
        self.puts.append(key)


def test_keys() -> None:
    keys = OutputKeys.of("vision", "j-1")
    assert keys.outputs == "vision/jobs/j-1/outputs/" and keys.checkpoints == "vision/jobs/j-1/checkpoints/"


def test_uploads_new_and_changed_files_only(tmp_path: Path) -> None:
    bucket = Bucket()
    (tmp_path / "sub").mkdir()
    (tmp_path / "model.pt").write_bytes(b"v1")
    (tmp_path / "sub" / "metrics.json").write_text("{}")
    sync = DirSync(tmp_path, "p/", bucket.put)
    assert sync.sync().uploaded == 2
    assert bucket.objects == {"p/model.pt": b"v1", "p/sub/metrics.json": b"{}"}
    assert sync.sync().uploaded == 0
    (tmp_path / "model.pt").write_bytes(b"v2-longer")
    assert sync.sync().uploaded == 1 and bucket.objects["p/model.pt"] == b"v2-longer"


def test_links_and_special_files_are_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("agent credentials")
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "link").symlink_to(secret)
    (out / "dirlink").symlink_to(tmp_path)
    os.link(secret, out / "hard")
    os.mkfifo(out / "fifo")
    (out / "d" / "ok.txt").write_text("ok")
    bucket = Bucket()
    result = DirSync(out, "p/", bucket.put).sync()
    assert bucket.objects == {"p/d/ok.txt": b"ok"}
    assert result.skipped_unsafe == 3  # link, hard link, fifo (the directory link is not walked)


def test_a_failed_upload_is_retried_next_round(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    calls = []

    def flaky(fh: BinaryIO, key: str, size: int) -> None:
        calls.append(key)
        if len(calls) == 1:
            raise ConnectionError("reset")

    sync = DirSync(tmp_path, "p/", flaky)
    assert sync.sync().failed == 1
    assert sync.sync().uploaded == 1 and calls == ["p/a", "p/a"]


def test_restore_checkpoints_for_a_retry(tmp_path: Path) -> None:
    store = {"p/ckpt/step-10.pt": b"10", "p/latest": b"step-10", "p/../escape": b"no", "p/dir/": b""}

    def get(key: str, dest: Path) -> None:
        dest.write_bytes(store[key])

    n = restore(tmp_path, "p/", lambda prefix: [k for k in store if k.startswith(prefix)], get)
    assert n == 2
    assert (tmp_path / "ckpt" / "step-10.pt").read_bytes() == b"10" and (
        tmp_path / "latest"
    ).read_bytes() == b"step-10"
    assert not (tmp_path.parent / "escape").exists()


def test_periodic_sync_runs_on_its_interval_and_once_at_the_end(tmp_path: Path) -> None:
    from berth_agent.outputs import DirSync, PeriodicSync

    now = [0.0]
    puts: list[str] = []
    (tmp_path / "a.txt").write_text("1")
    periodic = PeriodicSync(
        [DirSync(tmp_path, "p/", lambda fh, key, size: puts.append(key))], 10.0, clock=lambda: now[0]
    )
    periodic.tick()
    assert puts == []  # not yet due
    now[0] = 10.0
    periodic.tick()
    assert puts == ["p/a.txt"]
    (tmp_path / "b.txt").write_text("2")
    assert [r.uploaded for r in periodic.final()] == [1]
    assert puts == ["p/a.txt", "p/b.txt"]
