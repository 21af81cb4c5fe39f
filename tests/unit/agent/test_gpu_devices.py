"""GPU device rules for process jobs (berth_agent.gpu_devices): a job opens only its own GPUs' nodes.

The rules are unit-tested on a fake cgroup tree, and enforced for real where this machine has a
writable cgroup v1 devices hierarchy and runs the tests as root: two character devices of the NVIDIA
major are made with mknod, and a job given one of the two GPUs is refused the other's node by the
kernel (EPERM), whatever CUDA_VISIBLE_DEVICES says.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from berth_agent import gpu_devices, isolation
from berth_agent.config import ExecutorKind
from berth_agent.executors import FailureKind, Launch, ProcessExecutor, StartError
from berth_agent.gpu_devices import NVIDIA_MAJOR, DeviceRules, deny_rules, detect, own_devices_cgroup
from tests.unit.agent.test_process_executor import Lines


def test_deny_rules_close_each_other_gpu_for_read_write_and_mknod() -> None:
    assert deny_rules([3, 1, 3]) == [f"c {NVIDIA_MAJOR}:1 rwm", f"c {NVIDIA_MAJOR}:3 rwm"]
    assert deny_rules([]) == []


def test_own_devices_cgroup_is_read_from_the_v1_line(tmp_path: Path) -> None:
    f = tmp_path / "cgroup"
    f.write_text("6:freezer:/\n5:devices:/system.slice/berth-agent.service\n0::/\n")
    assert own_devices_cgroup(f) == "/system.slice/berth-agent.service"
    f.write_text("0::/system.slice/berth-agent.service\n")
    assert own_devices_cgroup(f) is None
    assert own_devices_cgroup(tmp_path / "absent") is None


def test_an_attempt_s_group_denies_every_gpu_of_the_host_but_its_own(tmp_path: Path) -> None:
    rules = DeviceRules(tmp_path, {"GPU-a": 0, "GPU-b": 1, "GPU-c": 2, "GPU-d": 3})
    group = rules.create("berth-j-1-1", ["GPU-b", "GPU-d"])
    assert group.path == tmp_path / "berth-j-1-1"
    # each write to devices.deny is one rule (the fake file keeps only the last): record them
    written: list[str] = []
    real_write = gpu_devices._write

    def record(path: Path, value: str) -> None:
        written.append(value)
        real_write(path, value)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu_devices, "_write", record)
        rules.create("berth-j-2-1", ["GPU-b", "GPU-d"])
    assert written == [f"c {NVIDIA_MAJOR}:0 rwm", f"c {NVIDIA_MAJOR}:2 rwm"]


def test_no_rules_without_minors_a_v1_hierarchy_or_when_off(tmp_path: Path) -> None:
    v1 = tmp_path / "devices"
    v1.mkdir()
    (v1 / "devices.deny").write_text("")
    assert detect({"GPU-a": 0}, enabled=False, v1_root=v1)[0] is None
    rules, why = detect({"GPU-sim-0": None}, v1_root=v1)
    assert rules is None and "minors are unknown" in why
    rules, why = detect({"GPU-a": 0}, v1_root=tmp_path / "unified")
    assert rules is None and "eBPF" in why
    assert detect({}, v1_root=v1)[0] is None


def test_a_host_that_cannot_write_its_rules_does_not_start_the_job(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    rules = DeviceRules(tmp_path / "no-such-dir" / "jobs", {"GPU-a": 0, "GPU-b": 1})
    executor = ProcessExecutor(device_rules=rules)
    launch = Launch("j-1", 1, "t", ("true",), work, gpu_uuids=("GPU-a",))
    with pytest.raises(StartError) as err:
        executor.start(launch, Lines())
    assert err.value.failure is FailureKind.AGENT_ERROR and "device rules" in str(err.value)


def test_isolation_is_enforced_for_process_jobs_only_with_device_rules() -> None:
    assert isolation.gpu_isolation(ExecutorKind.PROCESS)[0] == isolation.NONE
    level, why = isolation.gpu_isolation(ExecutorKind.PROCESS, device_rules=True)
    assert level == isolation.ENFORCED and "devices cgroup" in why


PROBE = """
import errno, json, os, sys
out = {}
for name in sys.argv[1:]:
    try:
        os.close(os.open(name, os.O_RDWR))
        out[name] = "opened"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out), flush=True)
"""


def _real_rules(minors: dict[str, int | None]) -> DeviceRules:
    if os.geteuid() != 0:
        pytest.skip("device nodes and cgroup v1 device rules need root")
    rules, why = detect(minors)
    if rules is None:
        pytest.skip(f"this machine takes no device rules: {why}")
    return rules


def test_the_kernel_refuses_a_job_the_device_node_of_a_gpu_it_was_not_given(tmp_path: Path) -> None:
    # minors no real driver uses: 195:254 is nvidia-modeset and 195:255 nvidiactl, so stay below
    mine, other = 240, 241
    rules = _real_rules({"GPU-mine": mine, "GPU-other": other})
    nodes = {}
    for uuid, minor in (("GPU-mine", mine), ("GPU-other", other)):
        node = tmp_path / f"nvidia{minor}"
        try:
            os.mknod(node, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))  # S_IFCHR
        except PermissionError:
            pytest.skip("this filesystem takes no device nodes")
        nodes[uuid] = str(node)
    work = tmp_path / "work"
    work.mkdir()
    executor = ProcessExecutor(device_rules=rules)
    out = Lines()
    launch = Launch(
        "j-dev",
        1,
        "t",
        ("python3", "-c", PROBE, nodes["GPU-mine"], nodes["GPU-other"]),
        work,
        gpu_uuids=("GPU-mine",),
        # what a hostile job would set: every GPU visible (the variable decides nothing here)
        env={},
    )
    run = executor.start(launch, out)
    result = run.wait(timeout=60)
    assert result is not None and result.exit_code == 0, out.lines
    (line,) = [text for stream, text in out.lines if stream == "stdout"]
    seen = json.loads(line)
    # the other GPU's node: refused by the device rules
    assert seen[nodes["GPU-other"]] == errno.errorcode[errno.EPERM], seen
    # its own: the rules let the open through to the (absent) driver, which has no such device
    assert seen[nodes["GPU-mine"]] != errno.errorcode[errno.EPERM], seen
    # the attempt's group is gone once the job ended
    assert not (rules.jobs / launch.name).exists()
    # outside a job's group the same node opens as far as the driver: the rule is the job's alone
    with pytest.raises(OSError) as direct:
        os.close(os.open(nodes["GPU-other"], os.O_RDWR))
    assert direct.value.errno != errno.EPERM
