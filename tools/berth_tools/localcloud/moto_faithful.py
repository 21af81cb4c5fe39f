"""Make moto hold two AWS guarantees that Berth's data path relies on and moto 5.2.5 skips.

- **STS session policies and expiry.** moto authorises an assumed-role credential by the role's
  policies alone and never expires it. AWS grants the intersection of the role's policies and the
  session policy passed to AssumeRole, and refuses a credential past its expiration. Berth vends
  every job attempt's credentials as one job role narrowed by a session policy, so without this the
  local cloud (and the functional tests) would let a job read any tenant's data.
- **Secrets Manager resources.** moto authorises every Secrets Manager call against resource ``*``,
  so a policy naming secret ARNs (as a job's session policy does) can never match; AWS evaluates the
  secret's ARN. The patch gives moto's Secrets Manager the secret's ARN as the resource.
- **IAM wildcards.** moto turns a policy's ``*`` into a regex and leaves every other character a
  regex metacharacter (``.`` matches anything, ``?`` is an error). IAM matches ``*`` as any run and
  ``?`` as one character, all else literally; session policies name secrets as ``name-??????``.
- **S3 checksums.** moto stores whatever ``x-amz-checksum-sha256`` a PutObject claims. S3 refuses
  the upload (BadDigest) when the content does not hash to it; Berth's presigned bundle uploads
  depend on that to keep content-addressed bundles honest.

Both are patches of moto internals; ``install()`` checks each target exists and fails loudly, and
returns a function that undoes them (tests install and undo around themselves).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from typing import Any

from moto.core.utils import utcnow
from moto.iam import access_control
from moto.s3 import responses as s3_responses
from moto.s3.exceptions import S3ClientError
from moto.secretsmanager import responses as sm_responses
from moto.sts.models import sts_backends


class MotoPatchError(RuntimeError):
    pass


class BadDigest(S3ClientError):
    code = "BadDigest"

    def __init__(self) -> None:
        super().__init__("BadDigest", "The SHA256 you specified did not match the calculated checksum.")


def _target(owner: Any, name: str) -> Any:
    original = getattr(owner, name, None)
    if original is None:
        raise MotoPatchError(f"moto has no {owner.__name__}.{name}; the local cloud's patch cannot apply")
    return original


def _check_action_permitted(original: Callable[..., None]) -> Callable[..., None]:
    def check(self: Any, resource: str) -> None:
        key = self._access_key
        if isinstance(key, access_control.AssumedRoleAccessKey):
            backend = sts_backends[key.account_id][key.partition]
            session = backend.get_assumed_role_from_access_key(key._access_key_id)
            if session is not None and session.expiration <= utcnow():
                self._raise_invalid_access_key("ExpiredToken")
            original(self, resource)
            if session is not None and session.policy and self._action != "sts:GetCallerIdentity":
                verdict = access_control.IAMPolicy(session.policy).is_action_permitted(self._action, resource)
                if verdict != access_control.PermissionResult.PERMITTED:
                    self._raise_access_denied()
            return
        original(self, resource)

    return check


def _get_checksum(original: Callable[..., tuple[str, str | None]]) -> Callable[..., tuple[str, str | None]]:
    def get_checksum(self: Any, response_headers: dict[str, Any]) -> tuple[str, str | None]:
        claimed = self.headers.get("x-amz-checksum-sha256")
        if claimed and self.method == "PUT":
            actual = base64.b64encode(hashlib.sha256(self.body or b"").digest()).decode()
            if claimed != actual:
                raise BadDigest()
        return original(self, response_headers)

    return get_checksum


def _iam_match(pattern: str, string: str) -> re.Match[str] | None:
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.match(f"^{regex}$", string, flags=re.DOTALL)


def _secret_resource(self: Any) -> str:
    secret_id = self._get_param("SecretId")
    if not secret_id:
        return "*"
    secret = self.backend.secrets.get(secret_id)
    if secret is not None:
        return str(secret.arn)
    # Unknown secret: an ARN-shaped name that matches only policies for that name (AWS answers
    # AccessDenied or ResourceNotFound depending on the caller's rights; both refuse).
    return f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"


def install() -> Callable[[], None]:
    """Apply the patches; returns the undo."""
    check_owner = access_control.IAMRequestBase
    checksum_owner = s3_responses.S3Response
    check = _target(check_owner, "check_action_permitted")
    checksum = _target(checksum_owner, "_get_checksum")
    _target(check_owner, "_raise_access_denied")
    _target(check_owner, "_raise_invalid_access_key")
    _target(access_control, "AssumedRoleAccessKey")
    _target(access_control, "IAMPolicy")
    match_owner = access_control.IAMPolicyStatement
    _target(match_owner, "_match")
    match = vars(match_owner)["_match"]  # the staticmethod object itself, to put back as it was
    sm_owner = sm_responses.SecretsManagerResponse
    _target(sm_owner, "backend")
    had_resource = "_determine_resource" in vars(sm_owner)
    check_owner.check_action_permitted = _check_action_permitted(check)  # type: ignore[method-assign]
    checksum_owner._get_checksum = _get_checksum(checksum)  # type: ignore[method-assign]
    sm_owner._determine_resource = _secret_resource  # type: ignore[attr-defined]
    match_owner._match = staticmethod(_iam_match)  # type: ignore[method-assign]

    def undo() -> None:
        check_owner.check_action_permitted = check  # type: ignore[method-assign]
        checksum_owner._get_checksum = checksum  # type: ignore[method-assign]
        match_owner._match = match  # type: ignore[method-assign]
        if not had_resource:
            del sm_owner._determine_resource  # type: ignore[attr-defined]

    return undo
