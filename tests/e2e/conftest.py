"""End-to-end fixture: `berth local up` in a subprocess, and SigV4-signing HTTP clients for its API.

    def test_something(local_cloud):
        alice = local_cloud.client("alice")
        r = alice.post("/v1/jobs", json={...})
        assert r.status == 201, r.text
        r.json()["id"]

`local_cloud` (session scope) is a `LocalCloudProcess`: `api_url`, `env` (the parsed env file),
`state_dir`, `profiles` ("alice", "bob", "admin"), `ready_seconds`, `client(profile)`, `unsigned()`,
`credentials(profile)`, `cli_env(profile)` (the environment a `berth` CLI subprocess needs) and
`client_with(credentials)` and `log_tail()`. The `start_local_cloud` fixture is the function that starts
one more (`start_local_cloud(state_dir)`, used by the lifecycle tests; stop it with `.stop()`).
"""

from __future__ import annotations

import configparser
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from berth_tools.localcloud.state_dir import DEFAULT_STATE_DIR, parse_exports

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "cdk.out" / "Berth.template.json"
#: A hang guard, not a speed target: on a machine loaded to 6x its cores `berth local up` took 63 s
#: (BERTH_E2E_READY_S / BERTH_E2E_STOP_S raise them further on a loaded machine).
READY_TIMEOUT_S = float(os.environ.get("BERTH_E2E_READY_S", "180"))
STOP_TIMEOUT_S = float(os.environ.get("BERTH_E2E_STOP_S", "30"))
PROFILES = ("alice", "bob", "admin")


#: How many times ``ApiClient.get`` asks while the tenant's rate limit answers 429.
GET_RATE_LIMITED_TRIES = 30


def _error_code(answer: Response) -> str | None:
    try:
        body = answer.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class ApiClient:
    """HTTP client for the Berth API; signs with SigV4 (service execute-api) unless credentials are None."""

    api_url: str
    region: str
    credentials: Credentials | None

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Response:
        import json as json_module

        url = self.api_url.rstrip("/") + path
        if params:
            url += "?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
        body = data if data is not None else (b"" if json is None else json_module.dumps(json).encode())
        all_headers = dict(headers or {})
        if json is not None:
            all_headers.setdefault("Content-Type", "application/json")
        if self.credentials is not None:
            signed = AWSRequest(method=method.upper(), url=url, data=body, headers=all_headers)
            SigV4Auth(self.credentials, "execute-api", self.region).add_auth(signed)
            all_headers = dict(signed.headers.items())
        request = urllib.request.Request(url, data=body or None, headers=all_headers, method=method.upper())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return Response(answer.status, dict(answer.headers.items()), answer.read())
        except urllib.error.HTTPError as exc:
            return Response(exc.code, dict(exc.headers.items()), exc.read())

    def get(self, path: str, **kwargs: Any) -> Response:
        """A read, tried again while the tenant's request rate limit answers 429 ``TooManyRequests`` (after
        its Retry-After, as a client of the API does): tests that poll read the answer, not the limit.
        Writes are not retried here: tests assert their 429s."""
        for _ in range(GET_RATE_LIMITED_TRIES - 1):
            answer = self.request("GET", path, **kwargs)
            if answer.status != 429 or _error_code(answer) != "TooManyRequests":
                return answer
            time.sleep(min(float(answer.headers.get("Retry-After") or 1), 2.0))
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> Response:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Response:
        return self.request("DELETE", path, **kwargs)


@dataclass
class LocalCloudProcess:
    process: subprocess.Popen[bytes]
    state_dir: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    ready_seconds: float = 0.0
    profiles: tuple[str, ...] = PROFILES

    @property
    def api_url(self) -> str:
        return self.env["BERTH_API_URL"]

    @property
    def region(self) -> str:
        return self.env["AWS_REGION"]

    @property
    def env_file(self) -> Path:
        return self.state_dir / "env"

    def credentials(self, profile: str) -> Credentials:
        parser = configparser.ConfigParser()
        parser.read(self.env["AWS_SHARED_CREDENTIALS_FILE"])
        section = parser[profile]
        return Credentials(section["aws_access_key_id"], section["aws_secret_access_key"])

    def client(self, profile: str) -> ApiClient:
        return ApiClient(self.api_url, self.region, self.credentials(profile))

    def aws(self, service: str, profile: str = "admin") -> Any:
        """A boto3 client of ``service`` on this local cloud's moto endpoint, as ``profile``."""
        import boto3

        creds = self.credentials(profile)
        make: Any = boto3.client  # any service by name (the stubs type each one apart)
        return make(
            service,
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name=self.region,
            aws_access_key_id=creds.access_key,
            aws_secret_access_key=creds.secret_key,
        )

    def client_with(self, credentials: Credentials | None) -> ApiClient:
        """A client signing with arbitrary (e.g. wrong) credentials; None sends unsigned requests."""
        return ApiClient(self.api_url, self.region, credentials)

    def unsigned(self) -> ApiClient:
        return ApiClient(self.api_url, self.region, None)

    def cli_env(self, profile: str | None = None) -> dict[str, str]:
        """Environment for a `berth ...` subprocess: the exports of the env file (and AWS_PROFILE)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(self.env)
        if profile is not None:
            env["AWS_PROFILE"] = profile
        return env

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGINT (Ctrl-C), then wait; returns the exit status (killed processes give a negative one)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


parse_env_file = parse_exports


def start_local_cloud(
    state_dir: Path | None, *extra_args: str, cwd: Path = REPO, log_path: Path | None = None
) -> LocalCloudProcess:
    """Run `berth local up --state-dir state_dir` in ``cwd`` and wait for its env file (READY_TIMEOUT_S).
    A relative ``state_dir`` is passed as it is (relative to ``cwd``); None passes no flag at all, so
    the default ``.berth/local`` under ``cwd`` is used, as `make up` does."""
    where = cwd / (state_dir if state_dir is not None else DEFAULT_STATE_DIR)
    log_path = log_path or where.parent / f"{where.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "berth_tools.cli.main", "local", "up"]
    if state_dir is not None:
        args += ["--state-dir", str(state_dir)]
    if TEMPLATE.exists():  # `make test-e2e` synthesises first; otherwise `berth local up` does
        args += ["--template", str(TEMPLATE)]
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "AWS_ENDPOINT_URL")}
    (where / "env").unlink(missing_ok=True)  # a killed run's: ready means this run wrote it
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args + list(extra_args), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    cloud = LocalCloudProcess(process=process, state_dir=where, log_path=log_path)
    env_file = where / "env"
    while time.monotonic() - started < READY_TIMEOUT_S:
        if env_file.exists():
            cloud.env = parse_env_file(env_file.read_text())
            cloud.ready_seconds = time.monotonic() - started
            return cloud
        if process.poll() is not None:
            raise RuntimeError(f"berth local up exited with {process.returncode}:\n{cloud.log_tail()}")
        time.sleep(0.1)
    cloud.stop()
    raise RuntimeError(f"berth local up was not ready after {READY_TIMEOUT_S}s:\n{cloud.log_tail()}")


@pytest.fixture(scope="session")
def local_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloudProcess]:
    # Scripted agents: these tests steer jobs with SCRIPTED_* env (tests/e2e/test_real_agents.py
    # runs real agent processes).
    cloud = start_local_cloud(tmp_path_factory.mktemp("berth-local") / "state", "--agent-kind", "scripted")
    try:
        yield cloud
    finally:
        status = cloud.stop()
    assert status == 0, f"berth local up exited with {status} on SIGINT:\n{cloud.log_tail()}"


@pytest.fixture(name="start_local_cloud")
def start_local_cloud_fixture() -> Iterator[Any]:
    started: list[LocalCloudProcess] = []

    def start(state_dir: Path | None, *extra_args: str, **kwargs: Any) -> LocalCloudProcess:
        cloud = start_local_cloud(state_dir, *extra_args, **kwargs)
        started.append(cloud)
        return cloud

    yield start
    for cloud in started:
        cloud.stop()


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A directory a job may write to (markers), whatever uid it runs as: when the local cloud runs as
    root, jobs run under uids of their own and cannot enter pytest's 0700 temp dirs (sticky, 1777)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="berth-test-jobs-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def log_lines(client: ApiClient, job_id: str, attempt: int, count: int, timeout: float = 20) -> list[str]:
    """An attempt's output lines through the API, polled until there are ``count`` (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": str(attempt)})
        assert r.status == 200, r.text
        lines = [e["message"] for e in r.json()["events"]]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.25)
