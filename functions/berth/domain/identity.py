"""Who a verified caller really is: principal ARN, unique id and the person (actor). Pure.

API Gateway (AWS_IAM) hands the handler the signer's ARN (``identity.userArn``) and unique id
(``identity.user``: ``AIDA...`` for an IAM user, ``AROA...:<session>`` for an assumed-role session).
A name can be reused (a role deleted and recreated, an SSO permission set re-provisioned); the unique
id cannot, so membership is matched on both. Only IAM users and assumed-role sessions are accepted:
the account root and ``federated-user`` sessions (GetFederationToken) are refused outright, and every
pattern is an ASCII-only full match, so no look-alike character or trailing text slips through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from berth.domain.errors import Forbidden, Unauthenticated

_PARTITION = r"(?P<partition>aws(?:-[a-z]+)*)"
_ACCOUNT = r"(?P<account>[0-9]{12})"
#: IAM user and role names; role session names (2..64) use the same characters.
_NAME = r"[A-Za-z0-9+=,.@_-]{1,64}"
_SESSION = r"[A-Za-z0-9+=,.@_-]{2,64}"
#: An IAM path: "/" or "/a/b/" (printable ASCII).
_PATH = r"/(?:[!-~]*/)?"
_UNIQUE_ID = r"[A-Za-z0-9]{16,128}"


def _arn(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII)


_USER = _arn(rf"arn:{_PARTITION}:iam::{_ACCOUNT}:user{_PATH}(?P<name>{_NAME})")
_ROLE = _arn(rf"arn:{_PARTITION}:iam::{_ACCOUNT}:role{_PATH}(?P<name>{_NAME})")
_ASSUMED_ROLE = _arn(
    rf"arn:{_PARTITION}:sts::{_ACCOUNT}:assumed-role/(?P<name>{_NAME})/(?P<session>{_SESSION})"
)
_ROOT = _arn(rf"arn:{_PARTITION}:iam::{_ACCOUNT}:root")
_FEDERATED = _arn(rf"arn:{_PARTITION}:sts::{_ACCOUNT}:federated-user/.*")
_USER_ID = _arn(rf"(?P<id>{_UNIQUE_ID})")
_SESSION_ID = _arn(rf"(?P<id>{_UNIQUE_ID}):(?P<session>{_SESSION})")


class PrincipalKind(StrEnum):
    USER = "user"
    ROLE = "role"


@dataclass(frozen=True, slots=True)
class Identity:
    """The verified identity of a request, as the gateway reports it (never from the body)."""

    arn: str | None
    unique_id: str | None = None  # identity.user


@dataclass(frozen=True, slots=True)
class Principal:
    """A caller reduced to what membership is keyed on, plus the person acting."""

    arn: str  # the canonical ARN membership rows are keyed by
    unique_id: str  # AIDA... / AROA...: never reused by AWS
    kind: PrincipalKind
    actor: str  # the session name (the person, for SSO) or the IAM user's name


def canonical_principal(arn: str) -> str:
    """Map an STS assumed-role session ARN to its role ARN, without the role's path (a session ARN
    does not carry it; role names are unique per account). Other ARNs are kept as they are.

    A team's engineers typically assume one role per team (IAM Identity Center roles live under
    ``aws-reserved/sso.amazonaws.com/``); every session of it belongs to the same tenant.
    """
    m = _ASSUMED_ROLE.fullmatch(arn) or _ROLE.fullmatch(arn)
    if m:
        return f"arn:{m['partition']}:iam::{m['account']}:role/{m['name']}"
    return arn


def resolve_principal(identity: Identity) -> Principal:
    """The principal behind a verified identity; Unauthenticated/Forbidden for anything else."""
    arn = identity.arn
    if not arn:
        raise Unauthenticated("request has no IAM identity; sign it with SigV4")
    if _ROOT.fullmatch(arn):
        raise Forbidden("the account root user may not call Berth; use an IAM role or user")
    if _FEDERATED.fullmatch(arn):
        raise Forbidden("federated-user sessions (GetFederationToken) may not call Berth; assume a role")
    unique = identity.unique_id or ""
    if m := _ASSUMED_ROLE.fullmatch(arn):
        ids = _SESSION_ID.fullmatch(unique)
        if ids is None or ids["session"] != m["session"]:
            raise Forbidden("the caller's unique id does not match its session ARN")
        return Principal(canonical_principal(arn), ids["id"], PrincipalKind.ROLE, m["session"])
    if m := _USER.fullmatch(arn):
        ids = _USER_ID.fullmatch(unique)
        if ids is None:
            raise Forbidden("the caller's unique id is missing or malformed")
        return Principal(arn, ids["id"], PrincipalKind.USER, m["name"])
    raise Forbidden("only IAM users and assumed-role sessions may call Berth")
