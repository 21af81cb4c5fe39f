"""Verify AWS Signature Version 4 on requests to the front door, against moto's IAM and STS.

The signature is recomputed with botocore's own signer (`botocore.auth.SigV4Auth`) over exactly the
headers the client listed in `SignedHeaders`, the path and query string as the client sent them, and
the body received; the comparison is constant-time (`hmac.compare_digest`). Secrets come from moto's
IAM users (active access keys) and from STS sessions (assumed roles, with their session token and
expiry). Only the `Authorization` header form is accepted (not pre-signed query strings).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

from berth_tools.localcloud import moto_compat

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


def lookup_secret(access_key_id: str) -> _Secret | None:
    """Find an access key in moto's IAM users, then in its STS sessions."""
    for account_id, user in moto_compat.iam_users():
        for key in user.access_keys:
            if key.access_key_id == access_key_id and key.status == "Active":
                principal = Principal(access_key_id, account_id, user.arn, user.id)
                return _Secret(principal, key.secret_access_key, None, None)
    for role in moto_compat.sts_sessions():
        if role.access_key_id == access_key_id:
            principal = Principal(access_key_id, role.account_id, role.arn, role.user_id)
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
