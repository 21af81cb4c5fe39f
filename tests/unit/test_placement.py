"""One Site type and the typed placement record on the job."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from berth.domain.job import Job, new_job
from berth.domain.job_spec import JobSpec
from berth.domain.placement import CloudPlacement, OnPremPlacement, Site
from berth.domain.status import JobStatus
from berth.scheduler.decisions import CloudAssignment, OnPremAssignment

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = JobSpec.model_validate(
    {"name": "t", "image": "r/i:1", "command": ["x"], "resources": {"gpu_type": "A100-80G", "gpus": 2}}
)


def _queued() -> Job:
    job, _ = new_job("j-1", "vision", "alice", SPEC, NOW)
    return job


def test_onprem_decision_becomes_the_stored_record_and_round_trips() -> None:
    a = OnPremAssignment("j-1", "vision", "pool-a", "A100-80G", (("h1", 1), ("h2", 1)), 8.0, 32.0)
    rec = a.record()
    assert isinstance(rec, OnPremPlacement) and rec.site is Site.ONPREM
    job, _ = _queued().transition(JobStatus.STARTING, "placed", NOW, site=a.site, placement=rec)
    public = job.public()
    assert public["site"] == "onprem"
    assert public["placement"]["hosts"] == [
        {"host_id": "h1", "gpus": 1, "gpu_ids": []},
        {"host_id": "h2", "gpus": 1, "gpu_ids": []},
    ]
    again = Job.model_validate({**job.model_dump(), "placement": public["placement"]})
    assert again.placement == rec


def test_cloud_decision_record_is_discriminated_by_site() -> None:
    a = CloudAssignment("j-1", "vision", "us-east-1", "us-east-1a", "q", "p4d.24xlarge", 1, "A100", True, 9.8)
    rec = a.record()
    assert isinstance(rec, CloudPlacement)
    job = Job.model_validate({**_queued().model_dump(), "site": "cloud", "placement": rec.model_dump()})
    assert isinstance(job.placement, CloudPlacement) and job.placement.spot


def test_site_must_match_the_placement() -> None:
    rec = OnPremAssignment("j-1", "vision", "p", "A100-80G", (("h1", 2),), 8.0, 32.0).record()
    with pytest.raises(ValidationError):
        Job.model_validate({**_queued().model_dump(), "site": "cloud", "placement": rec})


def test_placement_record_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        OnPremPlacement.model_validate({"pool": "p", "gpu_type": "V100", "hosts": [], "extra": 1})
