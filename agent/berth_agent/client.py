"""The agent API client: SigV4-signed JSON over HTTPS to ``$api_url/v1/agent/`` (notes/protocol-v1).

Signed with the host's own identity (service ``execute-api``, the standard AWS credential chain:
in production the host's instance profile or role credentials file readable by the agent's user
only; in the local cloud the ``host-<host_id>`` profile). The body never names the host: the
control plane maps the signing principal to it. Use from the daemon loop::

    api = AgentClient.from_config(config)
    reg = api.register(inventory, agent_version=__version__)
    hb = api.heartbeat(healthy=True, draining=False, attempts=[...])   # -> directives
    try:
        claim = api.claim(job_id, attempt, fencing_token)
    except (Fenced, AlreadyClaimed, Canceled):
        ...  # delete the message, do not run
    api.report(job_id, attempt, fencing_token, "succeeded", exit_code=0)

Transient failures (connection errors, timeouts, 429, 500, 502, 503, 504) are retried with capped
exponential backoff and jitter, honouring ``Retry-After``; each retry is signed afresh. A 409
becomes a typed error by its ``error.code``; any other 4xx an ``AgentApiError``. The server must
answer a repeated claim or report of the same (attempt, fencing token) as it answered the first, so
a retry after a lost response is safe.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import botocore.session
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from berth_agent import __version__
from berth_agent.config import AgentConfig

log = logging.getLogger(__name__)

USER_AGENT = f"berth-agent/{__version__}"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The agent API refuses a longer report message (berth.domain.workflow.AttemptReport).
MAX_MESSAGE = 2000


class AgentApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details


class Fenced(AgentApiError):
    """The attempt is no longer this host's (superseded, lease lost): stop it, report nothing more."""


class AlreadyClaimed(AgentApiError):
    pass


class Canceled(AgentApiError):
    pass


class Unreachable(AgentApiError):
    """Retries exhausted on connection errors or 5xx/429."""


_CONFLICTS: dict[str, type[AgentApiError]] = {
    "Fenced": Fenced,
    "AlreadyClaimed": AlreadyClaimed,
    "Canceled": Canceled,
}


class AgentClient:
    def __init__(
        self,
        api_url: str,
        region: str,
        credentials: Credentials,
        *,
        http: requests.Session | None = None,
        timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._credentials = credentials
        self._region = region
        self._http = http or requests.Session()
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self._backoff = (backoff_base_s, backoff_max_s)
        self._sleep = sleep

    @classmethod
    def from_config(cls, config: AgentConfig, profile: str | None = None) -> AgentClient:
        creds = botocore.session.Session(profile=profile).get_credentials()
        if creds is None:
            raise AgentApiError(0, "NoCredentials", "no AWS credentials for the host identity")
        return cls(config.api_url, config.region, creds)

    # -- transport -----------------------------------------------------------------------------
    def _signed(self, method: str, url: str, data: bytes) -> dict[str, str]:
        req = AWSRequest(
            method=method,
            url=url,
            data=data,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
        )
        # Refreshable credentials (instance profile, SSO) are read afresh for every signature.
        SigV4Auth(self._credentials, "execute-api", self._region).add_auth(req)
        return dict(req.headers.items())

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        base, cap = self._backoff
        if retry_after is not None:
            try:
                return min(cap, max(0.0, float(retry_after)))
            except ValueError:
                pass
        return min(cap, base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    def post(self, path: str, body: dict[str, Any], *, max_attempts: int | None = None) -> Any:
        url = f"{self.api_url}/v1/agent/{path}"
        tries = self.max_attempts if max_attempts is None else max_attempts
        data = json.dumps(body, separators=(",", ":")).encode()
        last: AgentApiError | None = None
        for attempt in range(1, tries + 1):
            retry_after = None
            try:
                resp = self._http.post(
                    url, data=data, headers=self._signed("POST", url, data), timeout=self.timeout_s
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                last = Unreachable(0, "Unreachable", f"cannot reach {url}: {exc}")
            else:
                payload = _payload(resp)
                if resp.status_code < 400:
                    return payload
                err = _error(resp.status_code, payload)
                if resp.status_code not in RETRY_STATUSES:
                    raise err
                last = Unreachable(resp.status_code, err.code, err.message, err.details)
                retry_after = resp.headers.get("Retry-After")
            if attempt < tries:
                log.warning("agent API call failed; retrying", extra={"path": path, "error": str(last)})
                self._sleep(self._delay(attempt, retry_after))
        assert last is not None
        raise last

    # -- the protocol --------------------------------------------------------------------------
    def register(self, inventory: dict[str, Any], agent_version: str = __version__) -> Any:
        return self.post("register", {"inventory": inventory, "agent_version": agent_version})

    def heartbeat(
        self,
        *,
        healthy: bool,
        draining: bool,
        attempts: list[dict[str, Any]],
        cached_datasets: list[dict[str, Any]] | None = None,
        checkpoints: list[dict[str, Any]] | None = None,
        gpu_faults: list[dict[str, Any]] | None = None,
    ) -> Any:
        body: dict[str, Any] = {"healthy": healthy, "draining": draining, "attempts": attempts}
        if cached_datasets is not None:  # None: unchanged since the last beat that carried it
            body["cached_datasets"] = cached_datasets
        if checkpoints:
            body["checkpoints"] = checkpoints
        if gpu_faults:
            body["gpu_faults"] = gpu_faults
        return self.post("heartbeat", body)

    def claim(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return self.post("claim", _attempt(job_id, attempt, fencing_token))

    def report(
        self,
        job_id: str,
        attempt: int,
        fencing_token: str,
        event: str,
        *,
        exit_code: int | None = None,
        failure: str | None = None,
        message: str = "",
        checkpoint: dict[str, Any] | None = None,
    ) -> Any:
        body = {
            **_attempt(job_id, attempt, fencing_token),
            "event": event,
            "exit_code": exit_code,
            "failure": failure,
            "message": message[:MAX_MESSAGE],
        }
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        return self.post("report", body)

    def credentials(self, job_id: str, attempt: int, fencing_token: str) -> Any:
        return self.post("credentials", _attempt(job_id, attempt, fencing_token))

    def metrics(self, job_id: str, attempt: int, fencing_token: str, samples: list[dict[str, Any]]) -> Any:
        """Usage samples of a running attempt; two tries only: the shipper keeps what failed and
        sends it with the next batch, so a slow API never holds up the sender for long."""
        body = {**_attempt(job_id, attempt, fencing_token), "samples": samples}
        return self.post("metrics", body, max_attempts=2)


def _attempt(job_id: str, attempt: int, fencing_token: str) -> dict[str, Any]:
    return {"job_id": job_id, "attempt": attempt, "fencing_token": fencing_token}


def _payload(resp: requests.Response) -> Any:
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        return {"error": {"code": f"HTTP{resp.status_code}", "message": resp.text[:500]}}


def _error(status: int, payload: Any) -> AgentApiError:
    err = payload.get("error") if isinstance(payload, dict) else None
    err = err if isinstance(err, dict) else {}
    code = str(err.get("code") or f"HTTP{status}")
    cls = _CONFLICTS.get(code, AgentApiError) if status == 409 else AgentApiError
    return cls(status, code, str(err.get("message") or ""), err.get("details"))
