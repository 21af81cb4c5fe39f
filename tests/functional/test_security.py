"""Issue 12 on the API Lambda (moto): who a caller really is, rate limits, page tokens, keyed submits."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import boto3
import pytest

from berth.dal.page_tokens import DynamoSigningKey, PageTokenCodec
from tests.functional.conftest import ACCOUNT, TABLES, Invoke

ROLE = f"arn:aws:iam::{ACCOUNT}:role/vision-team"
ROLE_ID = "AROAVISIONTEAM0000001"


def _session(session: str, role_id: str = ROLE_ID) -> dict[str, Any]:
    return {
        "userArn": f"arn:aws:sts::{ACCOUNT}:assumed-role/vision-team/{session}",
        "user": f"{role_id}:{session}",
        "caller": f"{role_id}:{session}",
    }


def _register_role(role_id: str, role: str = "member") -> None:
    from berth.dal.tenants import DynamoTenantRepository

    DynamoTenantRepository(TABLES["BERTH_TENANTS_TABLE"]).put_member(ROLE, "vision", role, role_id)


def _jobs_stored() -> int:
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    return int(ddb.scan(TableName=TABLES["BERTH_JOBS_TABLE"], Select="COUNT")["Count"])


# -- who a caller really is ------------------------------------------------------------------------
def test_session_name_is_recorded_as_the_jobs_actor(api: Invoke, spec: dict[str, Any]) -> None:
    _register_role(ROLE_ID)
    status, job = api("POST", "/v1/jobs", body=spec, identity=_session("alice@example.com"))
    assert status == 201
    assert job["owner"] == ROLE and job["actor"] == "alice@example.com"
    status, again = api("GET", f"/v1/jobs/{job['id']}", identity=_session("bob@example.com"))
    assert status == 200 and again["actor"] == "alice@example.com"
    status, canceled = api("POST", f"/v1/jobs/{job['id']}/cancel", identity=_session("bob@example.com"))
    assert status == 202 and "bob@example.com" in canceled["reason"]


def test_recreated_role_with_the_same_name_is_refused_until_re_registered(
    api: Invoke, spec: dict[str, Any]
) -> None:
    _register_role(ROLE_ID, role="admin")
    assert api("GET", "/v1/jobs", identity=_session("alice"))[0] == 200
    # The role is deleted and created again with the same name: AWS gives it a new unique id.
    recreated = _session("alice", role_id="AROAVISIONTEAM0000002")
    status, body = api("GET", "/v1/jobs", identity=recreated)
    assert status == 403 and body["error"]["code"] == "Forbidden"
    assert "register it again" in body["error"]["message"]
    status, body = api("POST", "/v1/jobs", body=spec, identity=recreated)
    assert status == 403 and _jobs_stored() == 0
    _register_role("AROAVISIONTEAM0000002")
    assert api("GET", "/v1/jobs", identity=recreated)[0] == 200


def test_recreated_user_with_the_same_name_is_refused(api: Invoke) -> None:
    status, body = api("GET", "/v1/jobs", identity={"user": "AIDAALICE000000000002"})
    assert status == 403 and body["error"]["code"] == "Forbidden"


@pytest.mark.parametrize(
    "identity",
    [
        {"userArn": f"arn:aws:iam::{ACCOUNT}:root", "user": ACCOUNT},
        {"userArn": f"arn:aws:sts::{ACCOUNT}:federated-user/alice", "user": f"{ACCOUNT}:alice"},
        {"userArn": f"arn:aws:iam::{ACCOUNT}:user/alice\n", "user": "AIDAALICE777777777777"},
    ],
    ids=["root", "federated-user", "trailing-newline"],
)
def test_root_federated_and_odd_principals_are_refused(
    api: Invoke, spec: dict[str, Any], identity: dict[str, Any]
) -> None:
    for method, path, body in (("GET", "/v1/jobs", None), ("POST", "/v1/jobs", spec)):
        status, answer = api(method, path, body=body, identity=identity)
        assert status == 403 and answer["error"]["code"] == "Forbidden", (identity, answer)
    assert _jobs_stored() == 0


# -- rate limit ------------------------------------------------------------------------------------
def test_tenant_over_its_rate_limit_gets_429_and_others_are_unaffected(
    api: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    from berth.handlers import services
    from berth.handlers.settings import settings

    monkeypatch.setenv("BERTH_RATE_LIMIT_REQUESTS", "3")
    monkeypatch.setenv("BERTH_RATE_LIMIT_WINDOW_S", "3600")  # one window for the whole test
    settings.cache_clear()
    services.rate_limiter.cache_clear()
    try:
        for _ in range(3):
            assert api("GET", "/v1/jobs", user="alice")[0] == 200
        status, answer = api("GET", "/v1/jobs", user="alice", full=True)
        assert status == 429
        assert answer["body"]["error"]["code"] == "TooManyRequests"
        retry_after = int(answer["headers"]["Retry-After"])
        assert 1 <= retry_after <= 3600
        assert answer["body"]["error"]["details"]["retry_after_s"] == retry_after
        # Another tenant has its own budget.
        for _ in range(3):
            assert api("GET", "/v1/jobs", user="bob")[0] == 200
        # Still limited: refusals do not reset or extend the window.
        assert api("GET", "/v1/jobs", user="alice")[0] == 429
    finally:
        settings.cache_clear()
        services.rate_limiter.cache_clear()


# -- page tokens -----------------------------------------------------------------------------------
def _two_pages(api: Invoke, spec: dict[str, Any]) -> str:
    for i in range(3):
        assert api("POST", "/v1/jobs", body={**spec, "name": f"job-{i}"})[0] == 201
    status, page = api("GET", "/v1/jobs", query={"limit": "2"})
    assert status == 200 and page["next_token"]
    token: str = page["next_token"]
    return token


def test_tampered_page_token_is_400(api: Invoke, spec: dict[str, Any]) -> None:
    token = _two_pages(api, spec)
    payload, mac = token.split(".")
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    data["d"]["t"] = "nlp"  # try to read another tenant's partition
    forged = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    # The first character: the last one of unpadded base64 carries spare bits, so changing it may
    # decode to the same MAC.
    flipped = ("A" if mac[0] != "A" else "B") + mac[1:]
    for bad in (f"{forged}.{mac}", f"{payload}.{flipped}", payload, f"{payload}.", "." + mac):
        status, body = api("GET", "/v1/jobs", query={"next_token": bad})
        assert status == 400 and body["error"]["code"] == "BadRequest", bad
    assert api("GET", "/v1/jobs", query={"next_token": token})[0] == 200


def test_deeply_nested_page_token_is_400_not_5xx(api: Invoke) -> None:
    nested = base64.urlsafe_b64encode(b"[" * 1500).decode().rstrip("=")
    for bad in (nested, f"{nested}.{nested[:43]}"):
        status, body = api("GET", "/v1/jobs", query={"next_token": bad[:2048]})
        assert status == 400 and body["error"]["code"] == "BadRequest"


def test_expired_page_token_is_400(api: Invoke, spec: dict[str, Any]) -> None:
    token = _two_pages(api, spec)
    # The same key, a clock two hours back: a token issued then has expired (TTL 1 h).
    old = PageTokenCodec(DynamoSigningKey(TABLES["BERTH_TENANTS_TABLE"]), clock=lambda: time.time() - 7200)
    payload = token.split(".")[0]
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["d"]
    expired = old.encode(data)
    status, body = api("GET", "/v1/jobs", query={"next_token": expired})
    assert status == 400 and "expired" in body["error"]["message"]
    fresh = PageTokenCodec(DynamoSigningKey(TABLES["BERTH_TENANTS_TABLE"])).encode(data)
    assert api("GET", "/v1/jobs", query={"next_token": fresh})[0] == 200


# -- keyed submit whose answer was lost --------------------------------------------------------------
def test_committed_then_timed_out_keyed_submit_gives_one_job(
    api: Invoke, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer

    class LambdaTimedOut(BaseException):
        """What a Lambda timeout looks like from inside: the process stops, no except clause runs."""

    def killed(*_args: Any, **_kwargs: Any) -> None:
        raise LambdaTimedOut

    headers = {"Idempotency-Key": "nightly-2026-12-01"}
    with monkeypatch.context() as patch:
        # The job's transaction commits, then the function dies before Powertools records success.
        patch.setattr(BasePersistenceLayer, "save_success", killed)
        with pytest.raises(LambdaTimedOut):
            api("POST", "/v1/jobs", body=spec, headers=headers)
    assert _jobs_stored() == 1

    # Powertools' record is left IN_PROGRESS until the invocation's deadline; after it, a retry runs
    # the function again.
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    items = ddb.scan(TableName=TABLES["BERTH_IDEMPOTENCY_TABLE"])["Items"]
    in_progress = [i for i in items if i.get("status", {}).get("S") == "INPROGRESS"]
    assert len(in_progress) == 1
    ddb.update_item(
        TableName=TABLES["BERTH_IDEMPOTENCY_TABLE"],
        Key={"id": in_progress[0]["id"]},
        UpdateExpression="SET in_progress_expiration = :past",
        ExpressionAttributeValues={":past": {"N": str(int(time.time() * 1000) - 1000)}},
    )
    status, job = api("POST", "/v1/jobs", body=spec, headers=headers)
    assert status == 201
    assert _jobs_stored() == 1
    status, page = api("GET", "/v1/jobs")
    assert [j["id"] for j in page["jobs"]] == [job["id"]]
    # The same key with another spec is still a conflict, and still one job.
    status, body = api("POST", "/v1/jobs", body={**spec, "name": "other"}, headers=headers)
    assert status == 409 and body["error"]["code"] == "IdempotencyKeyReused" and _jobs_stored() == 1


def test_keyed_submits_still_meet_the_active_job_quota(api: Invoke, spec: dict[str, Any]) -> None:
    status, _ = api("PUT", "/v1/tenants/vision/quota", user="admin", body={"max_active_jobs": 1})
    assert status == 200
    status, first = api("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": "a"})
    assert status == 201
    status, body = api("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": "b"})
    assert status == 429 and body["error"]["code"] == "QuotaExceeded"
    status, again = api("POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": "a"})
    assert status == 201 and again["id"] == first["id"] and _jobs_stored() == 1


def test_an_accepted_member_is_kept_for_the_cache_time_and_a_removal_bites_after(
    api: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API keeps an identity it accepted (not a refusal) for ``identity_cache_s``: a member
    removed from the table still passes in a warm sandbox until the entry expires, then is refused."""
    import boto3 as _boto3

    from berth.handlers import services

    _register_role(ROLE_ID)
    assert api("GET", "/v1/jobs", identity=_session("alice"))[0] == 200
    _boto3.client("dynamodb", region_name="us-east-1").delete_item(
        TableName=TABLES["BERTH_TENANTS_TABLE"], Key={"pk": {"S": f"PRINCIPAL#{ROLE}"}}
    )
    assert api("GET", "/v1/jobs", identity=_session("alice"))[0] == 200  # kept
    kept = services.members()
    monkeypatch.setattr(kept, "clock", lambda: 10.0**12)  # past every entry's expiry
    status, body = api("GET", "/v1/jobs", identity=_session("alice"))
    assert status == 403 and body["error"]["code"] == "Forbidden"
