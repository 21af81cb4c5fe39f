"""Evaluate a REST API's resource policy for one signed request, as API Gateway does for AWS_IAM.

Only what API Gateway resource policies use is implemented: Allow/Deny statements with Principal,
Action and Resource (NotPrincipal/NotAction/NotResource are refused when the policy is loaded), and
the string, ARN, Null and Bool condition operators (with ``IfExists``) over the keys
``aws:PrincipalAccount``, ``aws:PrincipalArn``, ``aws:PrincipalTag/<key>``, ``aws:PrincipalType``,
``aws:userid``, ``aws:username`` and ``aws:SourceIp`` (exact match only). A condition this module
cannot evaluate counts as met in a Deny and unmet in an Allow: it fails closed.

API Gateway's rule for a caller of the API's own account: an explicit Deny refuses; otherwise an
Allow of either the resource policy or the caller's IAM policies admits. The local cloud does not
evaluate IAM identity policies, so for such callers "no matching statement" admits (documented in
docs/local-cloud.md); a caller of another account needs an explicit Allow.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

ACTION = "execute-api:Invoke"


class Decision(Enum):
    ALLOW = "allow"
    DENY = "deny"  # explicit deny
    NO_MATCH = "no-match"


@dataclass(frozen=True)
class Caller:
    arn: str  # the signer's ARN (an assumed-role session's ARN for roles)
    account: str
    principal_arn: str  # aws:PrincipalArn: the role's ARN for assumed-role sessions
    user_id: str  # aws:userid
    tags: dict[str, str] = field(default_factory=dict)
    source_ip: str = "127.0.0.1"

    @property
    def principal_type(self) -> str:
        return "AssumedRole" if ":assumed-role/" in self.arn else "User"

    def key(self, name: str) -> str | None:
        lower = name.lower()
        if lower.startswith("aws:principaltag/"):
            tag = name.split("/", 1)[1]
            return next((v for k, v in self.tags.items() if k.lower() == tag.lower()), None)
        values = {
            "aws:principalaccount": self.account,
            "aws:principalarn": self.principal_arn,
            "aws:principaltype": self.principal_type,
            "aws:userid": self.user_id,
            "aws:username": self.arn.rsplit("/", 1)[-1] if self.principal_type == "User" else None,
            "aws:sourceip": self.source_ip,
        }
        if lower not in values:
            raise KeyError(name)
        return values[lower]


def check_supported(policy: dict[str, Any]) -> None:
    for statement in _statements(policy):
        for unsupported in ("NotPrincipal", "NotAction", "NotResource"):
            if unsupported in statement:
                raise ValueError(f"the local front door does not evaluate {unsupported} in resource policies")


def evaluate(policy: dict[str, Any], caller: Caller, resource_arn: str, api_arn_prefix: str) -> Decision:
    """The resource policy's verdict on ``caller`` invoking ``resource_arn``.

    ``api_arn_prefix`` (``arn:aws:execute-api:<region>:<account>:<api-id>``) expands the shorthand
    resources ``execute-api:/...`` that API Gateway accepts in resource policies.
    """
    allowed = False
    for statement in _statements(policy):
        if not _matches_principal(statement.get("Principal"), caller):
            continue
        if not any(_glob(a.lower(), ACTION.lower()) for a in _as_list(statement.get("Action"))):
            continue
        resources = [_expand(r, api_arn_prefix) for r in _as_list(statement.get("Resource"))]
        if not any(_glob(r, resource_arn) for r in resources):
            continue
        deny = statement.get("Effect") == "Deny"
        if not _conditions_met(statement.get("Condition") or {}, caller, unknown_is_met=deny):
            continue
        if deny:
            return Decision.DENY
        allowed = True
    return Decision.ALLOW if allowed else Decision.NO_MATCH


def _statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in _as_list(policy.get("Statement")) if isinstance(s, dict)]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _glob(pattern: str, value: str) -> bool:
    # IAM wildcards: * and ? only (no character classes).
    escaped = pattern.replace("[", "[[]")
    return fnmatch.fnmatchcase(value, escaped)


def _expand(resource: str, api_arn_prefix: str) -> str:
    if resource.startswith("execute-api:/"):
        return api_arn_prefix + resource.removeprefix("execute-api:")
    return resource


def _matches_principal(principal: Any, caller: Caller) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    for value in _as_list(principal.get("AWS")):
        if value == "*":
            return True
        if value in (caller.account, f"arn:aws:iam::{caller.account}:root"):
            return True  # the account: any principal of it (its policies then decide)
        if value in (caller.arn, caller.principal_arn):
            return True
    return False


_OPERATORS = {
    "StringEquals": lambda v, p: v == p,
    "StringNotEquals": lambda v, p: v != p,
    "StringEqualsIgnoreCase": lambda v, p: v.lower() == p.lower(),
    "StringNotEqualsIgnoreCase": lambda v, p: v.lower() != p.lower(),
    "StringLike": lambda v, p: _glob(p, v),
    "StringNotLike": lambda v, p: not _glob(p, v),
    "ArnEquals": lambda v, p: v == p,
    "ArnNotEquals": lambda v, p: v != p,
    "ArnLike": lambda v, p: _glob(p, v),
    "ArnNotLike": lambda v, p: not _glob(p, v),
}
_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike"}


def _conditions_met(conditions: dict[str, Any], caller: Caller, *, unknown_is_met: bool) -> bool:
    for operator, block in conditions.items():
        for key, expected in block.items():
            try:
                value = caller.key(key)
            except KeyError:
                return unknown_is_met
            result = _condition(operator, value, [str(e) for e in _as_list(expected)])
            if result is None:
                return unknown_is_met
            if not result:
                return False
    return True


def _condition(operator: str, value: str | None, expected: list[str]) -> bool | None:
    if operator == "Null":
        return (value is None) == (expected[0].lower() == "true")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    if base == "Bool":
        return True if value is None and if_exists else value is not None and value.lower() in expected
    test = _OPERATORS.get(base)
    if test is None:
        return None
    if value is None:
        return if_exists or base in _NEGATED
    if base in _NEGATED:
        return all(test(value, p) for p in expected)
    return any(test(value, p) for p in expected)
