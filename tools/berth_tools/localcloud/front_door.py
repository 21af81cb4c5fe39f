"""The API's front door: what API Gateway does for a REST API with AWS_IAM methods and Lambda proxies.

moto stores REST APIs but neither enforces AWS_IAM nor executes proxy integrations. The front door is a
threaded HTTP server on 127.0.0.1 that serves one deployed stage at `http://127.0.0.1:<port>/<stage>`:

1. routes by the deployed REST API (its resources and methods as moto's API Gateway returns them;
   literal path parts beat `{param}`, which beats `{proxy+}`, like API Gateway);
2. for `AWS_IAM` methods verifies SigV4 (`berth_tools.localcloud.sigv4`) and answers 403 otherwise,
   then evaluates the API's resource policy (`resource_policy`) and answers ACCESS_DENIED on a deny;
3. builds the REST API Lambda proxy event (`build_proxy_event`) and invokes the integration's function
   through moto's Lambda Invoke API (which `lambda_runtime` serves in-process);
4. maps the proxy response back to HTTP; a function error or a malformed response is a 502
   "Internal server error" like API Gateway.

Every refusal is the gateway response the template defines for its type (`gateway_config`), with
the type's status code, like API Gateway: MISSING_AUTHENTICATION_TOKEN, INVALID_SIGNATURE,
EXPIRED_TOKEN, ACCESS_DENIED, REQUEST_TOO_LARGE, RESOURCE_NOT_FOUND, INTEGRATION_FAILURE.

Deliberate differences, each documented in docs/local-cloud.md: unknown paths and methods answer 404
RESOURCE_NOT_FOUND (API Gateway answers 403 "Missing Authentication Token"), header names reach the
handler in canonical capitalisation (WSGI does not keep the client's case), and only
`AWS_PROXY`/`AWS_IAM`/`NONE` are implemented.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import boto3
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from berth_tools.localcloud import faults, metering, resource_policy
from berth_tools.localcloud.gateway_config import GatewayConfig
from berth_tools.localcloud.moto_server import LOCAL_HOST
from berth_tools.localcloud.moto_transport import InProcessTransport
from berth_tools.localcloud.sigv4 import Principal, SignatureError, verify_request

#: Outside any stage: the local cloud's process id and memory, for `berth bench api` (127.0.0.1 only).
LOCAL_STATS_PATH = "/_local/stats"
#: API Gateway's payload limit for REST APIs.
MAX_BODY_BYTES = 10 * 1024 * 1024
#: How much of a refused oversized body is read (and dropped) before the 413 is sent: a server that
#: answers and closes while the client is still sending leaves the client with a broken pipe instead of
#: the answer. A body declared larger than this is answered without reading it all.
DISCARD_LIMIT_BYTES = 4 * MAX_BODY_BYTES
_LAMBDA_URI = re.compile(
    r"arn:[^:]+:apigateway:[^:]+:lambda:path/[^/]+/functions/(?P<function>.+)/invocations$"
)


@dataclass(frozen=True)
class Method:
    http_method: str
    authorization_type: str
    integration_type: str | None
    integration_uri: str | None

    @property
    def function_arn(self) -> str | None:
        match = _LAMBDA_URI.match(self.integration_uri or "")
        return match["function"] if match else None


@dataclass(frozen=True)
class Route:
    resource_id: str
    path: str  # the resource path template, e.g. /v1/jobs/{id}
    methods: dict[str, Method]

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(part for part in self.path.split("/") if part)

    def match(self, segments: list[str]) -> tuple[tuple[int, ...], dict[str, str]] | None:
        """Return (specificity, path parameters) when `segments` match this template."""
        template = self.segments
        params: dict[str, str] = {}
        score: list[int] = []
        for i, part in enumerate(template):
            if part.startswith("{") and part.endswith("+}"):
                rest = segments[i:]
                if not rest:
                    return None
                params[part[1:-2]] = "/".join(rest)
                score.append(0)
                return (*score, *([0] * 64))[:64], params
            if i >= len(segments):
                return None
            if part.startswith("{") and part.endswith("}"):
                params[part[1:-1]] = segments[i]
                score.append(1)
            elif part == segments[i]:
                score.append(2)
            else:
                return None
        if len(segments) != len(template):
            return None
        return (*score, *([3] * 64))[:64], params


class RouteTable:
    """The resources and methods of one deployed REST API, as moto's API Gateway reports them."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes

    @classmethod
    def load(cls, session: boto3.session.Session, endpoint_url: str, rest_api_id: str) -> RouteTable:
        client = session.client("apigateway", endpoint_url=endpoint_url)
        items = client.get_resources(restApiId=rest_api_id, limit=500, embed=["methods"])["items"]
        routes = []
        for item in items:
            methods = {}
            for verb, spec in (item.get("resourceMethods") or {}).items():
                integration = spec.get("methodIntegration") or {}
                methods[verb.upper()] = Method(
                    http_method=verb.upper(),
                    authorization_type=spec.get("authorizationType", "NONE"),
                    integration_type=integration.get("type"),
                    integration_uri=integration.get("uri"),
                )
            routes.append(Route(resource_id=item["id"], path=item["path"], methods=methods))
        return cls(routes)

    def resolve(self, path: str) -> tuple[Route, dict[str, str]] | None:
        segments = [part for part in path.split("/") if part]
        best: tuple[tuple[int, ...], Route, dict[str, str]] | None = None
        for route in self.routes:
            found = route.match(segments)
            if found is not None and (best is None or found[0] > best[0]):
                best = (found[0], route, found[1])
        return (best[1], best[2]) if best else None


def build_proxy_event(
    *,
    request: Request,
    body: bytes,
    route: Route,
    path: str,
    path_parameters: dict[str, str],
    stage: str,
    api_id: str,
    account_id: str,
    request_id: str,
    principal: Principal | None,
    stage_variables: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The event API Gateway sends to a Lambda proxy integration of a REST API (payload format 1.0)."""
    now = datetime.now(UTC)
    source_ip = request.remote_addr or "127.0.0.1"
    trace_id = f"Root=1-{int(now.timestamp()):08x}-{uuid.uuid4().hex[:24]}"
    extra = {
        "X-Forwarded-For": source_ip,
        "X-Forwarded-Port": str(request.environ.get("SERVER_PORT", "")),
        "X-Forwarded-Proto": request.scheme,
        "X-Amzn-Trace-Id": trace_id,
    }
    multi_headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        multi_headers.setdefault(name, []).append(value)
    for name, value in extra.items():
        multi_headers[name] = [value]
    headers = {name: values[-1] for name, values in multi_headers.items()}
    multi_query = {key: request.args.getlist(key) for key in request.args}
    text_body: str | None
    is_base64 = False
    if not body:
        text_body = None
    else:
        try:
            text_body = body.decode("utf-8")
        except UnicodeDecodeError:
            text_body = base64.b64encode(body).decode()
            is_base64 = True
    identity: dict[str, Any] = {
        "cognitoIdentityPoolId": None,
        "cognitoIdentityId": None,
        "cognitoAuthenticationType": None,
        "cognitoAuthenticationProvider": None,
        "principalOrgId": None,
        "apiKey": None,
        "apiKeyId": None,
        "accessKey": principal.access_key if principal else None,
        "accountId": principal.account_id if principal else None,
        "caller": principal.user_id if principal else None,
        "user": principal.user_id if principal else None,
        "userArn": principal.arn if principal else None,
        "sourceIp": source_ip,
        "userAgent": request.headers.get("User-Agent"),
    }
    return {
        "resource": route.path,
        "path": path,
        "httpMethod": request.method,
        "headers": headers or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": {key: values[-1] for key, values in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": path_parameters or None,
        "stageVariables": stage_variables or None,
        "requestContext": {
            "resourceId": route.resource_id,
            "resourcePath": route.path,
            "httpMethod": request.method,
            "extendedRequestId": request_id.replace("-", "")[:16] + "=",
            "requestTime": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "path": f"/{stage}{path}",
            "accountId": account_id,
            "protocol": request.environ.get("SERVER_PROTOCOL", "HTTP/1.1"),
            "stage": stage,
            "domainPrefix": request.host.split(":")[0].split(".")[0],
            "requestTimeEpoch": int(now.timestamp() * 1000),
            "requestId": request_id,
            "identity": identity,
            "domainName": request.host,
            "apiId": api_id,
        },
        "body": text_body,
        "isBase64Encoded": is_base64,
    }


def proxy_response(payload: Any) -> Response | None:
    """Map a Lambda proxy result to HTTP; None when it is malformed (API Gateway answers 502)."""
    if not isinstance(payload, dict) or "statusCode" not in payload:
        return None
    try:
        status = int(payload["statusCode"])
    except (TypeError, ValueError):
        return None
    body = payload.get("body")
    if body is None:
        data = b""
    elif not isinstance(body, str):
        return None
    elif payload.get("isBase64Encoded"):
        data = base64.b64decode(body)
    else:
        data = body.encode()
    response = Response(data, status=status)
    response.headers.pop("Content-Type", None)
    for name, values in (payload.get("multiValueHeaders") or {}).items():
        for value in values:
            response.headers.add(name, str(value))
    for name, value in (payload.get("headers") or {}).items():
        response.headers[name] = str(value)
    if "Content-Type" not in response.headers:
        response.headers["Content-Type"] = "application/json"
    return response


def _local_stats() -> Response:
    """The local cloud's pid, resident memory and thread count (not an AWS API: a local-only probe)."""
    rss: int | None = None
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass  # not Linux: the pid is what `berth bench api` needs
    body = {"pid": os.getpid(), "rss_bytes": rss, "threads": threading.active_count()}
    return Response(json.dumps(body), status=200, content_type="application/json")


@dataclass
class FrontDoor:
    """Serves stage `stage` of REST API `rest_api_id` (deployed in moto at `endpoint_url`)."""

    endpoint_url: str
    rest_api_id: str
    stage: str
    region: str
    account_id: str
    port: int = 0
    access_log: TextIO | None = None
    in_process_transport: bool = True
    routes: RouteTable | None = None
    stage_variables: dict[str, str] = field(default_factory=dict)
    #: Gateway responses and resource policy from the deployed template (none: API Gateway's defaults).
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    _server: BaseWSGIServer | None = None
    _thread: threading.Thread | None = None
    _session: boto3.session.Session | None = None
    _lambda: Any = None

    @property
    def url(self) -> str:
        """The API's base URL, like the stage URL `https://<api>.execute-api.<region>.amazonaws.com/<stage>`."""
        if self._server is None:
            raise RuntimeError("front door not started")
        return f"http://{LOCAL_HOST}:{self._server.server_port}/{self.stage}"

    def start(self) -> FrontDoor:
        if self.gateway.policy is not None:
            resource_policy.check_supported(self.gateway.policy)
        self._session = boto3.session.Session(
            aws_access_key_id="frontdoor", aws_secret_access_key="frontdoor", region_name=self.region
        )
        if self.routes is None:
            self.routes = RouteTable.load(self._session, self.endpoint_url, self.rest_api_id)
        if not self.stage_variables:
            client = self._session.client("apigateway", endpoint_url=self.endpoint_url)
            stage = client.get_stage(restApiId=self.rest_api_id, stageName=self.stage)
            self.stage_variables = dict(stage.get("variables") or {})
        from botocore.config import Config

        self._lambda = self._session.client(
            "lambda",
            endpoint_url=self.endpoint_url,
            config=Config(read_timeout=930, retries={"max_attempts": 0}, max_pool_connections=32),
        )
        if self.in_process_transport:  # moto's Invoke API in this thread, without the loopback socket
            self._lambda.meta.events.register("before-send", InProcessTransport(self.endpoint_url))
        self._server = make_server(LOCAL_HOST, self.port, self.wsgi, threaded=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="berth-front-door", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- WSGI ------------------------------------------------------------------------------------
    def wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        started = time.monotonic()
        request_id = str(uuid.uuid4())
        principal: Principal | None = None
        try:
            response, principal = self._handle(request, request_id)
        except Exception as exc:  # a bug here must not look like the handler's fault
            print(f"berth local: front door error: {exc!r}", file=sys.stderr)
            response = self._internal_error()
        response.headers["x-amzn-RequestId"] = request_id
        response.headers.setdefault("x-amz-apigw-id", request_id.replace("-", "")[:16] + "=")
        if self.access_log is not None:
            who = principal.arn.rsplit(":", 1)[-1] if principal else "-"
            elapsed = (time.monotonic() - started) * 1000
            print(
                f"{request.method} {request.path} {response.status_code} {elapsed:.0f}ms {who}",
                file=self.access_log,
                flush=True,
            )
        return response(environ, start_response)

    def _internal_error(self) -> Response:
        return self.gateway.refusal(
            "INTEGRATION_FAILURE",
            "Internal server error",
            status=502,
            error_type="InternalServerErrorException",
        )

    def _handle(self, request: Request, request_id: str) -> tuple[Response, Principal | None]:
        assert self.routes is not None
        refuse = self.gateway.refusal
        raw_path = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or request.full_path
        if request.path == LOCAL_STATS_PATH and request.method == "GET":
            return _local_stats(), None
        if request.path == faults.FAULT_PATH:  # `berth local fault` (127.0.0.1 only)
            status, answer = faults.handle_http(request.method, request.remote_addr, request.get_data())
            return Response(json.dumps(answer), status=status, content_type="application/json"), None
        if faults.FAULTS.control_plane_down():  # `berth local fault control-plane-outage`
            message = "Service unavailable (berth local fault control-plane-outage)"
            return refuse("INTEGRATION_FAILURE", message, status=503, error_type="ServiceUnavailable"), None
        prefix = f"/{self.stage}"
        if request.path != prefix and not request.path.startswith(prefix + "/"):
            message = f"No stage at {request.path}; the API is served under {prefix}"
            return refuse("RESOURCE_NOT_FOUND", message), None
        path = request.path[len(prefix) :] or "/"
        # The signature is checked over the normalised path; refuse paths that normalise to
        # something else, so what is verified is exactly what is routed.
        segments = path.split("/")[1:]
        if any(seg in ("", ".", "..") for seg in segments[:-1]) or segments[-1:] in ([".."], ["."]):
            message = f"Path {path!r} has empty, '.' or '..' segments"
            return refuse("BAD_REQUEST_PARAMETERS", message), None
        resolved = self.routes.resolve(path)
        if resolved is None:
            return refuse("RESOURCE_NOT_FOUND", f"No route for {request.method} {path}"), None
        route, path_parameters = resolved
        method = route.methods.get(request.method) or route.methods.get("ANY")
        if method is None:
            return refuse("RESOURCE_NOT_FOUND", f"No route for {request.method} {path}"), None
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            _discard_body(request.stream, length)
            return refuse("REQUEST_TOO_LARGE", "Request body exceeds 10 MB"), None
        body = request.stream.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            return refuse("REQUEST_TOO_LARGE", "Request body exceeds 10 MB"), None

        principal: Principal | None = None
        if method.authorization_type == "AWS_IAM":
            try:
                principal = verify_request(
                    method=request.method,
                    url=f"{request.scheme}://{request.host}{raw_path}",
                    headers=list(request.headers.items()),
                    body=body,
                    region=self.region,
                )
            except SignatureError as exc:
                return refuse(exc.response_type, exc.message, error_type=exc.error_type), None
            host = faults.host_of(principal.arn)
            if host is not None and faults.FAULTS.partitioned(host):  # `berth local fault partition`
                message = f"Service unavailable (berth local fault partition {host})"
                return refuse(
                    "INTEGRATION_FAILURE", message, status=503, error_type="ServiceUnavailable"
                ), principal
            denied = self._denied_by_policy(principal, request, path)
            if denied is not None:
                return denied, principal
        elif method.authorization_type != "NONE":
            message = f"Authorization type {method.authorization_type} is not supported locally"
            return refuse("API_CONFIGURATION_ERROR", message), None

        if method.integration_type != "AWS_PROXY" or method.function_arn is None:
            message = f"{request.method} {path} has no Lambda proxy integration"
            return refuse("API_CONFIGURATION_ERROR", message), principal
        event = build_proxy_event(
            request=request,
            body=body,
            route=route,
            path=path,
            path_parameters=path_parameters,
            stage=self.stage,
            api_id=self.rest_api_id,
            account_id=self.account_id,
            request_id=request_id,
            principal=principal,
            stage_variables=self.stage_variables,
        )
        metering.METER.record_api_request()  # API Gateway bills each request that reaches its integration
        result = self._lambda.invoke(FunctionName=method.function_arn, Payload=json.dumps(event).encode())
        raw = result["Payload"].read()
        if result.get("FunctionError"):
            print(f"berth local: {method.function_arn} failed: {raw[:2000]!r}", file=sys.stderr)
            return self._internal_error(), principal
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        response = proxy_response(payload)
        if response is None:
            print(f"berth local: malformed Lambda proxy response: {raw[:500]!r}", file=sys.stderr)
            return self._internal_error(), principal
        return response, principal

    def _denied_by_policy(self, principal: Principal, request: Request, path: str) -> Response | None:
        """ACCESS_DENIED when the API's resource policy refuses this principal (see resource_policy)."""
        if self.gateway.policy is None:
            return None
        api_arn = f"arn:aws:execute-api:{self.region}:{self.account_id}:{self.rest_api_id}"
        resource = f"{api_arn}/{self.stage}/{request.method}{path}"
        caller = resource_policy.Caller(
            arn=principal.arn,
            account=principal.account_id,
            principal_arn=principal.principal_arn or principal.arn,
            user_id=principal.user_id,
            tags=principal.tags,
            source_ip=request.remote_addr or "127.0.0.1",
        )
        decision = resource_policy.evaluate(self.gateway.policy, caller, resource, api_arn)
        same_account = principal.account_id == self.account_id
        if decision is resource_policy.Decision.DENY or (
            decision is resource_policy.Decision.NO_MATCH and not same_account
        ):
            why = "with an explicit deny" if decision is resource_policy.Decision.DENY else ""
            message = (
                f"User: {principal.arn} is not authorized to perform: execute-api:Invoke on resource: "
                f"{resource} {why}".rstrip()
            )
            return self.gateway.refusal("ACCESS_DENIED", message, error_type="AccessDeniedException")
        return None


def _discard_body(stream: Any, declared: int) -> None:
    """Read and drop up to ``DISCARD_LIMIT_BYTES`` of a refused body, 1 MiB at a time, stopping at its
    end (the client can then read the refusal); a client that goes away (werkzeug's
    ``ClientDisconnected``, a socket error) just ends it."""
    left = min(declared, DISCARD_LIMIT_BYTES)
    try:
        while left > 0:
            chunk = stream.read(min(left, 1024 * 1024))
            if not chunk:
                return
            left -= len(chunk)
    except Exception:  # the answer is a refusal either way
        return
