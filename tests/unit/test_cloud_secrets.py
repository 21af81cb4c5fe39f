"""A cloud job's ``secrets``: the job definition they live in (keyed by image, tenant and secret set,
run with the tenant's execution role), the tenant prefix re-checked at dispatch (a stored spec is not
trusted alone), ECS's failure to read one mapped to a permanent failure, and the launcher passing the
values ECS injected on to a code-bundle job. No value ever appears in what Berth submits."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path

import pytest

from berth.domain.cloud import (
    BatchJob,
    BatchStatus,
    CloudSettings,
    SecretScopeError,
    batch_secrets,
    failed_outcome,
    job_definition_name,
)
from berth.domain.job_spec import JobSpec
from berth.domain.status import JobStatus
from berth.domain.workflow import Failure
from berth_agent.launch import EXIT_STAGING, Launcher, LaunchSpec
from tests.unit.test_cloud_dispatch import CloudWorld, _placement

ACCOUNT = "123456789012"
SETTINGS = CloudSettings(artifacts_bucket="art", data_bucket="data", account=ACCOUNT, home_region="us-east-1")
ARN = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:"


def _world() -> CloudWorld:
    w = CloudWorld()
    w.cloud = dataclasses.replace(w.cloud, settings=SETTINGS)
    return w


# -- names -------------------------------------------------------------------------------------------


def test_definitions_are_keyed_by_image_tenant_and_secret_set() -> None:
    one = (("WANDB", ARN + "berth/vision/wandb"),)
    two = (("HF", ARN + "berth/vision/hf"), ("WANDB", ARN + "berth/vision/wandb"))
    plain = job_definition_name("busybox", "vision")
    assert plain == f"berth-img-{plain.split('-')[2]}-vision"  # unchanged for jobs without secrets
    a = job_definition_name("busybox", "vision", one)
    assert a == job_definition_name("busybox", "vision", one) and a.startswith(plain + "-s")
    assert a != plain and a != job_definition_name("busybox", "vision", two)
    assert job_definition_name("busybox", "vision", two) == job_definition_name(
        "busybox", "vision", two[::-1]
    )
    # the same variable from another secret, or another variable from the same secret: another definition
    assert a != job_definition_name("busybox", "vision", (("WANDB", ARN + "berth/vision/other"),))
    assert a != job_definition_name("busybox", "vision", (("KEY", ARN + "berth/vision/wandb"),))
    assert a != job_definition_name("busybox", "nlp", one) and a != job_definition_name(
        "busybox:2", "vision", one
    )
    assert "wandb" not in a  # a hash, never the names
    assert len(job_definition_name("busybox", "t" * 32, two)) <= 128


def test_secret_names_are_rechecked_against_the_tenant_prefix() -> None:
    assert batch_secrets({"B": "berth/vision/b", "A": "berth/vision/x/a"}, "vision", SETTINGS) == (
        ("A", ARN + "berth/vision/x/a"),
        ("B", ARN + "berth/vision/b"),
    )
    for name in (
        "berth/nlp/hf",
        "berth/vision2/x",
        "berth/vision/",
        "berth/vision//x",
        "vision/x",
        "berth/*",
    ):
        with pytest.raises(SecretScopeError) as err:
            batch_secrets({"X": name}, "vision", SETTINGS)
        assert err.value.details == {"secret": name} or "prefix" in err.value.message
    with pytest.raises(SecretScopeError):  # no account or home region: no ARN to give ECS
        batch_secrets({"X": "berth/vision/x"}, "vision", dataclasses.replace(SETTINGS, home_region=""))
    assert batch_secrets({}, "vision", CloudSettings()) == ()


# -- dispatch ----------------------------------------------------------------------------------------


def test_a_job_with_secrets_gets_its_definition_and_the_tenants_execution_role() -> None:
    w = _world()
    job = w.place(secrets={"WANDB_API_KEY": "berth/vision/wandb"}, env={"LR": "0.1"})
    w.dispatch(job)
    assert w.deliver() == ["submitted"]
    (sub,) = w.batch.submitted
    assert sub.secrets == (("WANDB_API_KEY", ARN + "berth/vision/wandb"),)
    assert sub.execution_role == f"arn:aws:iam::{ACCOUNT}:role/Berth-exec-vision"
    assert sub.definition == job_definition_name("busybox", "vision", sub.secrets)
    # the variable comes from the definition's secrets, never from SubmitJob's overrides
    assert "WANDB_API_KEY" not in sub.environment and sub.environment["LR"] == "0.1"

    plain = w.place(name="plain")
    w.dispatch(plain)
    w.deliver()
    assert w.batch.submitted[-1].secrets == () and w.batch.submitted[-1].execution_role == ""
    assert w.batch.submitted[-1].definition == job_definition_name("busybox", "vision")


def test_a_code_bundle_job_tells_the_launcher_which_variables_are_secrets() -> None:
    w = _world()
    job = w.place(
        image=None, code="sha256:" + "a" * 64, command=["python", "t.py"], secrets={"TOK": "berth/vision/t"}
    )
    w.dispatch(job)
    w.deliver()
    (sub,) = w.batch.submitted
    launch = json.loads(sub.environment["BERTH_LAUNCH"])
    assert launch["secret_env"] == ["TOK"] and "berth/vision/t" not in sub.environment["BERTH_LAUNCH"]
    assert sub.definition == job_definition_name(SETTINGS.base_image, "vision", sub.secrets)


def test_a_stored_spec_naming_another_tenants_secret_is_refused_at_dispatch() -> None:
    """The API refuses it at submit (403); a record that got past that anyway is not submitted."""
    w = _world()
    job = w.place()
    crafted = job.spec.model_dump()
    crafted["secrets"] = {"HF_TOKEN": "berth/nlp/hf"}
    stored = w.job(job.id)
    w.jobs.update(stored.updated(stored.updated_at, spec=JobSpec.model_validate(crafted)))
    token = w.dispatch(w.job(job.id))
    assert w.deliver() == ["refused"]
    assert w.batch.submitted == []
    assert w.failures_of(token) == [Failure.INVALID_SPEC.error_name]
    assert w.classify(job, token)["action"] == "fail"
    assert w.job(job.id).status is JobStatus.FAILED


def test_ecs_failing_to_read_a_secret_is_a_permanent_invalid_spec() -> None:
    w = _world()
    job = w.place(secrets={"WANDB_API_KEY": "berth/vision/wandb"})
    token = w.dispatch(job)
    w.deliver()
    bid = w.batch_id(job.id)
    reason = (
        "ResourceInitializationError: unable to pull secrets or registry auth: execution resource "
        "retrieval failed: unable to retrieve secret from asm: ResourceNotFoundException: Secrets Manager "
        f"can't find the specified secret {ARN}berth/vision/wandb"
    )
    w.batch.set(bid, BatchStatus.FAILED, reason=reason)
    assert w.cloud.on_event(bid, f"{job.id}-a1") == "failed"
    assert w.failures_of(token) == [Failure.INVALID_SPEC.error_name]
    assert not [e for e in w.circuits.list() if e.failures]  # not the region's fault
    assert w.classify(job, token)["action"] == "fail"
    failed = w.job(job.id)
    assert failed.status is JobStatus.FAILED
    outcome = failed_outcome(
        BatchJob("b", f"{job.id}-a1", BatchStatus.FAILED, status_reason=reason), _placement(job)
    )
    # short enough for the job's reason: why, and the secret's name rather than its ARN
    assert outcome.failure is Failure.INVALID_SPEC
    assert outcome.detail.endswith(
        "ResourceNotFoundException: Secrets Manager can't find the specified secret berth/vision/wandb"
    ), outcome.detail
    assert "arn:" not in outcome.detail


# -- the launcher (code-bundle jobs) ----------------------------------------------------------------


def _launch_spec(**over: object) -> LaunchSpec:
    raw: dict[str, object] = {
        "job_id": "j-1",
        "attempt": 1,
        "tenant": "vision",
        "command": [sys.executable, "-c", "import os; print(len(os.environ['TOK']), 'OTHER' in os.environ)"],
        "env": {},
        "code": None,
        "timeout_s": 60,
        "grace_s": 0.5,
        **over,
    }
    return LaunchSpec.parse(json.dumps(raw))


class _NoIO:
    def fetch(self, *a: object, **k: object) -> None:
        raise AssertionError("nothing to fetch")


def test_the_launcher_passes_the_injected_secrets_and_nothing_else(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    environ = {"TOK": "s3cr3t-value", "OTHER": "host-only"}
    code = Launcher(
        _launch_spec(secret_env=["TOK"]),
        io=_NoIO(),
        work_dir=tmp_path,
        environ=environ,
        stdout=out,
        stderr=err,
    ).run()
    assert (code, out.getvalue()) == (0, "12 False\n"), err.getvalue()
    assert "s3cr3t" not in err.getvalue()


def test_the_launcher_refuses_to_run_without_an_injected_secret(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = Launcher(
        _launch_spec(secret_env=["TOK"]), io=_NoIO(), work_dir=tmp_path, environ={}, stdout=out, stderr=err
    ).run()
    assert code == EXIT_STAGING and "TOK" in err.getvalue() and out.getvalue() == ""
    with pytest.raises(ValueError, match="secret_env"):
        _launch_spec(secret_env="TOK")
