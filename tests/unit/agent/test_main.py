"""The console script's wiring: configuration errors exit 2 with the field named; a full build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from berth_agent import main as agent_main
from berth_agent.daemon import Daemon


def test_bad_config_exits_2_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.yaml").write_text("api_url: http://x\npool: Bad Pool\nhost_id: h\n")
    monkeypatch.setenv("BERTH_AGENT_CONFIG", str(tmp_path / "c.yaml"))
    assert agent_main.main() == 2
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["level"] == "error" and "pool" in line["msg"]


def test_buckets_are_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.yaml").write_text("api_url: http://x\npool: p\nhost_id: h\n")
    monkeypatch.setenv("BERTH_AGENT_CONFIG", str(tmp_path / "c.yaml"))
    assert agent_main.main() == 2


def test_build_wires_a_daemon_from_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDHOST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    cfg = agent_main.agent_config.AgentConfig.model_validate(
        {
            "api_url": "http://127.0.0.1:1",
            "pool": "p",
            "host_id": "h1",
            "work_dir": str(tmp_path / "work"),
            "cache_dir": str(tmp_path / "cache"),
            "gpus": {"discovery": "simulated", "simulated": {"count": 2}},
            "artifacts_bucket": "a",
            "data_bucket": "d",
            "aws_endpoint_url": "http://127.0.0.1:1",
        }
    )
    daemon = agent_main.build(cfg)
    assert isinstance(daemon, Daemon) and daemon.inventory.healthy_uuids == ["GPU-sim-h1-0", "GPU-sim-h1-1"]
    queue = daemon.queue_for("http://127.0.0.1:1/q")
    assert queue.url == "http://127.0.0.1:1/q"  # type: ignore[attr-defined]
    assert daemon.host_facts["cpu"] >= 1 and daemon.host_facts["memory_gib"] >= 0
    # registered with the inventory, shown by ``berth capacity``: cgroup-v2 where the host delegates
    # a cgroup, process-group elsewhere (this test host: cgroup v1/hybrid)
    assert daemon.host_facts["containment"] == daemon.runner.executor.containment  # type: ignore[attr-defined]
    assert daemon.host_facts["containment"] in ("cgroup-v2", "process-group")
    assert daemon.health is None  # simulated GPUs without a faults file: nothing to watch
    faulty = cfg.model_copy(
        update={
            "gpus": cfg.gpus.model_copy(
                update={
                    "simulated": cfg.gpus.simulated.model_copy(
                        update={"faults_file": tmp_path / "gpu-faults.jsonl"}
                    )
                }
            )
        }
    )
    watched = agent_main.build(faulty)
    assert watched.health is not None and watched.health.source.path == tmp_path / "gpu-faults.jsonl"  # type: ignore[attr-defined]
