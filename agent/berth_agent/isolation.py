"""Whether this host confines a job to the GPUs it was given, by executor (docs/security.md).

- ``docker``, ``podman``: the container sees only the attempt's devices (``--gpus device=<uuid>``,
  CDI ``--device nvidia.com/gpu=<uuid>``): **enforced**.
- ``kubernetes``: the NVIDIA device plugin gives the pod the GPUs of its ``nvidia.com/gpu`` limit:
  **enforced** (by the kubelet, not by the UUIDs Berth chose).
- ``process`` with device rules (``berth_agent.gpu_devices``: a cgroup v1 devices group per attempt
  that denies the other GPUs' device nodes): **enforced** by the kernel.
- ``process`` without them (cgroup v2, simulated GPUs, rules off): the job runs on the host with
  ``CUDA_VISIBLE_DEVICES`` naming its GPUs; CUDA honours the variable, but a job's own code can
  change it and open every device node: **none**. The agent
  says so at start, registers the host with the label ``berth/gpu-isolation: none`` (shown by
  ``berth capacity``), and a policy keeps untrusted tenants off such hosts by pool (a residency rule
  whose ``pools`` hold only enforcing hosts).
"""

from __future__ import annotations

from berth_agent.config import ExecutorKind

#: The inventory label every agent registers with.
LABEL = "berth/gpu-isolation"
ENFORCED = "enforced"
NONE = "none"


def gpu_isolation(executor: ExecutorKind, *, device_rules: bool = False) -> tuple[str, str]:
    """(``enforced`` or ``none``, why) for a host running ``executor`` (``device_rules``: the process
    executor writes each attempt's GPU device rules)."""
    if executor in (ExecutorKind.DOCKER, ExecutorKind.PODMAN):
        return ENFORCED, f"{executor.value} gives each container only its attempt's GPU devices"
    if executor is ExecutorKind.KUBERNETES:
        return ENFORCED, "the NVIDIA device plugin gives each pod only the GPUs it was allocated"
    if device_rules:
        return ENFORCED, "each process job's devices cgroup denies the device nodes of the host's other GPUs"
    return NONE, (
        "process jobs see their GPUs through CUDA_VISIBLE_DEVICES only: a job's own code can change it "
        "and reach every GPU of this host (no device rules: see why above); run untrusted tenants on "
        "container hosts (docs/security.md)"
    )
