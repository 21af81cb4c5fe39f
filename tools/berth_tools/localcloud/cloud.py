"""`LocalCloud`: moto, the in-process Lambda runtime, the deployed stack, seeded users and the front door."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import boto3

from berth_tools.localcloud import cloudformation_deploy, gateway_config, lambda_runtime, seed, session_tokens
from berth_tools.localcloud.cloudformation_deploy import DeployedStack
from berth_tools.localcloud.front_door import FrontDoor
from berth_tools.localcloud.moto_server import MotoServer
from berth_tools.localcloud.sigv4 import signed_headers
from berth_tools.localcloud.state_dir import Profile, StateDir

DEFAULT_REGION = "us-east-1"
#: Where the readiness probe sends its signed request (any answer but 403 means routing, SigV4 and the
#: Lambda path work; a 5xx is reported as a warning: the handler itself is broken).
READINESS_PATH = "/v1/jobs"


class LocalCloudError(RuntimeError):
    pass


@dataclass
class LocalCloud:
    """The whole local cloud in this process. Use as a context manager or call start()/stop()."""

    template: dict[str, Any]
    state_dir: Path | None = None
    api_port: int = 0
    moto_port: int = 0
    region: str = DEFAULT_REGION
    stack_name: str = cloudformation_deploy.DEFAULT_STACK_NAME
    users: tuple[seed.SeedUser, ...] = seed.DEFAULT_USERS
    console: TextIO | None = None  # progress, access log and handler logs (None: quiet)
    echo_handler_logs: bool = False
    seed_writer: seed.PutMember | None = None  # tests may replace Berth's tenants repository
    moto: MotoServer | None = None
    runtime: lambda_runtime.InProcessLambdaRuntime | None = None
    stack: DeployedStack | None = None
    front_door: FrontDoor | None = None
    seeded: list[seed.SeededUser] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    ready_seconds: float = 0.0
    probe_status: int | None = None
    _state: StateDir | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> LocalCloud:
        started = time.monotonic()
        try:
            self._start(started)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started
        return self

    def _step(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.timings[name] = round(now - since, 3)
        return now

    def _start(self, t: float) -> None:
        if self.state_dir is not None:
            self._state = StateDir(self.state_dir)
            self._state.prepare()
        self.moto = MotoServer(port=self.moto_port).start()
        t = self._step("moto", t)
        self.runtime = lambda_runtime.InProcessLambdaRuntime(
            endpoint_url=self.moto.endpoint_url, echo_logs=self.console if self.echo_handler_logs else None
        )
        lambda_runtime.install(self.runtime)
        session_tokens.install()
        session = self.session()
        self.stack = cloudformation_deploy.deploy_stack(
            session, self.moto.endpoint_url, self.template, stack_name=self.stack_name
        )
        cloudformation_deploy.verify_stack(session, self.moto.endpoint_url, self.template, self.stack)
        t = self._step("deploy", t)
        self._say(
            f"deployed stack {self.stack_name}: {len(self.stack.resources)} resources, "
            f"fixes: {', '.join(self.stack.applied_fixes) or 'none'}"
            + (f"; not emulated: {', '.join(self.stack.skipped_types)}" if self.stack.skipped_types else "")
        )
        rest_api_id = self.output("ApiId")
        self.seeded = seed.create_iam_users(session, self.moto.endpoint_url, rest_api_id, self.users)
        seed.seed_tenants(
            self.seeded,
            self.output("TenantsTableName"),
            self.moto.endpoint_url,
            self.region,
            self.seed_writer,
            # Templates without a hosts table (the local cloud's own test fixtures) get no fleet.
            hosts_table=self.stack.outputs.get("HostsTableName"),
        )
        t = self._step("seed", t)
        self.front_door = FrontDoor(
            endpoint_url=self.moto.endpoint_url,
            rest_api_id=rest_api_id,
            stage=self._stage_name(rest_api_id),
            region=self.region,
            account_id=cloudformation_deploy.DEFAULT_ACCOUNT_ID,
            port=self.api_port,
            access_log=self.console,
            gateway=self._gateway_config(rest_api_id),
        ).start()
        if self._state is not None:
            self._state.write_profiles(
                [Profile(u.profile, u.access_key_id, u.secret_access_key) for u in self.seeded],
                self.region,
                self.moto.endpoint_url,
            )
        t = self._step("front_door", t)
        self.probe_status = self._probe()
        self._step("probe", t)
        if self._state is not None:
            self._state.write_env(self.exports)

    def stop(self) -> None:
        if self._state is not None:
            self._state.remove_env()
        if self.front_door is not None:
            self.front_door.stop()
            self.front_door = None
        if self.runtime is not None:
            lambda_runtime.uninstall(self.runtime)
            self.runtime = None
        if self.moto is not None:
            self.moto.stop()
            self.moto = None

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what users need -------------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        if self.moto is None:
            raise LocalCloudError("local cloud not started")
        return self.moto.endpoint_url

    @property
    def api_url(self) -> str:
        if self.front_door is None:
            raise LocalCloudError("local cloud not started")
        return self.front_door.url

    @property
    def profiles(self) -> dict[str, seed.SeededUser]:
        return {user.profile: user for user in self.seeded}

    @property
    def exports(self) -> dict[str, str]:
        if self._state is not None:
            return self._state.exports(self.api_url, self.region, self.endpoint_url)
        return {
            "BERTH_API_URL": self.api_url,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
        }

    def output(self, key: str) -> str:
        if self.stack is None or key not in self.stack.outputs:
            raise LocalCloudError(f"stack output {key} is missing")
        return self.stack.outputs[key]

    def session(self) -> boto3.session.Session:
        """A boto3 session for the local cloud's own calls to moto (static credentials, never a profile)."""
        return boto3.session.Session(
            aws_access_key_id="localcloud", aws_secret_access_key="localcloud", region_name=self.region
        )

    def request(
        self, method: str, path: str, profile: str | None = None, body: Any = None
    ) -> tuple[int, dict[str, Any] | str]:
        """Call the API like a client would (signed as `profile` unless None); returns (status, body)."""
        url = self.api_url + path
        data = b"" if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data else {}
        if profile is not None:
            user = self.profiles[profile]
            headers = signed_headers(
                method=method,
                url=url,
                access_key_id=user.access_key_id,
                secret_access_key=user.secret_access_key,
                region=self.region,
                body=data,
                headers=headers,
            )
        request = urllib.request.Request(url, data=data or None, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else {}
        except ValueError:
            return status, raw.decode(errors="replace")

    # -- internals ---------------------------------------------------------------------------------
    def _gateway_config(self, rest_api_id: str) -> gateway_config.GatewayConfig:
        """The deployed API's gateway responses and resource policy, from the template (moto drops them)."""
        assert self.stack is not None
        logical = next(
            (
                lid
                for lid, (kind, physical) in self.stack.resources.items()
                if kind == "AWS::ApiGateway::RestApi" and physical == rest_api_id
            ),
            None,
        )
        if logical is None:
            raise LocalCloudError(f"REST API {rest_api_id} is not a resource of the deployed template")
        return gateway_config.from_template(
            self.template, logical, rest_api_id, cloudformation_deploy.DEFAULT_ACCOUNT_ID, self.region
        )

    def _stage_name(self, rest_api_id: str) -> str:
        client = self.session().client("apigateway", endpoint_url=self.endpoint_url)
        stages = [s["stageName"] for s in client.get_stages(restApiId=rest_api_id).get("item", [])]
        api_url = self.stack.outputs.get("ApiUrl", "") if self.stack else ""
        for stage in stages:
            if api_url.rstrip("/").endswith("/" + stage):
                return stage
        if not stages:
            raise LocalCloudError(f"REST API {rest_api_id} has no stage")
        return stages[0]

    def _probe(self) -> int:
        first = next(iter(self.profiles))
        status, body = self.request("GET", READINESS_PATH, profile=first)
        if status == 403:
            raise LocalCloudError(f"readiness probe rejected by the front door: {body}")
        if status >= 500:
            self._say(f"warning: GET {READINESS_PATH} as {first} answered {status}: {body}")
        return status

    def _say(self, message: str) -> None:
        if self.console is not None:
            print(f"berth local: {message}", file=self.console, flush=True)


def load_template(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise LocalCloudError(f"{path} does not exist: run `make synth` (npx cdk synth) first")
    return cloudformation_deploy.load_template(path)


def stderr_console() -> TextIO:
    return sys.stderr
