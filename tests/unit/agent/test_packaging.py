"""The systemd unit and the installer: hardening present, `systemd-analyze verify` clean, config valid.

The verify and security checks need `systemd-analyze` (Debian: `apt-get install systemd`); they skip,
saying so, where it is absent. No systemd needs to be running.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from berth_agent.config import ExecutorKind, load

PACKAGING = Path(__file__).resolve().parents[3] / "agent" / "packaging"
UNIT = PACKAGING / "berth-agent.service"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)"
)


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_is_hardened() -> None:
    d = _directives(UNIT.read_text())
    expect = {
        "Type": "notify",
        "User": "berth-agent",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "KillMode": "mixed",
        "RestrictSUIDSGID": "yes",
        "CapabilityBoundingSet": "",
        "DevicePolicy": "closed",
    }
    for key, value in expect.items():
        assert d.get(key) == [value], key
    assert (
        "/var/lib/berth-agent" in d["ReadWritePaths"][0]
        and "/var/cache/berth-agent" in d["ReadWritePaths"][0]
    )
    assert set(d["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert d["SystemCallFilter"][0] == "@system-service" and d["SystemCallFilter"][1].startswith("~@mount")
    assert int(d["WatchdogSec"][0]) > 0
    assert int(d["TimeoutStopSec"][0]) > 3600  # the default drain timeout plus a margin
    assert "MemoryDenyWriteExecute" not in d  # jobs inherit it, and JITs need W+X


def _install(tmp_path: Path, executor: str, *extra: str) -> Path:
    root = tmp_path / "root"
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    exe = prefix / "bin" / "berth-agent"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    args = ["--api-url", "https://api.example.com", "--pool", "lab-a", "--host-id", "gpu-01"]
    args += ["--region", "eu-west-1", "--artifacts-bucket", "berth-art", "--data-bucket", "berth-data"]
    subprocess.run(
        ["sh", str(PACKAGING / "install.sh"), *args, "--executor", executor, "--prefix", str(prefix), *extra],
        check=True,
        env={**os.environ, "ROOT": str(root)},
        capture_output=True,
    )
    return root


@pytest.mark.parametrize("executor", [e.value for e in ExecutorKind])
def test_installer_writes_a_valid_config_and_keeps_an_existing_one(tmp_path: Path, executor: str) -> None:
    root = _install(tmp_path, executor)
    config = root / "etc" / "berth-agent" / "config.yaml"
    cfg = load(config, environ={})
    assert (cfg.pool, cfg.host_id, cfg.executor.value) == ("lab-a", "gpu-01", executor)
    assert (cfg.region, cfg.artifacts_bucket, cfg.data_bucket) == ("eu-west-1", "berth-art", "berth-data")
    assert config.stat().st_mode & 0o007 == 0
    config.write_text(config.read_text().replace("lab-a", "lab-z"))
    _install(tmp_path, executor)
    assert load(config, environ={}).pool == "lab-z"
    unit = (root / "etc" / "systemd" / "system" / "berth-agent.service").read_text()
    assert f"ExecStart={tmp_path / 'opt'}/bin/berth-agent" in unit


def test_installer_refuses_bad_arguments(tmp_path: Path) -> None:
    r = subprocess.run(
        ["sh", str(PACKAGING / "install.sh"), "--api-url", "https://x", "--pool", "p", "--executor", "lxc"],
        env={**os.environ, "ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--executor" in r.stderr


@needs_analyze
@pytest.mark.parametrize("executor", [e.value for e in ExecutorKind])
def test_systemd_analyze_verify_accepts_the_unit_and_drop_in(tmp_path: Path, executor: str) -> None:
    units = _install(tmp_path, executor) / "etc" / "systemd" / "system"
    r = subprocess.run(
        [str(ANALYZE), "verify", str(units / "berth-agent.service")],
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 on unknown keys but prints them: any output about our files is a failure.
    assert r.returncode == 0, r.stderr
    assert "berth-agent" not in r.stdout + r.stderr, r.stdout + r.stderr


@needs_analyze
def test_systemd_security_exposure_is_low(tmp_path: Path) -> None:
    units = _install(tmp_path, "docker") / "etc" / "systemd" / "system"
    r = subprocess.run(
        [str(ANALYZE), "security", "--offline=yes", "--no-pager", str(units / "berth-agent.service")],
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for berth-agent.service: ([0-9.]+)", r.stdout + r.stderr)
    assert match is not None, r.stdout + r.stderr
    assert float(match.group(1)) <= 3.0
