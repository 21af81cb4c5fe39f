"""Bundles, data sources, datasets, grants and secrets through the API Lambda on moto (issue 9)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import requests

from berth_tools.localcloud import moto_faithful
from tests.functional.conftest import BUCKETS, Invoke
from tests.functional.test_api import stored_jobs

DATA = BUCKETS["BERTH_DATA_BUCKET"]
BUNDLE = b"fake tar.gz of a training program"
DIGEST = hashlib.sha256(BUNDLE).hexdigest()


@pytest.fixture(autouse=True)
def faithful() -> Iterator[None]:
    undo = moto_faithful.install()
    yield
    undo()


def _code_spec(digest: str = DIGEST, **extra: Any) -> dict[str, Any]:
    return {"name": "mnist", "code": f"sha256:{digest}", "command": ["python", "train.py"], **extra}


def _upload(
    api: Invoke, user: str = "alice", body: bytes = BUNDLE, digest: str = DIGEST
) -> requests.Response:
    status, answer = api("POST", "/v1/bundles", user=user, body={"digest": digest, "size": len(body)})
    assert status == 201 and answer["present"] is False, answer
    up = answer["upload"]
    assert up["method"] == "PUT" and up["expires_in_s"] <= 900
    return requests.put(up["url"], data=body, headers=up["headers"], timeout=10)


def test_bundle_upload_once_then_present_then_submit(api: Invoke) -> None:
    assert _upload(api).status_code == 200
    status, again = api("POST", "/v1/bundles", body={"digest": DIGEST, "size": len(BUNDLE)})
    assert status == 200 and again == {"digest": DIGEST, "present": True, "upload": None}
    status, job = api("POST", "/v1/jobs", body=_code_spec())
    assert status == 201 and job["spec"]["code"] == f"sha256:{DIGEST}"
    tags = boto3.client("s3", region_name="us-east-1").get_object_tagging(
        Bucket=BUCKETS["BERTH_ARTIFACTS_BUCKET"], Key=f"bundles/vision/sha256/{DIGEST}.tar.gz"
    )["TagSet"]
    assert {"Key": "berth-referenced", "Value": "true"} in tags


def test_an_upload_whose_content_is_not_its_digest_is_refused(api: Invoke) -> None:
    resp = _upload(api, body=b"x" * len(BUNDLE))  # same size, other content
    assert resp.status_code == 400 and b"BadDigest" in resp.content
    status, body = api("POST", "/v1/jobs", body=_code_spec())
    assert status == 422 and "never uploaded" in body["error"]["message"]


def test_a_stored_bundle_is_immutable(api: Invoke) -> None:
    _, answer = api("POST", "/v1/bundles", body={"digest": DIGEST, "size": len(BUNDLE)})
    up = answer["upload"]
    assert requests.put(up["url"], data=BUNDLE, headers=up["headers"], timeout=10).status_code == 200
    second = requests.put(up["url"], data=BUNDLE, headers=up["headers"], timeout=10)
    assert second.status_code == 412


@pytest.mark.parametrize(
    "body",
    [
        {"digest": "A" * 64, "size": 10},
        {"digest": DIGEST, "size": 0},
        {"digest": DIGEST, "size": 3 * 1024**3},
    ],
)
def test_bad_bundle_requests(api: Invoke, body: dict[str, Any]) -> None:
    status, resp = api("POST", "/v1/bundles", body=body)
    assert status == 422, resp


def test_submit_refuses_a_digest_never_uploaded_or_another_tenants(api: Invoke) -> None:
    status, body = api("POST", "/v1/jobs", body=_code_spec())
    assert status == 422 and body["error"]["details"] == {"code": f"sha256:{DIGEST}"}
    assert _upload(api, user="bob").status_code == 200  # nlp's bundle with the same content
    status, body = api("POST", "/v1/jobs", body=_code_spec())
    assert status == 422
    assert stored_jobs() == 0


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (f"s3://{DATA}/vision/imagenet/", 201),
        (f"s3://{DATA}/vision2/imagenet/", 403),  # vision must not match vision2
        (f"s3://{DATA}/nlp/corpus/", 403),
        (f"s3://{DATA}/", 403),
        ("s3://someone-elses-bucket/data/", 403),
        ("/datasets/imagenet", 403),
        ("dataset://unknown", 403),
    ],
)
def test_data_sources(api: Invoke, source: str, expected: int) -> None:
    spec = {"name": "r", "image": "busybox", "data": [{"source": source, "mount": "/data"}]}
    status, body = api("POST", "/v1/jobs", body=spec)
    assert status == expected, body
    if expected == 403:
        assert body["error"]["details"] == {"source": source} and source in body["error"]["message"]
        assert stored_jobs() == 0


def test_grants_and_datasets_are_admin_decisions(api: Invoke) -> None:
    from berth.handlers import services

    spec = {"name": "r", "image": "busybox", "data": [{"source": "s3://shared-corpora/wiki/", "mount": "/d"}]}
    assert api("POST", "/v1/jobs", body=spec)[0] == 403
    assert api("PUT", "/v1/tenants/vision/grants", body={"s3_prefixes": ["s3://shared-corpora/"]})[0] == 403
    status, grants = api(
        "PUT", "/v1/tenants/vision/grants", user="admin", body={"s3_prefixes": ["s3://shared-corpora/"]}
    )
    assert status == 200 and grants == {"s3_prefixes": ["s3://shared-corpora/"]}
    assert api("GET", "/v1/tenants/vision/grants")[1] == grants
    assert api("GET", "/v1/tenants/vision/grants", user="bob")[0] == 403
    assert api("POST", "/v1/jobs", body=spec)[0] == 201
    bad = {"s3_prefixes": ["s3://shared-corpora/wiki"]}  # a prefix must end with '/'
    assert api("PUT", "/v1/tenants/vision/grants", user="admin", body=bad)[0] == 422

    dataset = {
        "locations": [{"pool": "a100", "root": "/datasets/glue"}],
        "tenants": ["nlp"],
        "residency": "onprem-only",
    }
    ds_spec = {"name": "r", "image": "busybox", "data": [{"source": "dataset://glue", "mount": "/data"}]}
    assert api("PUT", "/v1/datasets/glue", user="bob", body=dataset)[0] == 403
    status, stored = api("PUT", "/v1/datasets/glue", user="admin", body=dataset)
    assert status == 200 and stored["residency"] == "onprem-only"
    # on-prem only, and pool a100 has no hosts yet: no site could ever run it (submit-time feasibility)
    status, err = api("POST", "/v1/jobs", user="bob", body=ds_spec)
    assert status == 422 and err["error"]["details"]["rule"] == "residency", err
    from tests.functional.test_fleet_api import _register

    _register("a100-host", "A100", 8, pool="a100")
    services.fleet().clear_cache()
    assert api("POST", "/v1/jobs", user="bob", body=ds_spec)[0] == 201
    assert api("POST", "/v1/jobs", body=ds_spec)[0] == 403
    assert api("GET", "/v1/datasets/glue")[0] == 404  # not vision's to see
    assert api("GET", "/v1/datasets/glue", user="bob")[1] == stored
    traversal = {**dataset, "locations": [{"pool": "a100", "root": "/datasets/../etc"}]}
    assert api("PUT", "/v1/datasets/glue", user="admin", body=traversal)[0] == 422


def test_secrets_by_reference_only(api: Invoke) -> None:
    sm = boto3.client("secretsmanager", region_name="us-east-1")
    sm.create_secret(Name="berth/vision/wandb", SecretString="s3cr3t-vision-token")
    sm.create_secret(Name="berth/nlp/hf", SecretString="s3cr3t-nlp-token")
    base = {"name": "r", "image": "busybox"}
    status, body = api("POST", "/v1/jobs", body={**base, "secrets": {"HF_TOKEN": "berth/nlp/hf"}})
    assert status == 403 and body["error"]["details"] == {"secret": "berth/nlp/hf"}
    status, body = api("POST", "/v1/jobs", body={**base, "secrets": {"X": "berth/vision/missing"}})
    assert status == 422
    status, body = api("POST", "/v1/jobs", body={**base, "secrets": {"WANDB_API_KEY": "berth/vision/wandb"}})
    assert status == 201
    everything = json.dumps(
        [body, api("GET", f"/v1/jobs/{body['id']}")[1], api("GET", f"/v1/jobs/{body['id']}/events")[1]]
    )
    assert "s3cr3t" not in everything and "berth/vision/wandb" in everything
    clash = {**base, "env": {"WANDB_API_KEY": "x"}, "secrets": {"WANDB_API_KEY": "berth/vision/wandb"}}
    assert api("POST", "/v1/jobs", body=clash)[0] == 422


def test_presigned_upload_is_bound_to_its_digest(api: Invoke) -> None:
    _, answer = api("POST", "/v1/bundles", body={"digest": DIGEST, "size": len(BUNDLE)})
    headers = answer["upload"]["headers"]
    assert headers["x-amz-checksum-sha256"] == base64.b64encode(bytes.fromhex(DIGEST)).decode()
    assert headers["If-None-Match"] == "*" and headers["Content-Length"] == str(len(BUNDLE))
    assert f"bundles/vision/sha256/{DIGEST}.tar.gz" in answer["upload"]["url"]


def test_adapters_translate_aws_failures(aws: None) -> None:
    from botocore.config import Config

    from berth.dal.storage import S3BundleStore, SecretsManagerCatalog
    from berth.domain.errors import StoreUnavailable

    store = S3BundleStore(BUCKETS["BERTH_ARTIFACTS_BUCKET"])
    assert store.exists("vision", DIGEST) is False  # absent is an answer, not a failure
    assert SecretsManagerCatalog().exists("berth/vision/none") is False
    unreachable = boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        config=Config(retries={"max_attempts": 1}),
    )
    with pytest.raises(StoreUnavailable):
        S3BundleStore("b", client=unreachable).exists("vision", DIGEST)
    with pytest.raises(StoreUnavailable):
        S3BundleStore("b", client=unreachable).mark_referenced("vision", DIGEST)


def test_a_bundle_known_referenced_costs_no_s3_call_for_a_while(api: Invoke) -> None:
    """A sweep's submits of one bundle: the first checks it exists and tags it referenced; the next
    ones, in the same instance and window, ask S3 nothing. Another tenant's digest is still checked."""
    from berth.dal.storage import S3BundleStore

    assert _upload(api).status_code == 200
    s3 = boto3.client("s3", region_name="us-east-1")
    calls: list[str] = []
    s3.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
    store = S3BundleStore(BUCKETS["BERTH_ARTIFACTS_BUCKET"], client=s3)
    for _ in range(5):
        assert store.exists("vision", DIGEST)
        store.mark_referenced("vision", DIGEST)
    assert calls == ["HeadObject", "PutObjectTagging"]
    assert store.exists("nlp", DIGEST) is False  # per tenant
    expired = S3BundleStore(BUCKETS["BERTH_ARTIFACTS_BUCKET"], client=s3, known_referenced_s=0)
    calls.clear()
    expired.mark_referenced("vision", DIGEST)
    assert expired.exists("vision", DIGEST) and calls == ["PutObjectTagging", "HeadObject"]
