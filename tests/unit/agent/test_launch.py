"""The cloud launcher (`python -m berth_agent.launch`): bundle, data, outputs, exit codes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import pytest

from berth_agent import launch
from berth_agent.launch import Launcher, LaunchSpec, LaunchSpecError


def _bundle(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class FakeIO:
    def __init__(self, bundle: bytes = b"", objects: dict[str, bytes] | None = None) -> None:
        self.bundle = bundle
        self.objects = dict(objects or {})  # data bucket keys
        self.data: dict[str, bytes] = {}  # s3 uri -> bytes (staged data)
        self.fetched: list[str] = []

    def fetch_bundle_uri(self, uri: str, digest: str, dest: Path) -> None:
        self.fetched.append(uri)
        dest.write_bytes(self.bundle)

    def stage_s3(self, uri: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / uri.rsplit("/", 1)[-1]).write_bytes(self.data[uri])
        return dest

    def list_keys(self, prefix: str) -> Iterable[str]:
        return [k for k in self.objects if k.startswith(prefix)]

    def get(self, key: str, dest: Path) -> None:
        dest.write_bytes(self.objects[key])

    def put(self, fh: BinaryIO, key: str, size: int) -> None:
        self.objects[key] = fh.read()


def _spec(**over: object) -> LaunchSpec:
    raw: dict[str, object] = {
        "job_id": "j-1",
        "attempt": 1,
        "tenant": "vision",
        "command": [sys.executable, "-c", "print('hi')"],
        "env": {"GREETING": "hello"},
        "code": None,
        "data": [],
        "outputs": {"bucket": "data", "prefix": "vision/jobs/j-1/outputs/"},
        "checkpoint_prefix": "vision/jobs/j-1/checkpoints/",
        "timeout_s": 60,
        "aws_region": "us-east-1",
        "endpoint_url": None,
        "grace_s": 0.5,
    }
    raw.update(over)
    return LaunchSpec.parse(json.dumps(raw))


def _run(tmp_path: Path, spec: LaunchSpec, fake: FakeIO) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = Launcher(
        spec, io=fake, work_dir=tmp_path / "work", environ={"AWS_REGION": "us-east-1"}, stdout=out, stderr=err
    ).run()
    return code, out.getvalue(), err.getvalue()


def test_bundle_is_verified_and_unpacked_then_run(tmp_path: Path) -> None:
    bundle = _bundle({"train.py": "import os\nprint('trained', os.environ['GREETING'])\n"})
    digest = hashlib.sha256(bundle).hexdigest()
    fake = FakeIO(bundle)
    spec = _spec(
        code={"uri": "s3://artifacts/bundles/vision/b.tar.gz", "digest": f"sha256:{digest}"},
        command=[sys.executable, "train.py"],
    )
    code, out, err = _run(tmp_path, spec, fake)
    assert (code, out) == (0, "trained hello\n"), err
    assert fake.fetched == ["s3://artifacts/bundles/vision/b.tar.gz"]
    assert not (tmp_path / "work" / "j-1-1").exists()  # the attempt's directory is removed


def test_bundle_digest_mismatch_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    bundle = _bundle({"train.py": f"open({str(marker)!r}, 'w').write('x')\n"})
    spec = _spec(
        code={"uri": "s3://artifacts/b.tar.gz", "digest": "sha256:" + "0" * 64},
        command=[sys.executable, "train.py"],
    )
    code, _, err = _run(tmp_path, spec, FakeIO(bundle))
    assert code == launch.EXIT_STAGING
    assert "digest" in err and "berth-launch: staging failed" in err
    assert not marker.exists()


def test_a_corrupt_zip_bundle_exits_invalid_bundle_and_nothing_runs(tmp_path: Path) -> None:
    """Finding 8b on the cloud: a broken archive is the launcher's own exit code 66 with a reason on
    stderr, never a traceback (the control plane reads 66 as the permanent ``InvalidBundle``)."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train.py", "print('never')\n" * 200)
    data = bytearray(buf.getvalue())
    start = 30 + len("train.py")
    data[start : start + 40] = b"\xff" * 40
    digest = hashlib.sha256(bytes(data)).hexdigest()
    spec = _spec(
        code={"uri": "s3://artifacts/b.zip", "digest": f"sha256:{digest}"},
        command=[sys.executable, "train.py"],
    )
    code, out, err = _run(tmp_path, spec, FakeIO(bytes(data)))
    from berth.domain.cloud import LAUNCHER_INVALID_BUNDLE_EXIT

    assert code == launch.EXIT_INVALID_BUNDLE == LAUNCHER_INVALID_BUNDLE_EXIT and out == ""
    assert "berth-launch: invalid bundle" in err and "Traceback" not in err


def test_data_is_staged_at_its_mount_and_outputs_and_checkpoints_are_synced(tmp_path: Path) -> None:
    fake = FakeIO()
    fake.data["s3://data/vision/sets/x.txt"] = b"payload"
    script = (
        "import os, pathlib\n"
        "text = pathlib.Path('data/train/x.txt').read_text()\n"
        "pathlib.Path(os.environ['BERTH_OUTPUT_DIR'], 'result.txt').write_text(text.upper())\n"
        "pathlib.Path(os.environ['BERTH_CHECKPOINT_DIR'], 'step-1').write_text('ck')\n"
    )
    spec = _spec(
        data=[{"source": "s3://data/vision/sets/x.txt", "mount": "/data/train"}],
        command=[sys.executable, "-c", script],
    )
    code, _, err = _run(tmp_path, spec, fake)
    assert code == 0, err
    assert fake.objects["vision/jobs/j-1/outputs/result.txt"] == b"PAYLOAD"
    assert fake.objects["vision/jobs/j-1/checkpoints/step-1"] == b"ck"


def test_a_retried_attempt_gets_its_checkpoints_back(tmp_path: Path) -> None:
    fake = FakeIO(objects={"vision/jobs/j-1/checkpoints/step-7": b"state"})
    script = "import os; print(open(os.path.join(os.environ['BERTH_CHECKPOINT_DIR'], 'step-7')).read())"
    code, out, err = _run(tmp_path, _spec(attempt=2, command=[sys.executable, "-c", script]), fake)
    assert (code, out) == (0, "state\n"), err


def test_the_command_exit_code_is_the_launcher_exit_code(tmp_path: Path) -> None:
    code, _, _ = _run(tmp_path, _spec(command=[sys.executable, "-c", "import sys; sys.exit(3)"]), FakeIO())
    assert code == 3


def test_a_command_past_its_timeout_exits_124(tmp_path: Path) -> None:
    spec = _spec(timeout_s=0.5, command=[sys.executable, "-c", "import time; time.sleep(60)"])
    code, _, err = _run(tmp_path, spec, FakeIO())
    assert code == launch.EXIT_TIMEOUT
    assert "timeout" in err


def test_a_missing_command_exits_127(tmp_path: Path) -> None:
    code, _, err = _run(tmp_path, _spec(command=["/nonexistent/berth-cmd"]), FakeIO())
    assert code == launch.EXIT_NOT_FOUND and "not found" in err


def test_the_job_environment_is_clean(tmp_path: Path) -> None:
    script = "import os, json; print(json.dumps(dict(os.environ)))"
    out_stream = io.StringIO()
    Launcher(
        _spec(command=[sys.executable, "-c", script]),
        io=FakeIO(),
        work_dir=tmp_path / "w",
        environ={"AWS_ACCESS_KEY_ID": "AKIA", "SECRET_OF_HOST": "x", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
        stdout=out_stream,
    ).run()
    env = json.loads(out_stream.getvalue())
    assert env["GREETING"] == "hello" and env["AWS_ACCESS_KEY_ID"] == "AKIA"
    assert env["BERTH_JOB_ID"] == "j-1" and env["BERTH_ATTEMPT"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert "SECRET_OF_HOST" not in env


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        json.dumps({"job_id": "j", "attempt": 1, "tenant": "t", "command": []}),
        json.dumps(
            {
                "job_id": "j",
                "attempt": 1,
                "tenant": "t",
                "command": ["x"],
                "code": {"uri": "s3://a/b", "digest": "md5:1"},
            }
        ),
        json.dumps(
            {"job_id": "j", "attempt": 1, "tenant": "t", "command": ["x"], "outputs": {"prefix": "p/"}}
        ),
    ],
)
def test_malformed_specs_are_refused(raw: str) -> None:
    with pytest.raises(LaunchSpecError):
        LaunchSpec.parse(raw)


def test_module_entry_point_runs_the_command_and_propagates_its_exit(tmp_path: Path) -> None:
    spec = {
        "job_id": "j-2",
        "attempt": 1,
        "tenant": "vision",
        "command": [sys.executable, "-c", "print('from launcher'); raise SystemExit(5)"],
        "timeout_s": 60,
    }
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(sys.path),
        launch.LAUNCH_ENV: json.dumps(spec),
        launch.WORK_DIR_ENV: str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "berth_agent.launch"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout == "from launcher\n"


def test_main_without_a_spec_is_a_usage_error() -> None:
    assert launch.main({}) == launch.EXIT_USAGE
