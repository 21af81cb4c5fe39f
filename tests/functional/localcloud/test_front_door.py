"""The front door: SigV4 against moto's IAM, routing by the deployed REST API, the proxy event."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3

from berth_tools.localcloud.cloud import LocalCloud

from .helpers import call, sign


def _alice(cloud: LocalCloud) -> tuple[str, str]:
    user = cloud.profiles["alice"]
    return user.access_key_id, user.secret_access_key


def test_signed_request_reaches_the_handler_with_the_callers_identity(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs/j-42?status=RUNNING&tag=a&tag=b"
    status, headers, body = call("GET", url, sign("GET", url, key, secret))
    assert status == 200, body
    assert headers["X-Echo"] == "a, b" or headers.get("X-Echo") in ("a", "b")
    event = body["event"]
    identity = event["requestContext"]["identity"]
    assert identity["userArn"] == cloud.profiles["alice"].arn
    assert identity["userArn"].endswith(":user/alice")
    assert identity["accessKey"] == key
    assert identity["accountId"] == "123456789012"
    user_id = boto3.client(
        "iam",
        endpoint_url=cloud.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    ).get_user(UserName="alice")["User"]["UserId"]
    assert identity["caller"] == identity["user"] == user_id
    assert identity["sourceIp"] == "127.0.0.1"
    assert event["resource"] == "/v1/jobs/{id}"
    assert event["path"] == "/v1/jobs/j-42"
    assert event["httpMethod"] == "GET"
    assert event["pathParameters"] == {"id": "j-42"}
    assert event["queryStringParameters"] == {"status": "RUNNING", "tag": "b"}
    assert event["multiValueQueryStringParameters"] == {"status": ["RUNNING"], "tag": ["a", "b"]}
    assert event["body"] is None and event["isBase64Encoded"] is False
    context = event["requestContext"]
    assert context["apiId"] == cloud.output("ApiId")
    assert context["stage"] == cloud.api_url.rsplit("/", 1)[1]
    assert context["resourcePath"] == "/v1/jobs/{id}"
    assert context["path"] == f"/{context['stage']}/v1/jobs/j-42"
    assert context["httpMethod"] == "GET" and context["requestId"] and context["requestTimeEpoch"] > 0
    assert event["headers"]["Host"].startswith("127.0.0.1:")
    assert "Authorization" in event["multiValueHeaders"]


def test_post_body_is_passed_through(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs"
    body = json.dumps({"name": "x", "unicode": "é"}).encode()
    headers = sign("POST", url, key, secret, body, headers={"Content-Type": "application/json"})
    status, _, echoed = call("POST", url, headers, body)
    assert status == 200
    assert json.loads(echoed["event"]["body"]) == {"name": "x", "unicode": "é"}
    assert echoed["event"]["pathParameters"] is None


def test_unsigned_request_is_rejected(cloud: LocalCloud) -> None:
    status, headers, body = call("GET", f"{cloud.api_url}/v1/jobs", {})
    assert status == 403
    assert body["error"]["code"] == "MISSING_AUTHENTICATION_TOKEN"
    assert headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"


def test_wrong_secret_is_rejected(cloud: LocalCloud) -> None:
    key, _ = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs"
    status, _, body = call("GET", url, sign("GET", url, key, "not-the-secret"))
    assert status == 403
    assert body["error"]["code"] == "INVALID_SIGNATURE"


def test_unknown_access_key_is_rejected(cloud: LocalCloud) -> None:
    url = f"{cloud.api_url}/v1/jobs"
    status, _, body = call("GET", url, sign("GET", url, "AKIAUNKNOWNKEY000000", "secret"))
    assert status == 403
    assert body["error"]["code"] == "INVALID_SIGNATURE"
    assert "security token included in the request is invalid" in body["error"]["message"]


def test_expired_signature_is_rejected(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs"
    old = datetime.now(UTC) - timedelta(minutes=6)
    status, _, body = call("GET", url, sign("GET", url, key, secret, at=old))
    assert status == 403
    assert body["error"]["code"] == "INVALID_SIGNATURE" and "expired" in body["error"]["message"]
    # within the allowed skew it is accepted
    recent = datetime.now(UTC) - timedelta(minutes=4)
    assert call("GET", url, sign("GET", url, key, secret, at=recent))[0] == 200


def test_tampered_body_is_rejected(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs"
    headers = sign("POST", url, key, secret, b'{"gpus": 1}')
    status, _, body = call("POST", url, headers, b'{"gpus": 8}')
    assert status == 403
    assert body["error"]["code"] == "INVALID_SIGNATURE"


def test_tampered_path_and_query_are_rejected(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    signed_url = f"{cloud.api_url}/v1/jobs/mine?limit=1"
    headers = sign("GET", signed_url, key, secret)
    assert call("GET", f"{cloud.api_url}/v1/jobs/theirs?limit=1", headers)[0] == 403
    assert call("GET", f"{cloud.api_url}/v1/jobs/mine?limit=2", headers)[0] == 403


def test_wrong_service_or_region_is_rejected(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs"
    assert call("GET", url, sign("GET", url, key, secret, service="lambda"))[0] == 403
    assert call("GET", url, sign("GET", url, key, secret, region="eu-west-1"))[0] == 403


def test_assumed_role_credentials_are_accepted(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    iam = boto3.client(
        "iam",
        endpoint_url=cloud.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    # The API's resource policy admits principals tagged berth:tenant (the role's tags, for a session).
    iam.create_role(
        RoleName="vision-team",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
        Tags=[{"Key": "berth:tenant", "Value": "vision"}],
    )
    sts = boto3.client(
        "sts",
        endpoint_url=cloud.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    creds = sts.assume_role(RoleArn="arn:aws:iam::123456789012:role/vision-team", RoleSessionName="alice-s")[
        "Credentials"
    ]
    url = f"{cloud.api_url}/v1/capacity"
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
    assert identity["userArn"] == "arn:aws:sts::123456789012:assumed-role/vision-team/alice-s"
    assert identity["caller"].endswith(":alice-s")
    bad = dict(headers, **{"X-Amz-Security-Token": "forged"})
    assert call("GET", url, bad)[0] == 403


def test_unknown_route_and_method_are_404(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    for method, path in (("GET", "/v1/nothing"), ("DELETE", "/v1/jobs"), ("GET", "/v1/jobs/a/b/c")):
        url = f"{cloud.api_url}{path}"
        status, _, body = call(method, url, sign(method, url, key, secret))
        assert status == 404, (method, path)
        assert body["error"]["code"] == "RESOURCE_NOT_FOUND"
    status, _, _ = call("GET", cloud.api_url.rsplit("/", 1)[0] + "/otherstage/v1/jobs", {})
    assert status == 404


def test_handler_exception_is_a_502_like_api_gateway(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs/boom"
    status, _, body = call("GET", url, sign("GET", url, key, secret))
    assert status == 502
    # The template's DEFAULT_5XX gateway response shapes it, as API Gateway would.
    assert body == {
        "error": {"code": "INTEGRATION_FAILURE", "message": "Internal server error", "details": None}
    }


def test_oversized_body_is_413(cloud: LocalCloud) -> None:
    key, secret = _alice(cloud)
    url = f"{cloud.api_url}/v1/jobs"
    body = b"x" * (10 * 1024 * 1024 + 1)
    status, _, answer = call("POST", url, sign("POST", url, key, secret, body), body)
    assert status == 413
    assert answer["error"]["code"] == "REQUEST_TOO_LARGE"
