"""One attempt end to end with real processes, a fake agent API and fake S3/Logs (AttemptIO)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from berth_agent.attempt import AttemptRunner
from berth_agent.client import Fenced
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.executors import FailureKind, ProcessExecutor
from berth_agent.gpus import Gpu, Inventory
from berth_agent.ledger import AttemptLedger
from berth_tools.bundle import pack

INV = Inventory(gpus=(Gpu(0, "GPU-a", "H100", 81920),), gpu_type="H100", source="simulated")


class FakeApi:
    def __init__(self, spec: dict[str, Any], attempt: int = 1, claim_error: Exception | None = None) -> None:
        self.spec, self.attempt, self.claim_error = spec, attempt, claim_error
        self.reports: list[dict[str, Any]] = []
        self.fence_started = False
        #: What the claim's answer carries as ``credentials`` (None: none, as an older control plane).
        self.claim_credentials: dict[str, str] | None = None
        self.credential_requests = 0

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        if self.claim_error is not None:
            raise self.claim_error
        return {
            "job_id": job_id,
            "attempt": attempt,
            "tenant": "vision",
            "spec": self.spec,
            "gpu_ids": ["GPU-a"],
            **({} if self.claim_credentials is None else {"credentials": self.claim_credentials}),
        }

    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        self.credential_requests += 1
        return {"AccessKeyId": "ASIA", "SecretAccessKey": "s", "SessionToken": "t"}

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        self.reports.append({"event": event, **kw})
        if event == "started" and self.fence_started:
            raise Fenced(409, "Fenced", "superseded")
        return {"directive": None}


class FakeIO:
    def __init__(
        self, bundles: dict[str, bytes] | None = None, checkpoints: dict[str, bytes] | None = None
    ) -> None:
        self.bundles = bundles or {}
        self.objects: dict[str, bytes] = dict(checkpoints or {})
        self.events: list[str] = []

    def fetch_bundle(self, tenant: str, digest: str, dest: Path) -> None:
        dest.write_bytes(self.bundles[digest])

    def stage_s3(self, uri: str, dest: Path) -> Path:
        raise AssertionError("not used")

    def list_keys(self, prefix: str) -> Iterable[str]:
        return [k for k in self.objects if k.startswith(prefix)]

    def get(self, key: str, dest: Path) -> None:
        dest.write_bytes(self.objects[key])

    def put(self, fh: BinaryIO, key: str, size: int) -> None:
        self.objects[key] = fh.read()

    def secret_value(self, name: str) -> str:
        if name != "berth/vision/wandb":
            raise KeyError(name)
        return "wandb-key"

    def logs_client(self) -> Any:
        io = self

        class Logs:
            def create_log_stream(self, **kw: Any) -> None:
                pass

            def put_log_events(self, **kw: Any) -> dict[str, Any]:
                io.events += [e["message"] for e in kw["logEvents"]]
                return {}

        return Logs()


def _bundle(tmp_path: Path, script: str) -> tuple[str, bytes]:
    src = tmp_path / "code"
    src.mkdir()
    (src / "train.py").write_text(script)
    b = pack(src)
    return b.digest, b.data


def _runner(tmp_path: Path, api: FakeApi, io: FakeIO, sync_interval_s: float = 0.2) -> AttemptRunner:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    work.chmod(0o711)
    cfg = AgentConfig(
        api_url="http://x",
        pool="p",
        host_id="h",
        work_dir=work,
        limits=JobLimits(uid_range=None),
        cancel_grace_s=1,
    )

    def io_for(creds: Mapping[str, Any]) -> FakeIO:
        assert creds["AccessKeyId"] == "ASIA"
        return io

    return AttemptRunner(
        config=cfg,
        inventory=INV,
        api=api,
        executor=ProcessExecutor(),
        ledger=AttemptLedger(work),
        io_for=io_for,
        sync_interval_s=sync_interval_s,
        tick_s=0.05,
    )


MSG = {"job_id": "j-1", "attempt": 1, "fencing_token": "tok"}


def _spec(digest: str, **kw: Any) -> dict[str, Any]:
    return {"name": "t", "code": f"sha256:{digest}", "command": [sys.executable, "train.py"], **kw}


def test_a_code_job_runs_ships_logs_syncs_outputs_and_reports(tmp_path: Path) -> None:
    script = (
        "import os, pathlib\n"
        "print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "e = os.environ\n"
        "import botocore.session\n"
        "c = botocore.session.Session().get_credentials().get_frozen_credentials()\n"
        "print(c.access_key, c.token, e['WANDB_API_KEY'], 'AWS_ACCESS_KEY_ID' in e)\n"
        "pathlib.Path(os.environ['BERTH_OUTPUT_DIR'], 'model.txt').write_text('weights')\n"
        "pathlib.Path(os.environ['BERTH_CHECKPOINT_DIR'], 'step-1').write_text('1')\n"
    )
    digest, data = _bundle(tmp_path, script)
    api, io = FakeApi(_spec(digest, secrets={"WANDB_API_KEY": "berth/vision/wandb"})), FakeIO({digest: data})
    runner = _runner(tmp_path, api, io)
    outcome = runner.run(MSG)
    assert outcome.ran and outcome.result is not None and outcome.result.succeeded
    assert [r["event"] for r in api.reports] == ["started", "succeeded"]
    assert api.credential_requests == 1  # the claim came without them
    # the job's SDK finds the attempt's credentials through AWS_CONFIG_FILE's credential_process
    assert io.events == ["gpus GPU-a", "ASIA t wandb-key False"]
    assert io.objects["vision/jobs/j-1/outputs/model.txt"] == b"weights"
    assert io.objects["vision/jobs/j-1/checkpoints/step-1"] == b"1"
    assert runner.running() == [] and runner.ledger.entries() == []
    assert list((tmp_path / "work").iterdir()) == [tmp_path / "work" / ".attempts"]  # job dir removed


def test_credentials_that_come_with_the_claim_are_used_without_a_request(tmp_path: Path) -> None:
    """A claim answer with the attempt's credentials: the job and the agent's I/O use them, and the
    agent makes no ``/v1/agent/credentials`` request (an older control plane's claim, without them,
    is the test above: one request)."""
    script = (
        "import botocore.session\n"
        "c = botocore.session.Session().get_credentials().get_frozen_credentials()\n"
        "print(c.access_key, c.token)\n"
    )
    digest, data = _bundle(tmp_path, script)
    api, io = FakeApi(_spec(digest)), FakeIO({digest: data})
    api.claim_credentials = {
        "AccessKeyId": "ASIA",
        "SecretAccessKey": "s",
        "SessionToken": "from-claim",
        "Expiration": "2099-01-01T00:00:00Z",
    }
    outcome = _runner(tmp_path, api, io).run(MSG)
    assert outcome.ran and outcome.result is not None and outcome.result.succeeded
    assert io.events == ["ASIA from-claim"]
    assert api.credential_requests == 0


def _corrupt_zip(tmp_path: Path) -> bytes:
    """A zip whose directory is sound but whose member's compressed data is garbage (as a truncated
    or damaged upload leaves it): ``is_zipfile`` says yes, extracting it fails."""
    import io as _io
    import zipfile

    buf = _io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("train.py", "print('never')\n" * 200)
    data = bytearray(buf.getvalue())
    start = 30 + len("train.py")  # the first member's data, after its local header
    data[start : start + 40] = b"\xff" * 40
    return bytes(data)


def test_a_corrupt_zip_bundle_fails_at_once_as_invalid_bundle(tmp_path: Path) -> None:
    """Finding 8b: a corrupt zip is reported (permanent ``invalid_bundle``) and frees the GPU at once,
    rather than escaping the attempt and ending as a heartbeat timeout."""
    import hashlib

    data = _corrupt_zip(tmp_path)
    digest = hashlib.sha256(data).hexdigest()
    api, io = FakeApi(_spec(digest)), FakeIO({digest: data})
    runner = _runner(tmp_path, api, io)
    outcome = runner.run(MSG)
    assert not outcome.ran and outcome.result is not None
    assert outcome.result.failure is FailureKind.INVALID_BUNDLE
    assert [(r["event"], r["failure"]) for r in api.reports] == [("failed", "invalid_bundle")]
    assert "broken archive" in api.reports[0]["message"]
    assert runner.running() == [] and runner.ledger.entries() == [] and io.events == []


def test_a_retried_attempt_gets_its_checkpoints_back(tmp_path: Path) -> None:
    script = "import os; print(open(os.path.join(os.environ['BERTH_CHECKPOINT_DIR'], 'step-7')).read())"
    digest, data = _bundle(tmp_path, script)
    io = FakeIO({digest: data}, {"vision/jobs/j-1/checkpoints/step-7": b"resumed"})
    api = FakeApi(_spec(digest))
    outcome = _runner(tmp_path, api, io).run({**MSG, "attempt": 2})
    assert outcome.result is not None and outcome.result.succeeded and io.events == ["resumed"]


def test_a_bundle_with_the_wrong_digest_never_runs(tmp_path: Path) -> None:
    digest, _ = _bundle(tmp_path, "print('never')")
    api, io = FakeApi(_spec(digest)), FakeIO({digest: b"tampered"})
    outcome = _runner(tmp_path, api, io).run(MSG)
    assert not outcome.ran and outcome.result is not None and outcome.result.failure is FailureKind.STAGING
    assert [(r["event"], r["failure"]) for r in api.reports] == [("failed", "staging")]
    assert io.events == []


def test_a_claim_refused_runs_nothing_and_reports_nothing(tmp_path: Path) -> None:
    api = FakeApi({}, claim_error=Fenced(409, "Fenced", "no"))
    outcome = _runner(tmp_path, api, FakeIO()).run(MSG)
    assert not outcome.ran and outcome.reason == "Fenced" and api.reports == []


def test_failure_is_classified_and_reported(tmp_path: Path) -> None:
    digest, data = _bundle(tmp_path, "import sys; print('bad', file=sys.stderr); sys.exit(4)")
    api = FakeApi(_spec(digest))
    _runner(tmp_path, api, FakeIO({digest: data})).run(MSG)
    final = api.reports[-1]
    assert final["event"] == "failed" and final["exit_code"] == 4 and final["failure"] == "nonzero_exit"


def test_cancel_directive_stops_the_job(tmp_path: Path) -> None:
    digest, data = _bundle(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    api, io = FakeApi(_spec(digest)), FakeIO({digest: data})
    runner = _runner(tmp_path, api, io)
    outcomes: list[Any] = []
    t = threading.Thread(target=lambda: outcomes.append(runner.run(MSG)))
    t.start()
    deadline = time.monotonic() + 10
    while not (api.reports and runner.running()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runner.running() == [{"job_id": "j-1", "attempt": 1, "fencing_token": "tok"}]
    runner.cancel("j-1", 1, grace_s=0.5)
    t.join(10)
    assert outcomes and outcomes[0].result.failure is FailureKind.CANCELED
    assert api.reports[-1]["event"] == "canceled" and api.reports[-1]["failure"] is None


def test_fenced_at_start_stops_the_job_at_once(tmp_path: Path) -> None:
    digest, data = _bundle(tmp_path, "import time; time.sleep(60)")
    api = FakeApi(_spec(digest))
    api.fence_started = True
    t0 = time.monotonic()
    outcome = _runner(tmp_path, api, FakeIO({digest: data})).run(MSG)
    assert time.monotonic() - t0 < 10
    assert outcome.result is not None and outcome.result.failure is FailureKind.CANCELED
    assert outcome.reason == "Fenced" and [r["event"] for r in api.reports] == ["started"]  # nothing after


@pytest.mark.parametrize("gpu_ids", [["GPU-other"]])
def test_gpus_not_ours_are_an_agent_error(tmp_path: Path, gpu_ids: list[str]) -> None:
    digest, data = _bundle(tmp_path, "print(1)")
    api = FakeApi(_spec(digest))
    api.claim = lambda *a: {  # type: ignore[method-assign]
        "job_id": "j-1",
        "attempt": 1,
        "tenant": "vision",
        "spec": _spec(digest),
        "gpu_ids": gpu_ids,
    }
    outcome = _runner(tmp_path, api, FakeIO({digest: data})).run(MSG)
    assert not outcome.ran and api.reports[-1]["failure"] == "agent_error"


def test_another_tenants_or_unreadable_secret_stops_before_running(tmp_path: Path) -> None:
    digest, data = _bundle(tmp_path, "print('never')")
    for name, failure in (("berth/nlp/token", "agent_error"), ("berth/vision/missing", "staging")):
        api = FakeApi(_spec(digest, secrets={"TOKEN": name}))
        io = FakeIO({digest: data})
        outcome = _runner(tmp_path, api, io).run(MSG)
        assert not outcome.ran and api.reports[-1]["failure"] == failure and io.events == []


def test_without_a_credentials_route_plain_jobs_still_run(tmp_path: Path) -> None:
    from berth_agent.client import AgentApiError

    def no_route(*a: Any) -> Any:
        raise AgentApiError(404, "NotFound", "no route POST /v1/agent/credentials")

    plain = {
        "name": "t",
        "image": "local/none",
        "command": [sys.executable, "-c", "import os; print('AWS' in str(os.environ))"],
    }
    api = FakeApi(plain)
    api.credentials = no_route  # type: ignore[method-assign, assignment]
    runner = AttemptRunner(
        config=_runner(tmp_path, api, FakeIO()).config,
        inventory=INV,
        api=api,
        executor=ProcessExecutor(),
        ledger=AttemptLedger(tmp_path / "work"),
        io_for=lambda creds: pytest.fail("no credentials, no AWS I/O"),
        tick_s=0.05,
    )
    outcome = runner.run(MSG)
    assert outcome.ran and outcome.result is not None and outcome.result.succeeded
    digest, _ = _bundle(tmp_path, "print('never')")
    api.spec = _spec(digest)
    outcome = runner.run(MSG)
    assert not outcome.ran and api.reports[-1]["failure"] == "staging"


def test_credentials_refused_is_an_agent_error_reported(tmp_path: Path) -> None:
    from berth_agent.client import AgentApiError

    digest, data = _bundle(tmp_path, "print('never')")
    api = FakeApi(_spec(digest))

    def no_route(*a: Any) -> Any:
        raise AgentApiError(403, "Forbidden", "not this host's attempt")

    api.credentials = no_route  # type: ignore[method-assign, assignment]
    runner = _runner(tmp_path, api, FakeIO({digest: data}))
    outcome = runner.run(MSG)
    assert not outcome.ran and api.reports[-1]["failure"] == "agent_error"
    assert runner.ledger.entries() == []


def test_usage_is_sampled_while_the_job_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from berth_agent.usage import UsageSampler

    digest, data = _bundle(tmp_path, "import time\nx = bytearray(30 * 1024 * 1024)\ntime.sleep(1.5)\n")
    api = FakeApi(_spec(digest))
    base = _runner(tmp_path, api, FakeIO({digest: data}))
    runner = AttemptRunner(
        config=base.config,
        inventory=INV,
        api=api,
        executor=ProcessExecutor(),
        ledger=base.ledger,
        io_for=base.io_for,
        tick_s=0.05,
        sampler=UsageSampler(),
        sample_interval_s=0.2,
    )
    with caplog.at_level("INFO", logger="berth_agent.attempt"):
        outcome = runner.run(MSG)
    assert outcome.result is not None and outcome.result.succeeded
    samples = [r.usage for r in caplog.records if r.getMessage() == "usage"]  # type: ignore[attr-defined]
    live = [s for s in samples if s["processes"] >= 1]  # a sample may land as the process exits
    assert len(live) >= 2 and max(s["rss_bytes"] for s in live) > 30 * 1024 * 1024
    assert runner.usage == {}


def test_usage_samples_reach_the_metrics_route_before_the_final_report(tmp_path: Path) -> None:
    from berth_agent.metricship import MetricsShipper
    from berth_agent.usage import UsageSampler

    digest, data = _bundle(tmp_path, "import time\nx = bytearray(20 * 1024 * 1024)\ntime.sleep(1.0)\n")
    order: list[str] = []

    class Api(FakeApi):
        def metrics(self, job_id: str, attempt: int, token: str, samples: list[dict[str, Any]]) -> Any:
            order.append(f"metrics:{len(samples)}")
            self.sent = [*getattr(self, "sent", []), *samples]
            return {"stored": len(samples)}

        def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
            order.append(f"report:{event}")
            return super().report(job_id, attempt, fencing_token, event, **kw)

    api = Api(_spec(digest))
    base = _runner(tmp_path, api, FakeIO({digest: data}))
    # The sender thread never sends on its own here: what arrives came from the flush.
    ship = MetricsShipper(api, send_interval_s=3600)
    runner = AttemptRunner(
        config=base.config,
        inventory=INV,
        api=api,
        executor=ProcessExecutor(),
        ledger=base.ledger,
        io_for=base.io_for,
        tick_s=0.05,
        sampler=UsageSampler(),
        sample_interval_s=0.2,
        metrics=ship,
    )
    outcome = runner.run(MSG)
    assert outcome.result is not None and outcome.result.succeeded
    assert order[0] == "report:started" and order[-1] == "report:succeeded"
    assert order[-2].startswith("metrics:") and all(not o.startswith("report") for o in order[1:-1])
    assert max(s["rss_mib"] for s in api.sent) > 20
    assert ship.pending((MSG["job_id"], MSG["attempt"])) == 0
    ship.close()


def test_a_flood_through_the_runner_arrives_whole_with_the_buffer_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40,000 lines from a real job through ``AttemptRunner`` (the agent's own path: reader threads,
    shipper, a logs client) with the default 8 MiB buffer: every line arrives, in order, and the
    shipper never held more than its bound. The job writes them faster than any sink drains, so the
    count is one the buffer holds whole (about 180 bytes a line as the shipper counts them) even if
    nothing is sent before the job ends; dropping under a stalled sink is tested in test_logship.py."""
    from berth_agent import logship

    shippers: list[logship.LogShipper] = []

    class Recorded(logship.LogShipper):
        def start(self) -> None:
            shippers.append(self)
            super().start()

    monkeypatch.setattr(logship, "LogShipper", Recorded)
    n = 40_000
    api = FakeApi({"name": "flood", "image": "python:3.11-slim", "command": ["seq", str(n)]})
    io = FakeIO()
    outcome = _runner(tmp_path, api, io).run(MSG)
    assert outcome.result is not None and outcome.result.succeeded
    assert io.events == [str(i) for i in range(1, n + 1)]
    (shipper,) = shippers
    bound = shipper.max_buffer_bytes
    assert bound == 8 * 1024 * 1024 and shipper.stats.dropped_lines == 0
    assert 0 < shipper.stats.peak_buffered_bytes <= bound


class _WitnessIO(FakeIO):
    """Records, for each checkpoint upload, whether the job's process was still alive then."""

    def __init__(self, bundles: dict[str, bytes]) -> None:
        super().__init__(bundles)
        self.alive_at_put: dict[str, bool] = {}

    def put(self, fh: BinaryIO, key: str, size: int) -> None:
        super().put(fh, key, size)
        if key.endswith("/on-term"):
            pid = int(self.objects[key])
            try:
                os.kill(pid, 0)
                self.alive_at_put[key] = True
            except ProcessLookupError:
                self.alive_at_put.setdefault(key, False)


def test_the_last_synced_checkpoint_is_offered_to_the_heartbeat(tmp_path: Path) -> None:
    script = (
        "import os, pathlib, time\n"
        "(pathlib.Path(os.environ['BERTH_CHECKPOINT_DIR']) / 'step-1').write_text('x' * 10)\n"
        "time.sleep(60)\n"
    )
    digest, data = _bundle(tmp_path, script)
    api, io = FakeApi(_spec(digest)), FakeIO({digest: data})
    runner = _runner(tmp_path, api, io)
    outcomes: list[Any] = []
    t = threading.Thread(target=lambda: outcomes.append(runner.run(MSG)))
    t.start()
    deadline = time.monotonic() + 20
    while not runner.checkpoints() and time.monotonic() < deadline:
        time.sleep(0.02)
    [ckpt] = runner.checkpoints()
    assert (ckpt["job_id"], ckpt["attempt"], ckpt["fencing_token"], ckpt["size_bytes"]) == (
        "j-1",
        1,
        "tok",
        10,
    )
    runner.cancel("j-1", 1, grace_s=0)
    t.join(30)
    assert api.reports[-1]["checkpoint"] == {"at": ckpt["at"], "size_bytes": 10}
    assert runner.checkpoints() == []


def test_a_stopped_job_gets_its_grace_and_its_checkpoint_is_synced_before_the_kill(tmp_path: Path) -> None:
    # The job checkpoints 1.5 s after SIGTERM (longer than the agent's cancel_grace_s of 1 s, well
    # within the spec's 5 s) and then ignores the signal: only the spec's grace lets it write, and
    # (no periodic sync in this test) only the syncs while it stops upload it while it still lives.
    script = (
        "import os, pathlib, signal, time\n"
        "d = pathlib.Path(os.environ['BERTH_CHECKPOINT_DIR'])\n"
        "def term(*a):\n"
        "    time.sleep(1.5)\n"
        "    (d / 'on-term').write_text(str(os.getpid()))\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "(d / 'step-1').write_text('x' * 10)\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )
    digest, data = _bundle(tmp_path, script)
    api, io = FakeApi(_spec(digest, checkpoint={"grace_seconds": 5})), _WitnessIO({digest: data})
    runner = _runner(tmp_path, api, io, sync_interval_s=3600)
    outcomes: list[Any] = []
    t = threading.Thread(target=lambda: outcomes.append(runner.run(MSG)))
    t.start()
    deadline = time.monotonic() + 20
    ready = tmp_path / "work" / "j-1-1" / "checkpoints" / "step-1"  # written once its handler is set
    while not (ready.exists() and runner.running()) and time.monotonic() < deadline:
        time.sleep(0.02)
    runner.cancel("j-1", 1)  # a directive: no grace of its own, so the spec's
    t.join(30)
    assert outcomes and outcomes[0].result.failure is FailureKind.CANCELED
    key = "vision/jobs/j-1/checkpoints/on-term"
    assert io.alive_at_put.get(key) is True, io.alive_at_put
    final = api.reports[-1]
    assert final["event"] == "canceled"
    assert final["checkpoint"]["size_bytes"] == 10 + len(io.objects[key])


def test_without_a_checkpoint_policy_the_agents_grace_applies(tmp_path: Path) -> None:
    script = (
        "import os, pathlib, signal, time\n"
        "d = pathlib.Path(os.environ['BERTH_CHECKPOINT_DIR'])\n"
        "def term(*a):\n"
        "    time.sleep(4)\n"
        "    (d / 'on-term').write_text(str(os.getpid()))\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )
    digest, data = _bundle(tmp_path, script)
    api, io = FakeApi(_spec(digest)), _WitnessIO({digest: data})
    runner = _runner(tmp_path, api, io)  # cancel_grace_s=1: killed before it writes
    outcomes: list[Any] = []
    t = threading.Thread(target=lambda: outcomes.append(runner.run(MSG)))
    t.start()
    deadline = time.monotonic() + 20
    while not (api.reports and runner.running()) and time.monotonic() < deadline:
        time.sleep(0.02)
    runner.cancel("j-1", 1)
    t.join(30)
    assert outcomes and outcomes[0].result.failure is FailureKind.CANCELED
    assert "vision/jobs/j-1/checkpoints/on-term" not in io.objects
    assert "checkpoint" not in api.reports[-1]  # nothing was ever checkpointed
