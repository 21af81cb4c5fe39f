"""SigV4 at the front door, case by case, against botocore's own signer (`botocore.auth.SigV4Auth`):
each request is signed as an AWS SDK signs it and sent exactly as botocore prepared it, through the
real front door of a running local cloud; all are accepted (200, the handler saw the decoded values),
and the same requests changed after signing are refused (403 INVALID_SIGNATURE).

Two ways a client hands botocore a query: as parameters (botocore encodes them, RFC 3986, for the
signature, and its `prepare()` builds the URL, where a space is `+`), or already in the URL (botocore
signs the query as written; here written as RFC 3986 asks, `%20` for a space).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from berth_tools.localcloud.cloud import LocalCloud
from berth_tools.localcloud.sigv4 import canonical_path, canonical_query

from .helpers import call

Params = list[tuple[str, str]]

#: (case, query parameters in the order sent)
QUERIES: list[tuple[str, Params]] = [
    ("plain", [("status", "RUNNING")]),
    ("padded base64 token", [("next_token", "eyJrIjoiajEifQ==")]),
    ("equals inside", [("filter", "a=b=c")]),
    ("equals in a key", [("x=y", "1")]),
    ("plus", [("q", "a+b")]),
    ("space", [("q", "a b")]),
    ("percent", [("q", "100%")]),
    ("percent escape lookalike", [("q", "%41")]),
    ("tilde and unreserved", [("q", "~a-b_c.d")]),
    ("reserved characters", [("q", "!*'();:@&=+$,/?#[]")]),
    ("unicode", [("name", "zürich-東京-🚀")]),
    ("empty value", [("limit", ""), ("status", "QUEUED")]),
    ("repeated keys", [("tag", "b"), ("tag", "a"), ("tag", "a")]),
    ("sort by key then value", [("b", "2"), ("a", "z"), ("a", "y"), ("A", "x")]),
    ("sort on the encoded key", [("a~", "1"), ("a.", "2"), ("a-", "3"), ("a_", "4")]),
    ("slash in value", [("prefix", "s3://bucket/a/b")]),
]

#: (case, path after the stage, the {id} the handler must see)
PATHS: list[tuple[str, str, str]] = [
    ("array task id", "/v1/jobs/" + quote("j-1:7", safe=""), "j-1:7"),
    ("colon unencoded", "/v1/jobs/j-1:7", "j-1:7"),
    ("tilde", "/v1/jobs/j~1", "j~1"),
    ("space", "/v1/jobs/" + quote("a b", safe=""), "a b"),
    ("unicode", "/v1/jobs/" + quote("zürich", safe=""), "zürich"),
    ("encoded plus", "/v1/jobs/" + quote("a+b", safe=""), "a+b"),
    ("literal plus", "/v1/jobs/a+b", "a+b"),
    ("equals", "/v1/jobs/a=b", "a=b"),
]


def _keys(cloud: LocalCloud) -> Credentials:
    user = cloud.profiles["alice"]
    return Credentials(user.access_key_id, user.secret_access_key)


def signed_by_botocore(
    cloud: LocalCloud, path: str, params: Params, *, in_url: bool
) -> tuple[str, dict[str, str]]:
    """The URL as botocore sends it and its signed headers."""
    base = cloud.api_url + path
    if in_url:
        url = base + ("?" + urlencode(params, quote_via=quote) if params else "")
        request = AWSRequest(method="GET", url=url)
    else:
        request = AWSRequest(method="GET", url=base, params=params)
    SigV4Auth(_keys(cloud), "execute-api", cloud.region).add_auth(request)
    prepared = request.prepare()
    return prepared.url, dict(prepared.headers.items())


def _seen(body: Any) -> dict[str, list[str]]:
    return body["event"]["multiValueQueryStringParameters"] or {}


def _expected(params: Params) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in params:
        out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("in_url", [False, True], ids=["params", "in-url"])
@pytest.mark.parametrize(("case", "params"), QUERIES, ids=[c for c, _ in QUERIES])
def test_botocore_signed_queries_are_accepted(
    cloud: LocalCloud, case: str, params: Params, in_url: bool
) -> None:
    url, headers = signed_by_botocore(cloud, "/v1/jobs", params, in_url=in_url)
    status, _, body = call("GET", url, headers)
    assert status == 200, (case, url, body)
    assert _seen(body) == _expected(params), (case, url)


@pytest.mark.parametrize(("case", "path", "job_id"), PATHS, ids=[c for c, _, _ in PATHS])
def test_botocore_signed_paths_are_accepted(cloud: LocalCloud, case: str, path: str, job_id: str) -> None:
    url, headers = signed_by_botocore(cloud, path, [("a", "b=")], in_url=False)
    status, _, body = call("GET", url, headers)
    assert status == 200, (case, url, body)
    assert body["event"]["pathParameters"] == {"id": job_id}, (case, url)


def _tamper(url: str, old: str, new: str) -> str:
    assert old in url, (url, old)
    return url.replace(old, new, 1)


#: (case, params signed, the change made to the sent URL after signing)
TAMPERED: list[tuple[str, Params, tuple[str, str]]] = [
    ("value changed", [("next_token", "abc==")], ("abc", "abd")),
    ("equals dropped", [("next_token", "abc==")], ("%3D%3D", "%3D")),
    ("space became plus", [("q", "a b")], ("a+b", "a%2Bb")),
    ("plus became space", [("q", "a+b")], ("a%2Bb", "a+b")),
    ("parameter added", [("q", "1")], ("q=1", "q=1&r=2")),
    ("repeated key dropped", [("tag", "a"), ("tag", "b")], ("&tag=b", "")),
    ("empty value given one", [("limit", "")], ("limit=", "limit=1")),
    ("key changed", [("status", "QUEUED")], ("status", "Status")),
    ("unicode changed", [("n", "ü")], ("%C3%BC", "%C3%B6")),
]


@pytest.mark.parametrize(("case", "params", "change"), TAMPERED, ids=[c for c, _, _ in TAMPERED])
def test_requests_changed_after_signing_are_refused(
    cloud: LocalCloud, case: str, params: Params, change: tuple[str, str]
) -> None:
    url, headers = signed_by_botocore(cloud, "/v1/jobs", params, in_url=False)
    status, _, body = call("GET", _tamper(url, *change), headers)
    assert status == 403, (case, body)
    assert body["error"]["code"] == "INVALID_SIGNATURE", body


def test_a_changed_path_is_refused(cloud: LocalCloud) -> None:
    url, headers = signed_by_botocore(cloud, "/v1/jobs/" + quote("j-1:7", safe=""), [], in_url=False)
    status, _, body = call("GET", _tamper(url, "%3A7", "%3A8"), headers)
    assert (status, body["error"]["code"]) == (403, "INVALID_SIGNATURE"), body


@pytest.mark.parametrize(("case", "params"), QUERIES, ids=[c for c, _ in QUERIES])
def test_canonical_query_is_botocores(case: str, params: Params) -> None:
    """Of the URL botocore sends for parameters, the canonical query botocore signed."""
    request = AWSRequest(method="GET", url="https://example.com/p", params=params)
    signer = SigV4Auth(Credentials("k", "s"), "execute-api", "us-east-1")
    assert canonical_query(urlsplit(request.prepare().url).query) == signer.canonical_query_string(request)


@pytest.mark.parametrize(("case", "path", "job_id"), PATHS, ids=[c for c, _, _ in PATHS])
def test_canonical_path_is_botocores(case: str, path: str, job_id: str) -> None:
    request = AWSRequest(method="GET", url="https://example.com/prod" + path)
    signer = SigV4Auth(Credentials("k", "s"), "execute-api", "us-east-1")
    assert canonical_path("/prod" + path) == signer.canonical_request(request).split("\n")[1]


#: (case, params signed, a change to the sent URL that AWS canonicalises away)
EQUIVALENT: list[tuple[str, Params, tuple[str, str]]] = [
    ("equals sent raw (as curl sends it)", [("next_token", "abc==")], ("abc%3D%3D", "abc==")),
    ("tilde sent encoded", [("q", "~x")], ("~x", "%7Ex")),
    ("lower-case escapes", [("prefix", "a/b")], ("%2F", "%2f")),
    ("space sent as %20", [("q", "a b")], ("a+b", "a%20b")),
    ("repeated keys in another order", [("tag", "a"), ("tag", "b")], ("tag=a&tag=b", "tag=b&tag=a")),
    ("colon sent raw", [("at", "10:00")], ("%3A", ":")),
]


@pytest.mark.parametrize(("case", "params", "change"), EQUIVALENT, ids=[c for c, _, _ in EQUIVALENT])
def test_equivalent_encodings_are_accepted(
    cloud: LocalCloud, case: str, params: Params, change: tuple[str, str]
) -> None:
    url, headers = signed_by_botocore(cloud, "/v1/jobs", params, in_url=False)
    status, _, body = call("GET", _tamper(url, *change), headers)
    assert status == 200, (case, body)
    assert _sorted(_seen(body)) == _sorted(_expected(params)), case


def _sorted(query: dict[str, list[str]]) -> dict[str, list[str]]:
    return {key: sorted(values) for key, values in query.items()}


def test_the_berth_cli_client_signs_queries_api_gateway_accepts(
    cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`berth`'s own client (urlencode with RFC 3986 quoting, signed by botocore as written)."""
    from berth_tools.client import BerthClient, ClientConfig

    user = cloud.profiles["alice"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", user.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", user.secret_access_key)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    client = BerthClient(ClientConfig(api_url=cloud.api_url, region=cloud.region, profile=None))
    query = {"next_token": "eyJ9==", "q": "a b+c", "since": "2026-12-01T10:00:00Z", "n": "ü~"}
    answer = client.request("GET", "/v1/jobs", query=query)
    assert answer["event"]["queryStringParameters"] == query
