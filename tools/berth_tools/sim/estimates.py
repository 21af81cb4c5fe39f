"""What the simulated service knows of run times: the estimate modes of ``berth sim``.

- ``predictor`` (default): what the service would know at each moment. A job's user estimate
  exists only if the trace has one or ``--estimate-noise SIGMA`` draws it: actual run time x
  exp(b_tenant + SIGMA x z_job), z_job ~ N(0, 1) seeded per job and b_tenant ~ N(0, SIGMA / 2)
  seeded per tenant (teams are consistently optimistic or pessimistic; that is what calibration
  learns). The run-time predictor learns only from jobs that finished earlier in the replay.
- ``oracle``: every job's true remaining run time is handed to the scheduler as its estimate and
  running jobs' true ends as known. The labelled upper bound of what estimates can buy.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from berth.domain.job_spec import SpotPolicy
from berth.scheduler.predictor import RuntimePredictor
from berth.scheduler.snapshot import PendingJob
from berth_tools.sim.records import SimJob, SimState
from berth_tools.sim.trace import TraceJob


class EstimateMode(StrEnum):
    PREDICTOR = "predictor"
    ORACLE = "oracle"


def _rng(*parts: object) -> random.Random:
    return random.Random(zlib.crc32(":".join(map(str, parts)).encode()))


@dataclass(slots=True)
class UserEstimates:
    """Seeded user estimates (seconds) of whole run times, or none without a noise model."""

    sigma: float | None
    seed: int = 0
    _bias: dict[str, float] = field(default_factory=dict)

    def estimate(self, job: TraceJob) -> float | None:
        if self.sigma is None:
            return None
        bias = self._bias.get(job.tenant)
        if bias is None:
            bias = self._bias[job.tenant] = _rng(self.seed, "tenant", job.tenant).gauss(0.0, self.sigma / 2.0)
        z = _rng(self.seed, "job", job.job_id).gauss(0.0, 1.0)
        return max(60.0, job.duration_s * math.exp(bias + self.sigma * z))


def relative_errors(pairs: list[tuple[float, float]]) -> list[float]:
    """|predicted - actual| / actual for (predicted, actual) pairs with a positive actual."""
    return [abs(p - a) / a for p, a in pairs if a > 0]


class ServiceKnowledge:
    """What the scheduler is told about run times, per estimate mode: the records handed to the
    core, the predictor (learning only from finished jobs) and its error at submission."""

    def __init__(
        self, mode: EstimateMode, timeout_s: float | None, checkpoint_interval_s: float | None
    ) -> None:
        self.mode = mode
        self.oracle = mode is EstimateMode.ORACLE
        self.predictor = None if self.oracle else RuntimePredictor()
        self.timeout_s = timeout_s
        self.ckpt = checkpoint_interval_s

    def pending_job(self, job: SimJob) -> PendingJob:
        t = job.trace
        # The oracle hands over the true remaining work; the service knows the user's estimate of
        # the whole run and the progress saved by checkpoints.
        return PendingJob(
            job_id=t.job_id,
            tenant=t.tenant,
            gpu_type=t.gpu_type,
            gpus=t.gpus,
            submitted_at=t.submit_s,
            nodes=job.nodes,
            cpu=job.cpu,
            memory_gib=job.memory_gib,
            spot=SpotPolicy.ALLOWED,
            checkpointing=self.ckpt is not None,
            family=t.model,
            timeout_s=self.timeout_s,
            expected_duration_s=job.remaining_s if self.oracle else job.estimate_s,
            progress_s=0.0 if self.oracle else job.progress_s,
        )

    def running_fields(self, job: SimJob, end: float) -> dict[str, Any]:
        """A running job's record: only the oracle knows when it will end; the service predicts."""
        return {
            "checkpointing": self.ckpt is not None,
            "checkpoint_interval_s": self.ckpt,
            "expected_end_at": end if self.oracle else None,
            "family": job.trace.model,
            "expected_duration_s": None if self.oracle else job.estimate_s,
            "timeout_s": self.timeout_s,
            "progress_s": job.progress_s,
        }

    def predict_at_submit(self, job: SimJob) -> None:
        """The median run time the service predicts when the job is submitted (for the error)."""
        t = job.trace
        if self.predictor is None:
            job.predicted_s = t.duration_s
            return
        rt = self.predictor.predict(t.tenant, t.model, t.gpu_type, t.gpus, job.estimate_s, self.timeout_s)
        job.predicted_s = None if rt is None else rt.quantile(0.5)

    def learn(self, job: SimJob, state: SimState) -> None:
        t = job.trace
        if job.predicted_s is not None:
            state.predictions.append((job.predicted_s, t.duration_s))
        if self.predictor is not None:
            self.predictor.observe(t.tenant, t.model, t.gpu_type, t.gpus, t.duration_s, job.estimate_s)
