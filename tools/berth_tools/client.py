"""A SigV4-signing HTTP client for the Berth API.

It signs with the standard AWS credential chain (``AWS_PROFILE``, environment variables, shared
files, SSO, instance roles), as any SigV4 client would; nothing Berth-specific is needed.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError, NoCredentialsError
from botocore.httpsession import URLLib3Session
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

USER_AGENT = "berth-cli/0.1.0"
_EXECUTE_API_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com")


class ClientError(Exception):
    """Raised for anything that is not a 2xx answer; carries the API's error body."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class Unreachable(ClientError):
    pass


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    region: str
    profile: str | None = None


def load_config(api_url: str | None = None, profile: str | None = None) -> ClientConfig:
    """The API URL from the flag, ``BERTH_API_URL``, or ``~/.config/berth/config.json``."""
    url = api_url or os.environ.get("BERTH_API_URL")
    cfg_file = Path(os.environ.get("BERTH_CONFIG", Path.home() / ".config" / "berth" / "config.json"))
    file_cfg: dict[str, Any] = {}
    if cfg_file.is_file():
        try:
            file_cfg = json.loads(cfg_file.read_text())
        except ValueError as exc:
            raise ClientError(0, "BadConfig", f"{cfg_file} is not valid JSON: {exc}") from exc
    url = url or file_cfg.get("api_url")
    if not url:
        raise ClientError(
            0,
            "NoApiUrl",
            "no Berth API URL: set BERTH_API_URL (for the local cloud: source .berth/local/env) "
            f'or put {{"api_url": ...}} in {cfg_file}',
        )
    m = _EXECUTE_API_HOST.search(url)
    region = (
        (m.group(1) if m else None)
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or file_cfg.get("region")
        or "us-east-1"
    )
    return ClientConfig(api_url=url.rstrip("/"), region=region, profile=profile or file_cfg.get("profile"))


class BerthClient:
    def __init__(self, config: ClientConfig, timeout_s: int = 30) -> None:
        self._config = config
        session = botocore.session.Session(profile=config.profile)
        try:
            creds = session.get_credentials()
        except BotoCoreError as exc:
            raise ClientError(0, "NoCredentials", f"cannot load AWS credentials: {exc}") from exc
        if creds is None:
            raise ClientError(
                0, "NoCredentials", "no AWS credentials found; set AWS_PROFILE or AWS_ACCESS_KEY_ID/SECRET"
            )
        self._signer = SigV4Auth(creds, "execute-api", config.region)
        self._http = URLLib3Session(timeout=timeout_s)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Send a signed request. Retries with backoff: connection failures, 502/503/504, and 429
        except ``QuotaExceeded`` (a tenant at its quota waits for jobs to finish, not for seconds)."""
        q = {k: v for k, v in (query or {}).items() if v is not None}
        # RFC 3986 encoding (%20, not +): botocore signs a query in the URL as written, and AWS reads
        # a + as a space
        url = self._config.api_url + path + (("?" + urlencode(q, quote_via=quote)) if q else "")
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **(headers or {})}
        return self._send(method, url, data, hdrs)

    @retry(
        retry=retry_if_exception_type(_Transient),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.2, max=3),
        reraise=True,
    )
    def _send(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> Any:
        req = AWSRequest(method=method, url=url, data=data, headers=headers)
        try:
            self._signer.add_auth(req)
        except NoCredentialsError as exc:
            raise ClientError(0, "NoCredentials", str(exc)) from exc
        try:
            resp = self._http.send(req.prepare())
        except BotoCoreError as exc:
            raise _Transient() from Unreachable(0, "Unreachable", f"cannot reach {url}: {exc}")
        status = resp.status_code
        text = resp.content.decode("utf-8", "replace")
        payload: Any
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = {"error": {"code": f"HTTP{status}", "message": text[:500]}}
        if status in (502, 503, 504) or (status == 429 and _code(payload) != "QuotaExceeded"):
            raise _Transient() from _error(status, payload)
        if status >= 400:
            raise _error(status, payload)
        return payload

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return self.request(method, path, **kw)
        except _Transient as exc:  # retries exhausted: surface the last real error
            cause = exc.__cause__
            if isinstance(cause, ClientError):
                raise cause from None
            raise ClientError(0, "Unreachable", "request failed after retries") from exc

    # -- the API --------------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> Any:
        key = idempotency_key or str(uuid.uuid4())
        return self.call("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": key})

    def request_bundle(self, digest: str, size: int) -> Any:
        return self.call("POST", "/v1/bundles", body={"digest": digest, "size": size})

    def get(self, job_id: str) -> Any:
        return self.call("GET", f"/v1/jobs/{_seg(job_id)}")

    def list(
        self,
        status: str | None = None,
        limit: int = 50,
        next_token: str | None = None,
        array: str | None = None,
        **filters: str | None,
    ) -> Any:
        """A page of the tenant's jobs (an array is one row), or with ``array`` of that array's tasks.
        ``filters``: the listing's other query parameters (``tenant``, ``all_tenants``, ``since``,
        ``name``, ``site``; docs/api.md), None for absent."""
        query = {"status": status, "limit": limit, "next_token": next_token, "array": array, **filters}
        return self.call("GET", "/v1/jobs", query=query)

    def cancel(self, job_id: str) -> Any:
        return self.call("POST", f"/v1/jobs/{_seg(job_id)}/cancel")

    def events(self, job_id: str) -> Any:
        return self.call("GET", f"/v1/jobs/{_seg(job_id)}/events")

    def explain(self, job_id: str) -> Any:
        return self.call("GET", f"/v1/jobs/{_seg(job_id)}/explain")

    def capacity(self) -> Any:
        return self.call("GET", "/v1/capacity")

    def admit_host(self, host_id: str, gpu_type: str, gpus: int) -> Any:
        body = {"gpu_type": gpu_type, "gpus": gpus}
        return self.call("PUT", f"/v1/hosts/{_seg(host_id)}/admission", body=body)

    def circuits(self) -> Any:
        return self.call("GET", "/v1/circuits")

    def reset_circuits(self, region: str, instance_type: str | None = None) -> Any:
        return self.call("DELETE", f"/v1/circuits/{_seg(region)}", query={"instance_type": instance_type})

    def drain_host(self, host_id: str, drain: bool = True) -> Any:
        return self.call("PUT", f"/v1/hosts/{_seg(host_id)}/drain", body={"drain": drain})

    def clear_gpu_fault(self, host_id: str, gpu: str) -> Any:
        return self.call("POST", f"/v1/hosts/{_seg(host_id)}/gpus/{_seg(gpu)}/clear")

    def get_document(self, kind: str, version: int | None = None) -> Any:
        return self.call("GET", f"/v1/{_seg(kind)}", query={"version": version})

    def put_document(self, kind: str, document: dict[str, Any], if_match: int | None = None) -> Any:
        headers = {} if if_match is None else {"If-Match": str(if_match)}
        return self.call("PUT", f"/v1/{_seg(kind)}", body=document, headers=headers)

    def get_quota(self, tenant: str) -> Any:
        return self.call("GET", f"/v1/tenants/{_seg(tenant)}/quota")

    def queue(self, tenant: str | None = None, limit: int = 50) -> Any:
        """A team's waiting jobs in the order the scheduler serves them (its last pass's ranking);
        None: the caller's own team."""
        path = "/v1/queue" if tenant is None else f"/v1/tenants/{_seg(tenant)}/queue"
        return self.call("GET", path, query={"limit": str(limit)})

    def put_quota(self, tenant: str, quota: dict[str, Any]) -> Any:
        return self.call("PUT", f"/v1/tenants/{_seg(tenant)}/quota", body=quota)

    def logs(
        self,
        job_id: str,
        attempt: int | None = None,
        since: str | None = None,
        limit: int | None = None,
        next_token: str | None = None,
        rank: int | None = None,
    ) -> Any:
        query = {"attempt": attempt, "since": since, "limit": limit, "next_token": next_token, "rank": rank}
        return self.call("GET", f"/v1/jobs/{_seg(job_id)}/logs", query=query)

    def metrics(self, job_id: str, attempt: int | None = None, limit: int | None = None) -> Any:
        query = {"attempt": attempt, "limit": limit}
        return self.call("GET", f"/v1/jobs/{_seg(job_id)}/metrics", query=query)

    def usage(self, tenant: str | None = None, month: str | None = None) -> Any:
        """A tenant's usage in a month (None: the caller's own tenant; the current month)."""
        path = "/v1/usage" if tenant is None else f"/v1/tenants/{_seg(tenant)}/usage"
        return self.call("GET", path, query={"month": month})

    def plan(self, spec: dict[str, Any]) -> Any:
        """A dry run of a submit: where the scheduler would run ``spec`` now; nothing is stored."""
        return self.call("POST", "/v1/jobs/plan", body=spec)

    def outputs(self, job_id: str, limit: int | None = None, next_token: str | None = None) -> Any:
        """A page of the job's output and checkpoint objects, each with a presigned GET."""
        query = {"limit": limit, "next_token": next_token}
        return self.call("GET", f"/v1/jobs/{_seg(job_id)}/outputs", query=query)


def every_job(
    client: BerthClient, page_size: int = 100, array: str | None = None
) -> Iterator[dict[str, Any]]:
    """Every job of the caller's tenant (an array is one row), or every created task of ``array``,
    page by page, following ``next_token``."""
    token: str | None = None
    while True:
        page = client.list(limit=page_size, next_token=token, array=array)
        yield from page.get("jobs", [])
        token = page.get("next_token")
        if not token:
            return


def _seg(value: str) -> str:
    """One URL path segment, percent-encoded (an id can never add path segments)."""
    return quote(value, safe="")


def _error(status: int, payload: Any) -> ClientError:
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        return ClientError(status, str(err.get("code")), str(err.get("message")), err.get("details"))
    if isinstance(payload, dict) and "message" in payload:  # API Gateway's own answers
        return ClientError(status, f"HTTP{status}", str(payload["message"]))
    return ClientError(status, f"HTTP{status}", json.dumps(payload)[:500])


def _code(payload: Any) -> str | None:
    err = payload.get("error") if isinstance(payload, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None
