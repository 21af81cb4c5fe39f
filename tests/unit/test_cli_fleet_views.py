"""``berth explain`` grouped by reason (``--all``: every candidate), placed and finished jobs in words;
``berth capacity`` shows draining and lost hosts; documents and reports without JSON in table mode."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from berth_tools.cli import fleet_cmd, output
from berth_tools.cli.explain_view import group_candidates, placement_text
from berth_tools.cli.main import app
from berth_tools.cli.tables import flatten

JOB = "j-01m8mqx5p4cmnjzq2zgpbtrdbm"
ONPREM_ONLY = "the job asks for placement: onprem"


def _cloud(i: int) -> dict[str, Any]:
    zone = "abcdef"[i % 6]
    return {
        "site": f"cloud:us-east-{1 + i // 30}/p3.{i}xlarge/us-east-1{zone}",
        "eligible": False,
        "rule": "placement",
        "message": ONPREM_ONLY,
        "hourly_usd": None,
        "chosen": False,
    }


def _pending(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "job_id": JOB,
        "tenant": "vision",
        "status": "QUEUED",
        "reason": "waiting for placement",
        "site": None,
        "placement": None,
        "outcome": "pending",
        "explanation": {
            "outcome": "pending",
            "summary": "no host with 8 free V100 GPUs",
            "fair_share": 0.25,
            "fair_share_rank": 1,
            "tenants": 2,
            "rules": ["capacity", "placement"],
            "candidates": candidates,
            "preempts": [],
            "not_considered": 0,
            "tenant_not_considered": 0,
        },
    }


CANDIDATES = [
    {
        "site": "onprem:lab/V100",
        "eligible": False,
        "rule": "capacity",
        "message": "no host with 8 free V100 GPUs (0 of 32 free, largest free block 0)",
        "hourly_usd": None,
        "chosen": False,
    },
    *(_cloud(i) for i in range(90)),
]


class FakeClient:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def explain(self, job_id: str) -> dict[str, Any]:
        return self.answer

    def capacity(self) -> dict[str, Any]:
        return self.answer

    def get_document(self, kind: str, version: int | None = None) -> dict[str, Any]:
        return self.answer


def _run(monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any], *args: str, width: int = 120) -> str:
    monkeypatch.setattr(fleet_cmd, "client_for", lambda api_url, profile: FakeClient(answer))
    monkeypatch.setattr(output.console, "_width", width)
    monkeypatch.setenv("COLUMNS", str(width))
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_groups_one_row_per_distinct_reason_with_its_count() -> None:
    groups = group_candidates(CANDIDATES)
    assert [(len(g.sites), g.rule) for g in groups] == [(90, "placement"), (1, "capacity")] or [
        (len(g.sites), g.rule) for g in groups
    ] == [(1, "capacity"), (90, "placement")]
    assert sum(len(g.sites) for g in groups) == len(CANDIDATES)


def test_the_chosen_and_eligible_groups_come_first_with_their_price_range() -> None:
    rows = [
        {
            "site": "cloud:a",
            "eligible": True,
            "rule": None,
            "message": "ok",
            "hourly_usd": 3.0,
            "chosen": False,
        },
        {
            "site": "cloud:b",
            "eligible": True,
            "rule": None,
            "message": "ok",
            "hourly_usd": 2.0,
            "chosen": False,
        },
        {
            "site": "cloud:c",
            "eligible": True,
            "rule": None,
            "message": "ok",
            "hourly_usd": 1.0,
            "chosen": True,
        },
        *CANDIDATES[:3],
    ]
    first, second, *_ = group_candidates(rows)
    assert first.chosen and first.sites == ["cloud:c"]
    assert second.eligible and sorted(second.prices) == [2.0, 3.0]


@pytest.mark.parametrize("width", [80, 120, 200])
def test_explain_prints_a_few_grouped_rows_not_ninety(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    out = _run(monkeypatch, _pending(CANDIDATES), "explain", JOB, width=width)
    assert out.count(ONPREM_ONLY) == 1
    assert "90" in next(line for line in out.splitlines() if ONPREM_ONLY in line)
    assert "91 candidate sites; --all lists each one" in out
    assert all(len(line) <= width for line in out.splitlines())
    assert JOB in out


def test_explain_all_lists_every_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(monkeypatch, _pending(CANDIDATES), "explain", JOB, "--all", width=200)
    assert out.count(ONPREM_ONLY) == 90
    assert "cloud:us-east-1/p3.0xlarge/us-east-1a" in out


def test_explain_of_a_placed_job_says_where_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    placement = {
        "site": "onprem",
        "pool": "lab",
        "gpu_type": "V100",
        "hosts": [{"host_id": "gpu-07", "gpus": 2, "gpu_ids": [0, 1]}],
        "hourly_usd": 2.0,
    }
    answer = {
        "job_id": JOB,
        "tenant": "vision",
        "status": "RUNNING",
        "reason": "running",
        "site": "onprem",
        "placement": placement,
        "outcome": "placed",
        "explanation": None,
    }
    out = _run(monkeypatch, answer, "explain", JOB)
    assert "{" not in out
    assert "placed: on-prem, pool lab, V100 on gpu-07 (2 GPUs: 0,1), 2.00 USD/h" in out


def test_explain_of_a_finished_job_says_how_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    placement = {
        "site": "cloud",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "queue": "berth-spot",
        "instance_type": "p3.2xlarge",
        "instances": 1,
        "gpu_type": "V100",
        "spot": True,
        "hourly_usd": 0.92,
    }
    answer = {
        "job_id": JOB,
        "tenant": "vision",
        "status": "COMPLETED",
        "reason": "exit 0",
        "site": "cloud",
        "placement": placement,
        "outcome": "finished",
        "explanation": None,
    }
    out = _run(monkeypatch, answer, "explain", JOB)
    assert "{" not in out and "finished (COMPLETED)" in out
    assert "cloud, us-east-1 (us-east-1a), 1 x p3.2xlarge (V100, spot), queue berth-spot, 0.92 USD/h" in out


def test_explain_of_a_job_the_pass_did_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {
        "job_id": JOB,
        "tenant": "vision",
        "status": "QUEUED",
        "reason": "waiting",
        "site": None,
        "placement": None,
        "outcome": "not-considered",
        "explanation": {
            "summary": "not considered this pass: behind the first 50",
            "not_considered": 3,
            "tenant_not_considered": 3,
            "tenant_read": 50,
        },
    }
    out = _run(monkeypatch, answer, "explain", JOB)
    assert "not-considered: not considered this pass: behind the first 50" in out


def test_placement_text_of_nothing() -> None:
    assert placement_text(None) == "not placed"


def _host(host_id: str, **kw: Any) -> dict[str, Any]:
    return {
        "host_id": host_id,
        "pool": "lab",
        "gpu_type": "V100",
        "gpus": 8,
        "free_gpus": 8,
        "alive": True,
        "healthy": True,
        "draining": False,
        "attempts": [],
        "labels": {},
        "containment": "cgroup-v2",
        "admitted_gpus": 8,
        **kw,
    }


def test_capacity_shows_draining_unhealthy_and_lost_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {
        "as_of": "now",
        "policy_version": 3,
        "totals": {"hosts": 4, "gpus": 32, "free_gpus": 8, "used_gpus": 0, "unavailable_gpus": 24},
        "pools": [
            {
                "pool": "lab",
                "hosts": 4,
                "healthy_hosts": 2,
                "models": {"V100": {"gpus": 32, "free_gpus": 8, "used_gpus": 0, "unavailable_gpus": 24}},
            }
        ],
        "hosts": [
            _host("ok-host"),
            _host("drain-host", draining=True),
            _host("sick-host", healthy=False),
            _host("gone-host", alive=False),
        ],
        "cloud": {
            "enabled": True,
            "offers_version": 0,
            "regions": [
                {
                    "region": "us-east-1",
                    "circuit": "closed",
                    "instance_types": [
                        {"instance_type": "p3.2xlarge", "gpu_type": "V100", "gpus": 1, "circuit": "open"}
                    ],
                }
            ],
        },
    }
    for width in (80, 200):
        out = _run(monkeypatch, answer, "capacity", width=width)

        def row(host: str, text: str = out) -> str:
            return next(line for line in text.splitlines() if host in line)

        assert "ok" in row("ok-host") and "draining" in row("drain-host")
        assert "unhealthy" in row("sick-host") and "lost" in row("gone-host")
        assert "p3.2xlarge=open" in out or width == 80
        assert all(len(line) <= width for line in out.splitlines())


def test_capacity_says_when_the_cloud_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {
        "as_of": "now",
        "policy_version": 0,
        "totals": {"hosts": 0, "gpus": 0, "free_gpus": 0, "used_gpus": 0, "unavailable_gpus": 0},
        "pools": [],
        "hosts": [],
        "cloud": {"enabled": False, "offers_version": 0, "regions": []},
    }
    assert "cloud: disabled" in _run(monkeypatch, answer, "capacity")


def test_offers_are_a_table_and_the_policy_is_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    offers = {
        "kind": "offers",
        "version": 2,
        "source": "stored",
        "updated_at": "t",
        "updated_by": "admin",
        "document": {
            "offers": [
                {
                    "region": "us-east-1",
                    "zone": "us-east-1a",
                    "instance_type": "p3.2xlarge",
                    "gpu_type": "V100",
                    "gpus": 1,
                    "vcpus": 8,
                    "memory_gib": 61,
                    "on_demand_usd_h": 3.06,
                    "spot_usd_h": 0.92,
                    "available": True,
                    "queue": "q",
                }
            ]
        },
    }
    out = _run(monkeypatch, offers, "offers")
    assert "{" not in out and "p3.2xlarge" in out and "3.06" in out
    policy = {
        "kind": "policy",
        "version": 0,
        "source": "default",
        "updated_at": None,
        "updated_by": None,
        "document": {"burst": {"min_wait_s": 600}, "rules": ["capacity"]},
    }
    out = _run(monkeypatch, policy, "policy")
    assert "{" not in out and "burst:\n  min_wait_s: 600" in out


def test_reports_flatten_nested_fields() -> None:
    rows = dict(
        flatten({"a": 1, "calls": {"sqs": 2, "ddb": {"get": 3}}, "l": [1, 2], "t": [{"x": 1}], "n": None})
    )
    assert rows == {"a": "1", "calls.sqs": "2", "calls.ddb.get": "3", "l": "1, 2", "t[0].x": "1", "n": "-"}
