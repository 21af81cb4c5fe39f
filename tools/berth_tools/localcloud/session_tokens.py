"""STS GetSessionToken in the local cloud: real temporary credentials of the calling IAM user.

moto answers GetSessionToken with AWS's documentation example keys, the same for everyone and tied
to no one, so a client using MFA-style session credentials (``aws sts get-session-token``) could not
call the API. With ``install()`` each call mints a fresh ``ASIA...`` key, secret and session token
for the user whose key signed the STS call, kept until they expire; the front door's SigV4 check
(``sigv4.lookup_secret``) accepts them as that user, as AWS does.
"""

from __future__ import annotations

import secrets
import string
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from berth_tools.localcloud import moto_compat

MIN_DURATION_S = 900
MAX_DURATION_S = 129_600


@dataclass(frozen=True)
class SessionCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_at: datetime
    user_arn: str
    user_id: str
    account_id: str
    user_name: str


_lock = threading.Lock()
_sessions: dict[str, SessionCredentials] = {}
_original: Any = None


def find(access_key_id: str) -> SessionCredentials | None:
    """The session of a temporary key, expired ones included (the caller answers ExpiredToken)."""
    with _lock:
        return _sessions.get(access_key_id)


def _user_of(access_key_id: str) -> tuple[str, Any] | None:
    for account_id, user in moto_compat.iam_users():
        if any(k.access_key_id == access_key_id and k.status == "Active" for k in user.access_keys):
            return account_id, user
    return None


def _mint(response: Any) -> Any:
    action_result = moto_compat.surface("moto.core.responses:ActionResult")
    owner = _user_of(response.get_access_key())
    if owner is None:  # not an IAM user's long-term key (AWS refuses GetSessionToken for roles too)
        return _original(response)
    account_id, user = owner
    duration = response._get_int_param("DurationSeconds", 43200)
    duration = max(MIN_DURATION_S, min(MAX_DURATION_S, duration))
    alphabet = string.ascii_uppercase + string.digits
    creds = SessionCredentials(
        access_key_id="ASIA" + "".join(secrets.choice(alphabet) for _ in range(16)),
        secret_access_key=secrets.token_urlsafe(30)[:40],
        session_token=secrets.token_urlsafe(96),
        expires_at=datetime.now(UTC) + timedelta(seconds=duration),
        user_arn=user.arn,
        user_id=user.id,
        account_id=account_id,
        user_name=user.name,
    )
    with _lock:
        _sessions[creds.access_key_id] = creds
    return action_result(
        {
            "Credentials": {
                "AccessKeyId": creds.access_key_id,
                "SecretAccessKey": creds.secret_access_key,
                "SessionToken": creds.session_token,
                "Expiration": creds.expires_at,
            }
        }
    )


def install() -> None:
    """Replace moto's GetSessionToken (idempotent; moto runs in this process)."""
    global _original
    with _lock:
        if _original is None:
            _original = moto_compat.surface("moto.sts.responses:TokenResponse.get_session_token")
            moto_compat.replace("moto.sts.responses:TokenResponse.get_session_token", _mint)
