"""The session policy of one job attempt (issue 9), as data: exactly the job's own resources."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from berth.domain.errors import Forbidden
from berth.domain.job import new_job
from berth.domain.job_access import (
    AccountScope,
    credential_seconds,
    session_name,
    session_policy,
    session_policy_json,
)
from berth.domain.job_spec import JobSpec
from berth.domain.storage import DataGrants, StorageLayout

LAYOUT = StorageLayout("art", "data")
SCOPE = AccountScope("aws", "us-east-1", "123456789012")
DIGEST = "ab" * 32


def _job(**spec: object) -> object:
    body = {"name": "t", "code": f"sha256:{DIGEST}", "command": ["python", "t.py"], **spec}
    job, _ = new_job(
        "j-1", "vision", "arn:aws:iam::123456789012:user/a", JobSpec.model_validate(body), datetime.now(UTC)
    )
    return job


def _statements(job: object, grants: DataGrants | None = None) -> dict[str, dict[str, object]]:
    doc = session_policy(job, 2, LAYOUT, grants or DataGrants(), {}, SCOPE)  # type: ignore[arg-type]
    return {st["Sid"]: st for st in doc["Statement"]}


def test_only_the_jobs_own_resources() -> None:
    st = _statements(
        _job(data=[{"source": "s3://data/vision/imagenet/", "mount": "/d"}], secrets={"K": "berth/vision/k"})
    )
    assert st["Inputs"]["Resource"] == [
        f"arn:aws:s3:::art/bundles/vision/sha256/{DIGEST}.tar.gz",
        "arn:aws:s3:::data/vision/imagenet/*",
    ]
    assert st["OwnOutputs"]["Resource"] == ["arn:aws:s3:::data/vision/jobs/j-1/*"]
    assert st["ListOwnOutputs"]["Condition"] == {"StringLike": {"s3:prefix": ["vision/jobs/j-1/*"]}}
    assert st["OwnSecrets"]["Resource"] == [
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:berth/vision/k-??????"
    ]
    assert st["OwnLogStream"]["Resource"][0].endswith("log-group:/berth/jobs/vision:log-stream:j-1/2")
    assert all(st_["Effect"] == "Allow" for st_ in st.values())


def test_sources_are_rechecked_against_the_tenant_record() -> None:
    with pytest.raises(Forbidden):
        _statements(_job(data=[{"source": "s3://data/vision2/x/", "mount": "/d"}]))
    with pytest.raises(Forbidden):
        _statements(_job(data=[{"source": "s3://shared/wiki/", "mount": "/d"}]))
    granted = _statements(
        _job(data=[{"source": "s3://shared/wiki/", "mount": "/d"}]), DataGrants(s3_prefixes=["s3://shared/"])
    )
    assert "arn:aws:s3:::shared/wiki/*" in granted["Inputs"]["Resource"]  # type: ignore[operator]


def test_packed_size_name_and_duration_fit_sts() -> None:
    job = _job(secrets={f"K{i}": f"berth/vision/secret-{i}" for i in range(8)})
    doc = session_policy(job, 1, LAYOUT, DataGrants(), {}, SCOPE)  # type: ignore[arg-type]
    assert len(session_policy_json(doc)) <= 2048
    assert session_name(job, 1) == "j-1.1"  # type: ignore[arg-type]
    assert (
        credential_seconds(60) == 900
        and credential_seconds(1800) == 1800
        and credential_seconds(10**6) == 3600
    )
    assert json.loads(session_policy_json(doc)) == doc


def test_a_spec_sts_could_never_vend_for_is_refused_at_submit() -> None:
    from berth.domain.errors import ValidationFailed
    from berth.domain.job_access import check_policy_fits

    many = {
        "name": "t",
        "image": "busybox",
        "data": [
            {"source": f"s3://data/vision/shard-{i:03d}-with-a-long-name/", "mount": f"/d{i}"}
            for i in range(32)
        ],
    }
    with pytest.raises(ValidationFailed) as exc:
        check_policy_fits(JobSpec.model_validate(many), "vision", LAYOUT, DataGrants(), {})
    assert exc.value.details["policy_chars"] > 2048
    check_policy_fits(
        JobSpec.model_validate({"name": "t", "image": "busybox"}), "vision", LAYOUT, DataGrants(), {}
    )
