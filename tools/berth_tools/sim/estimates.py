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
