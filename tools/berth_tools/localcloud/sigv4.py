"""Verify AWS Signature Version 4 on requests to the front door, against moto's IAM and STS.

The signature is recomputed with botocore's own signer (`botocore.auth.SigV4Auth`) over exactly the
headers the client listed in `SignedHeaders`, the path and query string as the client sent them, and
the body received; the comparison is constant-time (`hmac.compare_digest`). Secrets come from moto's
IAM users (active access keys) and from STS sessions (assumed roles and GetSessionToken, with their
session token and expiry). Only the `Authorization` header form is accepted (not pre-signed query
strings). As AWS does, `x-amz-date` must be among the signed headers.

The canonical request is built as AWS builds it, not from the bytes the client happened to send:

- query string (`canonical_query`): split on `&`, each pair at its first `=` (a value may hold more:
  `next_token=eyJ9==`; a pair without one has an empty value), each name and value decoded as a form
  value (`%XX`, and `+` is a space: botocore sends a space as `+` and signs `%20`) and encoded again
  as RFC 3986 asks (only `A-Z a-z 0-9 - _ . ~` kept, UTF-8 bytes as upper-case `%XX`), then sorted by
  encoded name, then by encoded value (repeated keys all kept). So `%7E` and `~`, `%2f` and `%2F`,
  `=` and `%3D` in a value sign alike; a literal `+` must be sent as `%2B`.
- path (`canonical_path`): the path as received (still percent-encoded), dot segments resolved,
  encoded once more (`/` and `~` kept), as for every service but S3.

tests/functional/localcloud/test_sigv4_table.py checks both against botocore's signer, case by case.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials
from botocore.utils import normalize_url_path

from berth_tools.localcloud import moto_compat, session_tokens

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_CLOCK_SKEW = timedelta(minutes=5)

_AUTH_HEADER = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-f]{64})\s*$"
)


@dataclass(frozen=True)
class Principal:
    """Who signed: what API Gateway puts in `requestContext.identity` for AWS_IAM methods."""

    access_key: str
    account_id: str
    arn: str
    user_id: str  # AIDA... for users, AROA...:session for assumed roles (identity.user and .caller)
    #: The principal's tags (a user's, or an assumed role's), for resource-policy conditions.
    tags: dict[str, str] = field(default_factory=dict)
    #: aws:PrincipalArn: the role's ARN for an assumed-role session, else ``arn``.
    principal_arn: str = ""


@dataclass(frozen=True)
class _Secret:
    principal: Principal
    secret_access_key: str
    session_token: str | None
    expires_at: datetime | None


class SignatureError(Exception):
    """The request is not correctly signed; `code` and `error_type` go into the 403 response."""

    def __init__(self, code: str, error_type: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.error_type = error_type  # API Gateway's x-amzn-ErrorType
        self.message = message

    @property
    def response_type(self) -> str:
        """The API Gateway gateway response type this refusal is sent with."""
        return _RESPONSE_TYPES.get(self.code, "INVALID_SIGNATURE")


_RESPONSE_TYPES = {
    "MissingAuthenticationToken": "MISSING_AUTHENTICATION_TOKEN",
    "ExpiredToken": "EXPIRED_TOKEN",
}


def _tags(entity: Any) -> dict[str, str]:
    """moto keeps IAM tags as [{"Key", "Value"}] (users) or {key: {"Key", "Value"}} (roles)."""
    raw = getattr(entity, "tags", None) or {}
    items = raw.values() if isinstance(raw, dict) else raw
    return {str(t["Key"]): str(t.get("Value", "")) for t in items if isinstance(t, dict) and "Key" in t}


def lookup_secret(access_key_id: str) -> _Secret | None:
    """Find an access key in moto's IAM users, then in its STS sessions."""
    for account_id, user in moto_compat.iam_users():
        for key in user.access_keys:
            if key.access_key_id == access_key_id and key.status == "Active":
                principal = Principal(access_key_id, account_id, user.arn, user.id, _tags(user), user.arn)
                return _Secret(principal, key.secret_access_key, None, None)
    session = session_tokens.find(access_key_id)
    if session is not None:
        users = {u.name: u for a, u in moto_compat.iam_users() if a == session.account_id}
        user_tags = _tags(users[session.user_name]) if session.user_name in users else {}
        principal = Principal(
            access_key_id, session.account_id, session.user_arn, session.user_id, user_tags, session.user_arn
        )
        return _Secret(principal, session.secret_access_key, session.session_token, session.expires_at)
    for role in moto_compat.sts_sessions():
        if role.access_key_id == access_key_id:
            principal = Principal(
                access_key_id,
                role.account_id,
                role.arn,
                role.user_id,
                _tags(moto_compat.session_role(role)),
                role.role_arn,
            )
            return _Secret(principal, role.secret_access_key, role.session_token, role.expiration)
    return None


class _ExactSigner(SigV4Auth):
    """botocore's signer, restricted to the headers the client said it signed."""

    def __init__(self, credentials: Credentials, service: str, region: str, signed: list[str]) -> None:
        super().__init__(credentials, service, region)
        self._signed = signed

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        header_map = HTTPHeaders()
        for name in self._signed:
            for value in request.headers.get_all(name) or []:
                header_map[name] = value
        return header_map

    def canonical_query_string(self, request: AWSRequest) -> str:
        return canonical_query(urlsplit(str(request.url)).query)

    def _normalize_url_path(self, path: str) -> str:
        return canonical_path(path)


#: RFC 3986 unreserved characters besides letters and digits: the only ones SigV4 leaves unencoded.
_UNRESERVED = "-_.~"


def _encode(text: str) -> str:
    return quote(text, safe=_UNRESERVED)


def canonical_query(query: str) -> str:
    """SigV4's canonical query string as AWS computes it from the query as received (module doc)."""
    pairs = []
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        pairs.append((_encode(unquote_plus(name)), _encode(unquote_plus(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def canonical_path(path: str) -> str:
    """SigV4's canonical URI for the path as received (still percent-encoded): dot segments
    resolved, then every byte but unreserved ones and `/` encoded once more (no S3 exception)."""
    return quote(normalize_url_path(path), safe="/~")


def verify_request(
    *,
    method: str,
    url: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    region: str,
    service: str = "execute-api",
    now: datetime | None = None,
) -> Principal:
    """Return the principal that signed the request, or raise SignatureError.

    `url` must carry the path and query string exactly as received (still percent-encoded).
    """
    header_list = list(headers)
    lower: dict[str, list[str]] = {}
    for name, value in header_list:
        lower.setdefault(name.lower(), []).append(value)
    authorization = (lower.get("authorization") or [""])[0]
    if not authorization:
        raise SignatureError(
            "MissingAuthenticationToken",
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        )
    match = _AUTH_HEADER.match(authorization)
    if match is None:
        raise SignatureError(
            "IncompleteSignature",
            "IncompleteSignatureException",
            f"Authorization header requires {ALGORITHM} with Credential, SignedHeaders and Signature.",
        )
    parts = match["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise SignatureError(
            "IncompleteSignature", "IncompleteSignatureException", "Malformed credential scope."
        )
    access_key_id, scope_date, scope_region, scope_service, _ = parts
    if scope_service != service:
        raise SignatureError(
            "InvalidSignature",
            "InvalidSignatureException",
            f"Credential should be scoped to service '{service}'.",
        )
    if scope_region != region:
        raise SignatureError(
            "InvalidSignature",
            "InvalidSignatureException",
            f"Credential should be scoped to region '{region}'.",
        )
    amz_date = (lower.get("x-amz-date") or [""])[0]
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError(
            "IncompleteSignature", "IncompleteSignatureException", "X-Amz-Date header missing or malformed."
        ) from None
    if scope_date != amz_date[:8]:
        raise SignatureError(
            "InvalidSignature",
            "InvalidSignatureException",
            "Credential scope date does not match X-Amz-Date.",
        )
    now = now or datetime.now(UTC)
    if abs(now - signed_at) > MAX_CLOCK_SKEW:
        raise SignatureError(
            "SignatureExpired",
            "InvalidSignatureException",
            f"Signature expired: {amz_date} is more than 5 min away from {now:%Y%m%dT%H%M%SZ}.",
        )
    signed = [name.strip().lower() for name in match["signed"].split(";")]
    if "host" not in signed:
        raise SignatureError(
            "IncompleteSignature", "IncompleteSignatureException", "The host header must be signed."
        )
    if "x-amz-date" not in signed:
        raise SignatureError(
            "IncompleteSignature",
            "IncompleteSignatureException",
            "The x-amz-date header must be signed.",
        )
    if any(name not in lower for name in signed):
        raise SignatureError(
            "IncompleteSignature",
            "IncompleteSignatureException",
            "A header listed in SignedHeaders is missing.",
        )
    content_sha = (lower.get("x-amz-content-sha256") or [""])[0]
    if "x-amz-content-sha256" in signed and not hmac.compare_digest(
        content_sha, hashlib.sha256(body).hexdigest()
    ):
        raise SignatureError(
            "InvalidSignature",
            "InvalidSignatureException",
            "X-Amz-Content-SHA256 does not match the body.",
        )

    secret = lookup_secret(access_key_id)
    if secret is None:
        raise SignatureError(
            "UnrecognizedClient",
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    if secret.session_token is not None:
        token = (lower.get("x-amz-security-token") or [""])[0]
        if not hmac.compare_digest(token, secret.session_token):
            raise SignatureError(
                "UnrecognizedClient",
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        if secret.expires_at is not None and secret.expires_at.replace(tzinfo=UTC) < now:
            raise SignatureError(
                "ExpiredToken",
                "ExpiredTokenException",
                "The security token included in the request is expired",
            )

    request = AWSRequest(method=method.upper(), url=url, data=body)
    for name, value in header_list:
        if name.lower() in signed:
            request.headers.add_header(name.lower(), value)
    request.context["timestamp"] = amz_date
    signer = _ExactSigner(Credentials(access_key_id, secret.secret_access_key), service, region, signed)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, match["signature"]):
        raise SignatureError(
            "InvalidSignature",
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return secret.principal


def signed_headers(
    *,
    method: str,
    url: str,
    access_key_id: str,
    secret_access_key: str,
    region: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    session_token: str | None = None,
    service: str = "execute-api",
) -> dict[str, str]:
    """Headers (Authorization, X-Amz-Date, ...) that SigV4-sign a request, as any AWS SDK would."""
    request = AWSRequest(method=method.upper(), url=url, data=body, headers=dict(headers or {}))
    SigV4Auth(Credentials(access_key_id, secret_access_key, session_token), service, region).add_auth(request)
    return dict(request.headers.items())
