"""From a claim to a ``Launch``: the glue a daemon loop calls between ``claim`` and ``executor.start``.

::

    claim = Claim.parse(api.claim(job_id, attempt, token))        # the spec re-validated here
    gpus = claim.check_gpus(inventory)                             # only this host's healthy GPUs
    dirs = JobDirs.create(config.work_dir, claim.job_id, claim.attempt)
    mounts = data_mounts(claim.spec, config.datasets, dirs, stage_s3=...)   # StagingError -> "staging"
    launch = build_launch(claim, config, dirs, mounts, gpu_uuids=gpus, credentials=..., secrets=...)

The spec is validated again with the control plane's own ``JobSpec`` (the agent trusts the API, but
the host enforces what it runs: unknown fields, reserved env names and ``..`` paths are refused
here too). A raw host path as a data source is accepted only inside a registered dataset root.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from berth.domain.agent_wire import ClaimAnswer
from berth.domain.job_spec import JobSpec
from berth_agent.config import AgentConfig
from berth_agent.executors.base import Launch, Limits, Mount, Rendezvous
from berth_agent.gpus import Inventory
from berth_agent.staging import JobDirs, StagingError, resolve_dataset


class ClaimError(Exception):
    """The claim cannot be run on this host (bad spec, GPUs not ours); report ``agent_error``."""


@dataclass(frozen=True, slots=True)
class Claim:
    job_id: str
    attempt: int
    tenant: str
    spec: JobSpec
    gpu_ids: tuple[str, ...]
    rank: int = 0
    world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    #: The attempt's first scoped credentials, when the claim's answer carried them (the
    #: ``/v1/agent/credentials`` answer's shape); None: ask for them.
    credentials: Mapping[str, str] | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, payload: Mapping[str, Any]) -> Claim:
        try:
            answer = ClaimAnswer.model_validate(payload)  # the model the control plane wrote it with
        except (TypeError, ValueError, ValidationError) as exc:
            raise ClaimError(f"claim is not valid: {exc}") from exc
        claim = cls(
            job_id=answer.job_id,
            attempt=answer.attempt,
            tenant=answer.tenant,
            spec=answer.spec,
            gpu_ids=answer.gpu_ids,
            rank=answer.rank,
            world_size=answer.world_size,
            master_addr=answer.master_addr,
            master_port=answer.master_port,
            credentials=None if answer.credentials is None else answer.credentials.wire(),
        )
        if claim.spec.image is None and claim.spec.code is None:
            raise ClaimError("the job has neither image nor code")
        if not claim.spec.command:
            raise ClaimError("the job has no command")
        return claim

    def check_gpus(self, inventory: Inventory) -> tuple[str, ...]:
        """The claim's GPUs, proven to be this host's healthy devices, as many as one node needs."""
        healthy = set(inventory.healthy_uuids)
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ClaimError("the claim lists a GPU twice")
        foreign = [g for g in self.gpu_ids if g not in healthy]
        if foreign:
            raise ClaimError(f"GPUs {foreign} are not healthy GPUs of this host")
        res = self.spec.resources
        per_node = res.gpus // res.nodes
        if len(self.gpu_ids) != per_node:
            raise ClaimError(
                f"the claim gives {len(self.gpu_ids)} GPUs; one node of this job needs {per_node}"
            )
        return self.gpu_ids

    def rendezvous(self) -> Rendezvous | None:
        if self.world_size <= 1:
            return None
        if not self.master_addr or self.master_port is None:
            raise ClaimError("a multi-node claim needs master_addr and master_port")
        try:
            return Rendezvous(self.master_addr, self.master_port, self.world_size, self.rank)
        except ValueError as exc:
            raise ClaimError(str(exc)) from exc


def resolve_host_path(path: str, roots: Mapping[str, Path]) -> Path:
    """A raw ``/host/path`` data source, accepted only when its real path lies in a registered root."""
    real = Path(os.path.realpath(path))
    for root in roots.values():
        if real.is_relative_to(os.path.realpath(root)):
            if not real.exists():
                raise StagingError(f"{path} does not exist on this host")
            return real
    raise StagingError(f"{path} is not inside a dataset root registered on this host")


#: Stages an ``s3://`` source under the given directory (through the object cache, with the
#: attempt's credentials) and returns the path to mount.
StageS3 = Callable[[str, Path], Path]


def data_mounts(
    spec: JobSpec, roots: Mapping[str, Path], dirs: JobDirs, *, stage_s3: StageS3 | None = None
) -> tuple[Mount, ...]:
    mounts = []
    for i, item in enumerate(spec.data):
        if item.source.startswith("dataset://"):
            source = resolve_dataset(item.source, roots)
        elif item.source.startswith("s3://"):
            if stage_s3 is None:
                raise StagingError(f"{item.source}: this host stages no S3 data")
            source = stage_s3(item.source, dirs.base / "data" / str(i))
        else:
            source = resolve_host_path(item.source, roots)
        mounts.append(Mount(source=source, target=item.mount, read_only=True))
    return tuple(mounts)


def build_launch(
    claim: Claim,
    config: AgentConfig,
    dirs: JobDirs,
    mounts: tuple[Mount, ...],
    *,
    gpu_uuids: tuple[str, ...],
    credentials: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> Launch:
    spec, lim = claim.spec, config.limits
    return Launch(
        job_id=claim.job_id,
        attempt=claim.attempt,
        tenant=claim.tenant,
        command=tuple(spec.command),
        workdir=dirs.work,
        env=dict(spec.env),
        gpu_uuids=gpu_uuids,
        timeout_s=spec.timeout_minutes * 60.0,
        image=spec.image,
        mounts=mounts,
        output_dir=dirs.outputs,
        checkpoint_dir=dirs.checkpoints,
        credentials=dict(credentials or {}),
        secrets=dict(secrets or {}),
        rendezvous=claim.rendezvous(),
        array_env={} if spec.array_task is None else spec.array_task.env(),
        limits=Limits(
            cpus=spec.resources.cpu,
            memory_gib=spec.resources.memory_gib,
            address_space_bytes=None
            if lim.address_space_gib is None
            else int(lim.address_space_gib * 1024**3),
            nofile=lim.nofile,
            cpu_seconds=lim.cpu_seconds,
        ),
    )
