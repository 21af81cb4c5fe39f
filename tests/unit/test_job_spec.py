from typing import Any

import pytest
from pydantic import ValidationError

from berth.domain.job_spec import JobSpec


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "resnet50",
        "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "command": ["python", "train.py"],
    }
    base.update(over)
    return base


def errors(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(data)
    return str(exc.value)


def test_full_spec_round_trips() -> None:
    data = spec(
        env={"EPOCHS": "10"},
        data=[
            {"source": "s3://vision-data/imagenet/", "mount": "/data"},
            {"source": "/datasets/coco", "mount": "/coco"},
        ],
        resources={"gpu_type": "A100", "gpus": 16, "cpu": 64, "memory_gib": 512, "nodes": 2},
        constraints={
            "placement": "cloud",
            "regions": ["us-east-1"],
            "max_cost_usd": 100,
            "max_hourly_usd": 40,
            "spot": "required",
            "priority": "high",
        },
        retry={"max_attempts": 5},
        timeout_minutes=600,
    )
    s = JobSpec.model_validate(data)
    assert s.resources.gpus_per_node == 8
    assert JobSpec.model_validate(s.model_dump(mode="json")) == s


def test_defaults() -> None:
    s = JobSpec.model_validate(spec())
    assert s.resources.gpus == 1 and s.constraints.placement == "auto" and s.retry.max_attempts == 3


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (spec(gpu=1), "Extra inputs are not permitted"),
        (spec(resources={"gpus": 65}), "less than or equal to 64"),
        (spec(resources={"gpus": 0}), "greater than or equal to 1"),
        (spec(resources={"gpu_type": "GTX1080"}), "unknown GPU model"),
        (spec(resources={"gpus": 3, "nodes": 2}), "multiple of nodes"),
        (spec(command="python train.py"), "not a shell string"),
        (spec(name="Bad Name!"), "should match pattern"),
        (spec(env={"1BAD": "x"}), "is not a variable name"),
        (spec(env={"AWS_SECRET_ACCESS_KEY": "x"}), "reserved"),
        (spec(code="s3://bundles/x.tar.gz"), "exactly one of 'image' or 'code'"),
        ({"name": "x", "command": ["a"]}, "exactly one of 'image' or 'code'"),
        (spec(image=None, code="s3://bundles-1/x.tgz", command=[]), "needs a command"),
        (spec(data=[{"source": "s3://b-1/x", "mount": "/d/../etc"}]), "'..'"),
        (spec(data=[{"source": "ftp://x", "mount": "/d"}]), "should match pattern"),
        (spec(constraints={"placement": "onprem", "spot": "required"}), "cannot be combined"),
        (spec(constraints={"regions": ["mars-1"]}), "should match pattern"),
        (spec(constraints={"priority": "urgent"}), "Input should be"),
        (spec(retry={"max_attempts": 0}), "greater than or equal to 1"),
        (spec(timeout_minutes=0), "greater than or equal to 1"),
        (spec(timeout_minutes=True), "valid integer"),
        (spec(resources={"gpus": "4"}), "valid integer"),
        (spec(env={"NVIDIA_VISIBLE_DEVICES": "all"}), "reserved"),
        (spec(env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}), "reserved"),
        (spec(env={"LD_PRELOAD": "/tmp/x.so"}), "reserved"),
        (spec(env={"OK": "a\x00b"}), "NUL"),
        (spec(command=["python", "a\x00b"]), "NUL"),
        (spec(data=[{"source": "/datasets/../../etc", "mount": "/d"}]), "'..'"),
    ],
)
def test_rejects_bad_specs_with_clear_messages(data: dict[str, Any], needle: str) -> None:
    assert needle in errors(data)


@pytest.mark.parametrize(
    "command",
    [
        ["env", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", "NVIDIA_VISIBLE_DEVICES=all", "python", "t.py"],
        ["env", "LD_PRELOAD=/tmp/x.so", "python", "t.py"],
        ["env", "BERTH_JOB_ID=someone-else", "python", "t.py"],
        ["env", "-u", "CUDA_VISIBLE_DEVICES", "python", "t.py"],
        ["env", "--unset=CUDA_VISIBLE_DEVICES", "python", "t.py"],
        ["sh", "-c", "CUDA_VISIBLE_DEVICES=0 python t.py"],
        ["bash", "-c", "export LD_PRELOAD=/x.so; ./run"],
        ["sh", "-c", "unset CUDA_VISIBLE_DEVICES && python t.py"],
        ["sh", "-c", "true; AWS_ACCESS_KEY_ID=AKIA aws s3 ls"],
    ],
)
def test_a_command_that_sets_a_reserved_variable_is_refused(command: list[str]) -> None:
    with pytest.raises(ValidationError, match="reserved"):
        JobSpec.model_validate(spec(command=command))


@pytest.mark.parametrize(
    "command",
    [
        ["python3", "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"],
        ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
        ["python", "-u", "train.py", "--lr=0.1", "--env=prod", "MY_LD_VAR=1"],
        ["torchrun", "--nproc_per_node=8", "train.py"],
    ],
)
def test_a_command_that_only_reads_them_is_accepted(command: list[str]) -> None:
    assert list(JobSpec.model_validate(spec(command=command)).command) == command


@pytest.mark.parametrize("grace", [0, 901, -1, "30", 1.5, True])
def test_checkpoint_grace_is_bounded_and_strict(grace: object) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(spec(checkpoint={"grace_seconds": grace}))
    assert "checkpoint" in str(exc.value) and "grace_seconds" in str(exc.value)


def test_checkpoint_grace_defaults_to_todays_cancel_grace() -> None:
    assert JobSpec.model_validate(spec()).checkpoint is None  # the agent's cancel_grace_s (30 s)
    assert JobSpec.model_validate(spec(checkpoint={})).checkpoint.grace_seconds == 30  # type: ignore[union-attr]
    assert JobSpec.model_validate(spec(checkpoint={"grace_seconds": 900})).checkpoint.grace_seconds == 900  # type: ignore[union-attr]
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(checkpoint={"grace": 5}))
