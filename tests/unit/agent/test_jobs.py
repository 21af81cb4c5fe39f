"""From a claim (as the agent API returns it) to a Launch: validation, GPUs, data, rendezvous."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from berth_agent.config import AgentConfig, JobLimits
from berth_agent.gpus import Gpu, Inventory
from berth_agent.jobs import Claim, ClaimError, build_launch, data_mounts, resolve_host_path
from berth_agent.staging import JobDirs, StagingError

INV = Inventory(
    gpus=(
        Gpu(0, "GPU-a", "H100", 81920),
        Gpu(1, "GPU-b", "H100", 81920),
        Gpu(2, "GPU-sick", "H100", 81920, healthy=False, reason="ecc"),
    ),
    gpu_type="H100",
    source="nvml",
)


def _payload(**spec: Any) -> dict[str, Any]:
    return {
        "job_id": "j-1",
        "attempt": 2,
        "tenant": "vision",
        "spec": {"name": "train", "image": "pytorch/pytorch:2.5", "command": ["python", "t.py"], **spec},
        "gpu_ids": ["GPU-a"],
        "rank": 0,
        "world_size": 1,
    }


def _config(tmp_path: Path, **kw: Any) -> AgentConfig:
    return AgentConfig(api_url="http://x", pool="lab", host_id="h1", work_dir=tmp_path, **kw)


def test_claim_to_launch(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "train").mkdir(parents=True)
    cfg = _config(
        tmp_path, datasets={"imagenet": root}, limits=JobLimits(address_space_gib=2, cpu_seconds=60)
    )
    claim = Claim.parse(
        _payload(
            env={"EPOCHS": "2"},
            data=[{"source": "dataset://imagenet/train", "mount": "/data"}],
            resources={"gpu_type": "H100", "gpus": 1, "cpu": 8, "memory_gib": 32},
            timeout_minutes=90,
        )
    )
    dirs = JobDirs.create(tmp_path, claim.job_id, claim.attempt)
    mounts = data_mounts(claim.spec, cfg.datasets, dirs)
    launch = build_launch(
        claim, cfg, dirs, mounts, gpu_uuids=claim.check_gpus(INV), credentials={"AWS_ACCESS_KEY_ID": "ASIA"}
    )
    assert launch.command == ("python", "t.py") and launch.image == "pytorch/pytorch:2.5"
    assert launch.timeout_s == 5400 and launch.gpu_uuids == ("GPU-a",) and launch.rendezvous is None
    assert launch.mounts[0].source == root / "train" and launch.mounts[0].read_only
    assert launch.limits.cpus == 8 and launch.limits.memory_gib == 32
    assert launch.limits.address_space_bytes == 2 * 1024**3 and launch.limits.cpu_seconds == 60
    assert launch.workdir == dirs.work and launch.output_dir == dirs.outputs


@pytest.mark.parametrize(
    "payload",
    [
        {**_payload(), "spec": {"name": "x", "image": "a", "command": ["c"], "unknown": 1}},
        _payload(env={"AWS_SECRET_ACCESS_KEY": "steal"}),
        _payload(data=[{"source": "dataset://imagenet/../etc", "mount": "/d"}]),
        {**_payload(), "spec": {"name": "x", "command": ["c"]}},  # neither image nor code
        {**_payload(), "spec": {"name": "x", "image": "a"}},  # no command
        {"job_id": "j"},
    ],
)
def test_bad_claims_are_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(ClaimError):
        Claim.parse(payload)


@pytest.mark.parametrize(
    "gpus",
    [["GPU-sick"], ["GPU-other-host"], ["GPU-a", "GPU-a"], ["GPU-a", "GPU-b"]],
)
def test_only_this_hosts_healthy_gpus_in_the_right_number(gpus: list[str]) -> None:
    with pytest.raises(ClaimError):
        Claim.parse({**_payload(), "gpu_ids": gpus}).check_gpus(INV)


def test_multi_node_rendezvous() -> None:
    payload = {
        **_payload(resources={"gpu_type": "H100", "gpus": 4, "nodes": 2}),
        "gpu_ids": ["GPU-a", "GPU-b"],
        "rank": 1,
        "world_size": 2,
        "master_addr": "10.0.0.5",
        "master_port": 29500,
    }
    claim = Claim.parse(payload)
    assert claim.check_gpus(INV) == ("GPU-a", "GPU-b")
    rdv = claim.rendezvous()
    assert rdv is not None and rdv.env()["NODE_RANK"] == "1" and rdv.env()["WORLD_SIZE"] == "2"
    with pytest.raises(ClaimError):
        Claim.parse({**payload, "master_addr": None}).rendezvous()
    with pytest.raises(ClaimError):
        Claim.parse({**payload, "rank": 2}).rendezvous()


def test_data_sources(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "x").mkdir(parents=True)
    (tmp_path / "private").mkdir()
    dirs = JobDirs.create(tmp_path, "j", 1)
    roots = {"d": root}
    assert resolve_host_path(str(root / "x"), roots) == root / "x"
    with pytest.raises(StagingError, match="not inside"):
        resolve_host_path(str(tmp_path / "private"), roots)
    spec = Claim.parse(_payload(data=[{"source": "s3://bucket-a/vision/x/", "mount": "/s3"}])).spec
    with pytest.raises(StagingError, match="stages no S3"):
        data_mounts(spec, roots, dirs)
    staged: list[tuple[str, Path]] = []

    def stage(uri: str, dest: Path) -> Path:
        staged.append((uri, dest))
        return dest

    (m,) = data_mounts(spec, roots, dirs, stage_s3=stage)
    assert (
        staged == [("s3://bucket-a/vision/x/", dirs.base / "data" / "0")]
        and m.target == "/s3"
        and m.read_only
    )
    host = Claim.parse(_payload(data=[{"source": str(tmp_path / "private"), "mount": "/p"}])).spec
    with pytest.raises(StagingError):
        data_mounts(host, roots, dirs)


def test_a_claim_answer_as_the_control_plane_builds_it() -> None:
    """berth.logic.agent.claim dumps the stored spec with mode="json", exclude_none=True."""
    from berth.domain.job_spec import JobSpec

    spec = JobSpec.model_validate(
        {
            "name": "train",
            "image": "pytorch/pytorch:2.5",
            "command": ["python", "t.py"],
            "resources": {"gpu_type": "H100", "gpus": 2, "cpu": 8, "memory_gib": 64.5, "nodes": 2},
            "constraints": {"placement": "onprem", "priority": "high"},
            "secrets": {"TOKEN": "berth/vision/token"},
        }
    )
    answer = {
        "job_id": "j-1",
        "attempt": 1,
        "tenant": "vision",
        "spec": spec.model_dump(mode="json", exclude_none=True),
        "gpu_ids": ["GPU-a"],
        "rank": 1,
        "world_size": 2,
        "hosts": ["h0", "h1"],
        "master_addr": "h0",
        "master_port": 29500,
        "heartbeat_s": 10,
    }
    claim = Claim.parse(answer)
    assert claim.spec == spec and claim.check_gpus(INV) == ("GPU-a",)
    rdv = claim.rendezvous()
    assert rdv is not None and rdv.env()["MASTER_ADDR"] == "h0" and rdv.env()["RANK"] == "1"
