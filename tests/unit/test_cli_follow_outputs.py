"""``berth submit --follow`` / ``--dry-run`` and ``berth outputs`` against a fake API: what they print,
the exit codes of a job's end, and that ``--get`` never writes outside its directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from berth_tools.cli import follow, jobs_cmd, outputs_cmd
from berth_tools.cli.main import app


class FakeApi:
    """A job that goes QUEUED -> RUNNING -> ``end``, printing two lines of output."""

    def __init__(self, end: str = "COMPLETED") -> None:
        self.end = end
        self.gets = 0
        self.submitted: list[dict[str, Any]] = []
        self.planned: list[dict[str, Any]] = []

    def _status(self) -> str:
        return "QUEUED" if self.gets < 2 else ("RUNNING" if self.gets < 4 else self.end)

    def submit(self, spec: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        self.submitted.append(spec)
        return {"id": "j-1", "status": "QUEUED", "reason": "queued"}

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.planned.append(spec)
        return {
            "name": spec["name"],
            "tasks": 1,
            "outcome": "pending",
            "summary": "cloud: waits for on-prem before bursting (policy.burst); may burst in 10 min",
            "hourly_usd": 3.06,
            "limits": {
                "max_cost_usd": 5.0,
                "max_hourly_usd": None,
                "timeout_minutes": 60,
                "monthly_cloud_budget_usd": None,
                "cloud_budget_left_usd": None,
            },
            "explanation": {
                "candidates": [
                    {
                        "site": "cloud:us-east-1/p3.2xlarge/us-east-1a",
                        "eligible": True,
                        "rule": None,
                        "message": "eligible at 3.06 USD/h (on-demand)",
                    }
                ]
            },
            "policy_version": 0,
            "offers_version": 0,
            "stored": False,
        }

    def get(self, job_id: str) -> dict[str, Any]:
        self.gets += 1
        return {"id": job_id, "status": self._status(), "reason": f"now {self._status()}"}

    def events(self, job_id: str) -> dict[str, Any]:
        seq = ["QUEUED", "STARTING", "RUNNING", self.end]
        now = self._status()
        shown = seq[: seq.index(now) + 1] if now != "QUEUED" else seq[:1]
        return {
            "events": [
                {"at": f"t{i}", "from": None if i == 0 else shown[i - 1], "to": s, "reason": f"to {s}"}
                for i, s in enumerate(shown)
            ]
        }

    def logs(
        self, job_id: str, attempt: Any = None, since: Any = None, limit: Any = None, next_token: Any = None
    ) -> Any:
        if next_token is None:
            return {
                "events": [{"message": "epoch 1\n"}, {"message": "\x1b[2Jdone\n"}],
                "next_token": "t1",
                "attempt": 1,
                "attempts": 1,
                "status": "RUNNING",
            }
        self.gets = max(self.gets, 4)
        return {"events": [], "next_token": "t1", "attempt": 1, "attempts": 1, "status": self.end}


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text("name: demo\nimage: python:3.11-slim\ncommand: [python3, -c, 'print(1)']\n")
    return path


def _run(monkeypatch: pytest.MonkeyPatch, fake: FakeApi, *args: str) -> Any:
    monkeypatch.setattr(jobs_cmd, "client_for", lambda _url, _profile: fake)
    monkeypatch.setattr(follow.time, "sleep", lambda _s: None)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.mark.parametrize(("end", "code"), [("COMPLETED", 0), ("FAILED", 10), ("CANCELED", 11)])
def test_follow_prints_events_then_output_and_exits_with_the_jobs_end(
    monkeypatch: pytest.MonkeyPatch, spec_file: Path, end: str, code: int
) -> None:
    result = _run(monkeypatch, FakeApi(end), "submit", "-f", str(spec_file), "--follow")
    assert result.exit_code == code, result.output
    out = result.output
    assert out.index("QUEUED") < out.index("-> RUNNING") < out.index("epoch 1") < out.index(f"ended {end}")
    assert "\\x1b[2Jdone" in out and "\x1b[2J" not in out  # job output cannot drive the terminal


def test_follow_json_is_one_object_per_line(monkeypatch: pytest.MonkeyPatch, spec_file: Path) -> None:
    result = _run(monkeypatch, FakeApi(), "submit", "-f", str(spec_file), "--follow", "-o", "json")
    assert result.exit_code == 0, result.output
    kinds = [json.loads(line)["type"] for line in result.stdout.splitlines()]
    assert kinds[0] == "event" and "log" in kinds and kinds[-1] == "job"


def test_dry_run_shows_the_plan_and_submits_nothing(monkeypatch: pytest.MonkeyPatch, spec_file: Path) -> None:
    fake = FakeApi()
    result = _run(monkeypatch, fake, "submit", "-f", str(spec_file), "--dry-run")
    assert result.exit_code == 0, result.output
    assert fake.submitted == [] and fake.planned[0]["name"] == "demo"
    shown = " ".join(result.output.split())  # rich wraps to the terminal's width
    for text in ("nothing was submitted", "may burst in 10 min", "3.06 USD/h", "5.00 USD (max_cost_usd)"):
        assert text in shown, result.output


def test_an_array_followed_exits_as_its_worst_task() -> None:
    done = {"array": {"size": 3, "counts": {"COMPLETED": 2, "FAILED": 1}}}
    assert follow.array_exit(done) == 10
    assert follow.array_exit({"array": {"size": 2, "counts": {"COMPLETED": 2}}}) == 0


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../b", "", "a//b", "./a"])
def test_get_refuses_paths_outside_its_directory(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="outside"):
        outputs_cmd.local_path(tmp_path, bad)
    assert outputs_cmd.local_path(tmp_path, "outputs/model.pt") == tmp_path / "outputs" / "model.pt"


class FakeOutputs:
    def __init__(self) -> None:
        self.calls: list[str | None] = []

    def outputs(self, job_id: str, limit: int | None = None, next_token: str | None = None) -> Any:
        self.calls.append(next_token)
        page = {
            "job_id": job_id,
            "location": "s3://data/vision/jobs/j-1/",
            "outputs": "s3://data/vision/jobs/j-1/outputs/",
            "checkpoints": "s3://data/vision/jobs/j-1/checkpoints/",
            "url_expires_in_s": 900,
        }
        if next_token is None:
            return {**page, "objects": [_obj("outputs/a.txt")], "next_token": "outputs/a.txt"}
        return {**page, "objects": [_obj("outputs/b.txt")], "next_token": None}


def _obj(path: str) -> dict[str, Any]:
    return {
        "key": "vision/jobs/j-1/" + path,
        "path": path,
        "size": 1,
        "last_modified": "2026-12-03T00:00:00+00:00",
        "url": "http://example.invalid/" + path,
    }


def test_outputs_lists_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeOutputs()
    monkeypatch.setattr(outputs_cmd, "client_for", lambda _url, _profile: fake)
    result = CliRunner().invoke(app, ["outputs", "j-1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert fake.calls == [None, "outputs/a.txt"]
    assert "outputs/a.txt" in result.output and "outputs/b.txt" in result.output
    assert "s3://data/vision/jobs/j-1/checkpoints/" in result.output
