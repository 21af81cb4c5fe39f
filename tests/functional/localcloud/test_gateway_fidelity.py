"""The front door as faithful as API Gateway where Berth's tests depend on it (issue 12): refusals in
the template's gateway-response shape and codes, the resource policy evaluated, `x-amz-date` signed,
AWS query canonicalisation, GetSessionToken credentials."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock
from urllib.parse import quote

import boto3
import pytest

from berth_tools.localcloud import session_tokens
from berth_tools.localcloud.cloud import LocalCloud
from berth_tools.localcloud.gateway_config import GatewayConfig, GatewayResponse
from berth_tools.localcloud.resource_policy import Caller, Decision, evaluate
from berth_tools.localcloud.sigv4 import canonical_query

from .helpers import call, sign

ACCOUNT = "123456789012"


def _iam(cloud: LocalCloud) -> Any:
    user = cloud.profiles["admin"]
    return boto3.client(
        "iam",
        endpoint_url=cloud.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=user.access_key_id,
        aws_secret_access_key=user.secret_access_key,
    )


def _new_user(cloud: LocalCloud, name: str, tags: list[dict[str, str]]) -> tuple[str, str]:
    iam = _iam(cloud)
    iam.create_user(UserName=name, Tags=tags)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_principal_outside_the_resource_policy_is_refused(cloud: LocalCloud) -> None:
    key, secret = _new_user(cloud, "contractor", tags=[])  # valid keys, but no berth:tenant tag
    url = f"{cloud.api_url}/v1/jobs"
    status, headers, body = call("GET", url, sign("GET", url, key, secret))
    assert status == 403
    assert body["error"]["code"] == "ACCESS_DENIED"
    assert "explicit deny" in body["error"]["message"] and ":user/contractor" in body["error"]["message"]
    assert headers["x-amzn-ErrorType"] == "AccessDeniedException"
    # Tagging the principal admits it (the tenant still comes from the Tenants table).
    _iam(cloud).tag_user(UserName="contractor", Tags=[{"Key": "berth:tenant", "Value": "vision"}])
    assert call("GET", url, sign("GET", url, key, secret))[0] == 200


def test_refusals_carry_the_gateway_response_codes(cloud: LocalCloud) -> None:
    user = cloud.profiles["alice"]
    url = f"{cloud.api_url}/v1/jobs"
    cases = {
        "MISSING_AUTHENTICATION_TOKEN": (403, {}),
        "INVALID_SIGNATURE": (403, sign("GET", url, user.access_key_id, "wrong")),
    }
    for code, (expected, headers) in cases.items():
        status, _, body = call("GET", url, headers)
        assert (status, body["error"]["code"]) == (expected, code)
        assert set(body["error"]) == {"code", "message", "details"}


def test_x_amz_date_must_be_signed(cloud: LocalCloud) -> None:
    user = cloud.profiles["alice"]
    url = f"{cloud.api_url}/v1/jobs"
    headers = sign("GET", url, user.access_key_id, user.secret_access_key)
    # Claim that only host was signed: the date could then be replayed freely.
    auth = headers["Authorization"].replace("SignedHeaders=host;x-amz-date", "SignedHeaders=host")
    assert auth != headers["Authorization"]
    status, _, body = call("GET", url, {**headers, "Authorization": auth})
    assert status == 403 and body["error"]["code"] == "INVALID_SIGNATURE"
    assert "x-amz-date" in body["error"]["message"]


def test_query_is_canonicalised_like_aws(cloud: LocalCloud) -> None:
    user = cloud.profiles["alice"]
    base = f"{cloud.api_url}/v1/jobs/j-1"
    headers = sign("GET", f"{base}?name=a~b&tag=z&tag=a", user.access_key_id, user.secret_access_key)
    # The same query, encoded differently and in another order: AWS decodes before canonicalising.
    status, _, body = call("GET", f"{base}?tag=a&name=a%7Eb&tag=z", headers)
    assert status == 200, body
    # A different value still fails.
    assert call("GET", f"{base}?tag=a&name=a%7Ec&tag=z", headers)[0] == 403


def test_canonical_query_rules() -> None:
    assert canonical_query("b=2&a=%7e&a=1&c") == "a=1&a=~&b=2&c="
    assert canonical_query("x=a b".replace(" ", "%20")) == "x=a%20b"
    assert canonical_query("p=%2f") == canonical_query("p=%2F") == "p=%2F"
    assert canonical_query("") == ""
    assert canonical_query(quote("k=ü", safe="=")) == "k=%C3%BC"


def test_get_session_token_credentials_are_accepted(cloud: LocalCloud) -> None:
    user = cloud.profiles["alice"]
    sts = boto3.client(
        "sts",
        endpoint_url=cloud.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=user.access_key_id,
        aws_secret_access_key=user.secret_access_key,
    )
    creds = sts.get_session_token(DurationSeconds=900)["Credentials"]
    assert creds["AccessKeyId"].startswith("ASIA") and creds["AccessKeyId"] != user.access_key_id
    url = f"{cloud.api_url}/v1/jobs"
    headers = sign(
        "GET",
        url,
        creds["AccessKeyId"],
        creds["SecretAccessKey"],
        headers={"X-Amz-Security-Token": creds["SessionToken"]},
    )
    status, _, body = call("GET", url, headers)
    assert status == 200, body
    identity = body["event"]["requestContext"]["identity"]
    assert identity["userArn"] == user.arn and identity["accessKey"] == creds["AccessKeyId"]
    # Without (or with another) session token the temporary key is refused.
    assert call("GET", url, sign("GET", url, creds["AccessKeyId"], creds["SecretAccessKey"]))[0] == 403
    second = sts.get_session_token()["Credentials"]
    assert second["AccessKeyId"] != creds["AccessKeyId"]
    # Once expired, the session answers EXPIRED_TOKEN.
    held = session_tokens._sessions[creds["AccessKeyId"]]
    expired = dataclasses.replace(held, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    with mock.patch.dict(session_tokens._sessions, {creds["AccessKeyId"]: expired}):
        status, headers_, body = call("GET", url, headers)
    assert status == 403 and body["error"]["code"] == "EXPIRED_TOKEN"
    assert headers_["x-amzn-ErrorType"] == "ExpiredTokenException"


# -- the pieces on their own -------------------------------------------------------------------------
POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
            "Action": "execute-api:Invoke",
            "Resource": "execute-api:/*",
            "Condition": {"Null": {"aws:PrincipalTag/berth:tenant": "false"}},
        },
        {
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "execute-api:Invoke",
            "Resource": "execute-api:/*",
            "Condition": {"StringNotEquals": {"aws:PrincipalAccount": ACCOUNT}},
        },
        {
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "execute-api:Invoke",
            "Resource": "execute-api:/*",
            "Condition": {"Null": {"aws:PrincipalTag/berth:tenant": "true"}},
        },
    ],
}
API = f"arn:aws:execute-api:us-east-1:{ACCOUNT}:abc123"


def _caller(account: str = ACCOUNT, tags: dict[str, str] | None = None) -> Caller:
    arn = f"arn:aws:iam::{account}:user/x"
    return Caller(arn=arn, account=account, principal_arn=arn, user_id="AIDAX", tags=tags or {})


@pytest.mark.parametrize(
    ("caller", "decision"),
    [
        (_caller(tags={"berth:tenant": "vision"}), Decision.ALLOW),
        (_caller(), Decision.DENY),
        (_caller(account="999999999999", tags={"berth:tenant": "vision"}), Decision.DENY),
    ],
)
def test_resource_policy_evaluation(caller: Caller, decision: Decision) -> None:
    assert evaluate(POLICY, caller, f"{API}/api/GET/v1/jobs", API) is decision


def test_unknown_condition_fails_closed() -> None:
    policy = {
        "Statement": [
            {**POLICY["Statement"][0], "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020"}}},
            {**POLICY["Statement"][2], "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}},
        ]
    }
    assert (
        evaluate(policy, _caller(tags={"berth:tenant": "v"}), f"{API}/api/GET/v1/jobs", API) is Decision.DENY
    )


def test_gateway_response_falls_back_like_api_gateway() -> None:
    template = '{"error": {"code": "$context.error.responseType", "message": $context.error.messageString}}'
    config = GatewayConfig(
        responses={"DEFAULT_4XX": GatewayResponse(None, {"application/json": template}, {})}
    )
    denied = config.refusal("ACCESS_DENIED", 'say "no"')
    assert denied.status_code == 403
    assert json.loads(denied.get_data()) == {"error": {"code": "ACCESS_DENIED", "message": 'say "no"'}}
    # No DEFAULT_5XX: API Gateway's own body.
    failed = config.refusal("INTEGRATION_FAILURE", "Internal server error", status=502)
    assert failed.status_code == 502 and json.loads(failed.get_data()) == {"message": "Internal server error"}
    # A type's own response wins, with its status code.
    config = GatewayConfig(responses={"THROTTLED": GatewayResponse(503, {"application/json": template}, {})})
    assert config.refusal("THROTTLED", "slow down").status_code == 503
