"""Refreshing an attempt's credentials before they expire: for the agent's own I/O and for the job's
SDK (credential_process), tested with a short expiry and real job processes."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from berth_agent.attempt import AttemptRunner
from berth_agent.attempt_credentials import AttemptCredentials, CredentialsFile, expiration
from berth_agent.client import Fenced, Unreachable
from berth_agent.config import AgentConfig, JobLimits
from berth_agent.executors import ProcessExecutor
from berth_agent.ledger import AttemptLedger
from tests.unit.agent.test_attempt import INV, FakeIO


def _creds(n: int, expires: datetime | None) -> dict[str, Any]:
    out: dict[str, Any] = {"AccessKeyId": f"ASIA-{n}", "SecretAccessKey": f"s-{n}", "SessionToken": f"t-{n}"}
    if expires is not None:
        out["Expiration"] = expires.isoformat().replace("+00:00", "Z")
    return out


T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0.timestamp()

    def __call__(self) -> float:
        return self.now


def test_refresh_is_due_at_half_the_lifetime_at_most_ten_minutes_before() -> None:
    clock, fetched, taken = Clock(), [], []

    def fetch() -> Mapping[str, Any]:
        fetched.append(1)
        return _creds(len(fetched) + 1, T0 + timedelta(hours=2))

    short = AttemptCredentials(
        _creds(1, T0 + timedelta(minutes=15)), fetch, on_refresh=taken.append, clock=clock
    )
    assert short.refresh_at == (T0 + timedelta(seconds=450)).timestamp()
    clock.now += 449
    assert not short.maybe_refresh() and fetched == []
    clock.now += 1
    assert short.maybe_refresh() and [c["AccessKeyId"] for c in taken] == ["ASIA-2"]
    # the new set lasts until T0+2h, seen from T0+450 s: refresh 10 min before its end
    assert short.refresh_at == (T0 + timedelta(hours=2) - timedelta(minutes=10)).timestamp()
    assert short.current["AccessKeyId"] == "ASIA-2" and short.refreshes == 1
    assert AttemptCredentials(_creds(1, None), fetch, on_refresh=taken.append).refresh_at is None
    assert expiration({"Expiration": "not a date"}) is None


def test_a_failed_refresh_keeps_the_old_set_and_retries_fenced_is_raised() -> None:
    clock, answers = Clock(), [Unreachable(503, "ServiceUnavailable", "later")]

    def fetch() -> Mapping[str, Any]:
        if answers:
            raise answers.pop(0)
        return _creds(2, T0 + timedelta(hours=1))

    taken: list[Mapping[str, Any]] = []
    c = AttemptCredentials(
        _creds(1, T0 + timedelta(seconds=60)), fetch, on_refresh=taken.append, clock=clock, retry_s=5
    )
    clock.now += 30
    assert not c.maybe_refresh() and c.current["AccessKeyId"] == "ASIA-1"
    assert c.refresh_at == clock.now + 5
    clock.now += 5
    assert c.maybe_refresh() and c.current["AccessKeyId"] == "ASIA-2"
    answers.append(Fenced(409, "Fenced", "superseded"))
    clock.now = (T0 + timedelta(hours=1)).timestamp()
    with pytest.raises(Fenced):
        c.maybe_refresh()


def test_the_job_sdk_reads_the_file_and_a_planted_link_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    f = CredentialsFile(work, "eu-west-1")
    f.write(_creds(1, datetime.now(UTC) + timedelta(hours=1)))
    assert f.env() == {
        "AWS_CONFIG_FILE": str(work / ".aws" / "config"),
        "AWS_SDK_LOAD_CONFIG": "1",
        "AWS_REGION": "eu-west-1",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    assert (work / ".aws" / "credentials.json").stat().st_mode & 0o777 == 0o600
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(f.config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    creds = botocore.session.Session().get_credentials()
    assert creds.method == "custom-process" and creds.get_frozen_credentials().access_key == "ASIA-1"
    # a job that owns its work dir plants links: the file itself is replaced, never written through
    victim = tmp_path / "victim"
    victim.write_text("host file")
    (work / ".aws" / "credentials.json").unlink()
    (work / ".aws" / "credentials.json").symlink_to(victim)
    f.write(_creds(2, None))
    assert victim.read_text() == "host file" and not (work / ".aws" / "credentials.json").is_symlink()
    # and the directory swapped for a link to elsewhere is refused
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(work / ".aws", tmp_path / "old-aws")
    (work / ".aws").symlink_to(elsewhere)
    with pytest.raises(OSError):
        f.write(_creds(3, None))
    assert list(elsewhere.iterdir()) == []


class RefreshingApi:
    """Vends a new set on every call, each expiring ``lifetime`` from now."""

    def __init__(self, spec: dict[str, Any], lifetime: timedelta) -> None:
        self.spec, self.lifetime = spec, lifetime
        self.vended = 0
        self.reports: list[str] = []
        self.lock = threading.Lock()

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return {
            "job_id": job_id,
            "attempt": attempt,
            "tenant": "vision",
            "spec": self.spec,
            "gpu_ids": ["GPU-a"],
        }

    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        with self.lock:
            self.vended += 1
            return _creds(self.vended, datetime.now(UTC) + self.lifetime)

    def report(self, job_id: str, attempt: int, fencing_token: str, event: str, **kw: Any) -> Any:
        self.reports.append(event)
        return {"directive": None}


#: Uses one SDK session for its whole life (as a training loop's S3 client would) and prints the
#: access key it would sign with, twice a second, then writes an output file.
LONG_JOB = """
import os, pathlib, time
import botocore.session
creds = botocore.session.Session().get_credentials()
for _ in range(int(os.environ["TICKS"])):
    print(creds.get_frozen_credentials().access_key, flush=True)
    time.sleep(0.5)
pathlib.Path(os.environ["BERTH_OUTPUT_DIR"], "done").write_text("ok")
"""


def test_a_long_job_and_the_agent_move_to_fresh_credentials_before_expiry(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o711)
    spec = {
        "name": "long",
        "image": "python:3.11-slim",
        "command": [sys.executable, "-c", LONG_JOB],
        "env": {"TICKS": "8"},
    }
    api = RefreshingApi(spec, lifetime=timedelta(seconds=2))
    ios: dict[str, FakeIO] = {}

    def io_for(creds: Mapping[str, Any]) -> FakeIO:
        return ios.setdefault(str(creds["AccessKeyId"]), FakeIO())

    cfg = AgentConfig(
        api_url="http://x", pool="p", host_id="h", work_dir=work, limits=JobLimits(uid_range=None)
    )
    runner = AttemptRunner(
        config=cfg,
        inventory=INV,
        api=api,
        executor=ProcessExecutor(),
        ledger=AttemptLedger(work),
        io_for=io_for,
        sync_interval_s=60,
        tick_s=0.05,
    )
    outcome = runner.run({"job_id": "j-1", "attempt": 1, "fencing_token": "tok"})
    assert outcome.result is not None and outcome.result.succeeded, outcome
    assert api.reports == ["started", "succeeded"]
    assert api.vended >= 3  # a 2 s set is refreshed every second over a 4 s job
    seen = [line for io in ios.values() for line in io.events]
    keys = [k for k in seen if k.startswith("ASIA-")]
    assert len(keys) == 8 and len(set(keys)) >= 3, keys  # the job's one session saw new sets
    numbers = [int(k.split("-")[1]) for k in keys]
    assert numbers == sorted(numbers)
    # the agent's own writes moved too: the output went up with a later set than the first
    (uploader,) = [name for name, io in ios.items() if "vision/jobs/j-1/outputs/done" in io.objects]
    assert uploader != "ASIA-1"
    # and the log lines were shipped by more than one set's client
    assert len([io for io in ios.values() if io.events]) >= 2


@pytest.mark.skipif(os.geteuid() != 0, reason="per-job uids need root")
def test_a_refreshed_file_stays_the_jobs_own(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    f = CredentialsFile(work, "eu-west-1")
    f.write(_creds(1, None))
    for path in (work, f.dir, f.json, f.config):  # what the process executor does at start
        os.chown(path, 3_000_400, 3_000_400)
    f.write(_creds(2, None))  # a refresh, by the root agent
    for path in (f.json, f.config):
        st = path.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (3_000_400, 3_000_400, 0o600)
    assert '"ASIA-2"' in f.json.read_text()
