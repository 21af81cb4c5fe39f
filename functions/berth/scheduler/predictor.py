"""Run-time prediction: what the scheduler believes about how long a job will run.

Pure and deterministic, learned online from jobs that *finished* (the caller feeds them in as
they end; nothing else is seen), with state small enough to keep in one store item.

Model. Run times are heavy-tailed, so everything is in log space. For each key level
(tenant; tenant and job family; tenant, family, GPU model and count) the predictor keeps the
count, mean and variance of log run time (Welford, with the count capped so old jobs fade).
A job's history estimate shrinks each level toward the one above it (a level with n jobs counts
n / (n + PRIOR_N) of its own mean), giving a lognormal (mu, sigma). The user's estimate,
multiplied by the tenant's calibration factor (the geometric mean of actual / estimate over its
finished jobs, shrunk toward 1), is a second lognormal whose sigma is the spread of that ratio.
The two are combined by precision (inverse variance). Quantiles of the lognormal, conditioned on
the work already done (a job that has run past its median gets a longer prediction), are what
the pass reads. With no history and no estimate the timeout is the prediction; with neither,
there is none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import NormalDist
from typing import Any

PRIOR_N = 2.0
"""Pseudo-jobs with which a level's mean is shrunk toward its parent's."""
MAX_N = 64.0
"""Cap on a level's count: later jobs keep a weight of at least 1/64 (drift is followed)."""
DEFAULT_SIGMA = 1.2
"""Spread of log run time (and of a tenant's log estimate error) before any history."""
CALIBRATION_PRIOR_N = 3.0
MIN_SIGMA = 0.05
_N01 = NormalDist()


class Source(StrEnum):
    HISTORY = "history"
    ESTIMATE = "estimate"
    BLEND = "history+estimate"
    TIMEOUT = "timeout"
    GIVEN = "given"
    """An exact run time handed in by the caller (the simulator's labelled oracle bound)."""


@dataclass(slots=True)
class LogStats:
    """Count, mean and sum of squared deviations of log values (Welford), count capped."""

    n: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        if self.n >= MAX_N:
            # Keep the mean and spread; forget one old observation's weight.
            self.m2 *= (self.n - 1.0) / self.n
            self.n -= 1.0
        self.n += 1.0
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def var(self) -> float | None:
        return self.m2 / (self.n - 1.0) if self.n >= 2 else None

    def to_list(self) -> list[float]:
        return [round(self.n, 6), round(self.mean, 9), round(self.m2, 9)]

    @classmethod
    def from_list(cls, v: list[float]) -> LogStats:
        return cls(float(v[0]), float(v[1]), float(v[2]))


@dataclass(slots=True, frozen=True)
class Runtime:
    """A predicted run time (seconds, of the whole job): lognormal ``mu``/``sigma`` of log seconds,
    its ``source`` and a ``confidence`` in [0, 1] (how much history backs it)."""

    mu: float
    sigma: float
    source: Source
    confidence: float
    cap_s: float | None = None
    """Never predict beyond this (the timeout: the job is stopped there)."""

    @classmethod
    def exact(cls, seconds: float) -> Runtime:
        return cls(math.log(max(seconds, 1.0)), 0.0, Source.GIVEN, 1.0)

    def quantile(self, q: float, done_s: float = 0.0) -> float:
        """The ``q`` quantile of the total run time given that ``done_s`` seconds of work are done."""
        if self.sigma <= 0.0:
            value = max(math.exp(self.mu), done_s)
        else:
            p_done = _N01.cdf((math.log(done_s) - self.mu) / self.sigma) if done_s > 1.0 else 0.0
            p = p_done + q * (1.0 - p_done)
            p = min(max(p, 1e-9), 1.0 - 1e-9)
            value = max(math.exp(self.mu + self.sigma * _N01.inv_cdf(p)), done_s)
        return min(value, self.cap_s) if self.cap_s is not None else value

    def remaining(self, q: float, done_s: float = 0.0) -> float:
        return max(0.0, self.quantile(q, done_s) - done_s)


@dataclass(slots=True)
class RuntimePredictor:
    """Online per-tenant run-time history and estimate calibration. ``observe`` is the only
    mutator; the scheduler only calls ``predict``."""

    levels: dict[tuple[str, ...], LogStats] = field(default_factory=dict)
    calibration: dict[str, LogStats] = field(default_factory=dict)
    """Per tenant: log(actual / estimate) over finished jobs that had an estimate."""
    observed: int = 0
    _memo: dict[tuple[object, ...], Runtime | None] = field(default_factory=dict, repr=False, compare=False)
    """Predictions since the last observation (a scheduler asks the same keys pass after pass)."""

    # ------------------------------------------------------------------ learning
    def observe(
        self, tenant: str, family: str, gpu_type: str, gpus: int, actual_s: float, estimate_s: float | None
    ) -> None:
        """A job finished after ``actual_s`` seconds of work; ``estimate_s`` is what its user said."""
        if actual_s <= 0:
            return
        self._memo.clear()
        x = math.log(max(actual_s, 1.0))
        for key in _keys(tenant, family, gpu_type, gpus):
            stats = self.levels.get(key)
            if stats is None:
                stats = self.levels[key] = LogStats()
            stats.add(x)
        if estimate_s is not None and estimate_s > 0:
            cal = self.calibration.get(tenant)
            if cal is None:
                cal = self.calibration[tenant] = LogStats()
            cal.add(x - math.log(max(estimate_s, 1.0)))
        self.observed += 1

    # ------------------------------------------------------------------ prediction
    def calibration_factor(self, tenant: str) -> float:
        """Multiply the tenant's estimates by this (1 with no history)."""
        return math.exp(self._calibration(tenant)[0])

    def _calibration(self, tenant: str) -> tuple[float, float]:
        cal = self.calibration.get(tenant)
        if cal is None or cal.n == 0:
            return 0.0, DEFAULT_SIGMA
        bias = cal.mean * cal.n / (cal.n + CALIBRATION_PRIOR_N)
        var = cal.var
        sd = DEFAULT_SIGMA if var is None else math.sqrt((var * cal.n + DEFAULT_SIGMA**2) / (cal.n + 1.0))
        return bias, max(sd, MIN_SIGMA)

    def _history(
        self, tenant: str, family: str, gpu_type: str, gpus: int
    ) -> tuple[float, float, float] | None:
        """(mu, sigma, confidence) from history, or None with no finished job of this tenant."""
        mu: float | None = None
        var = DEFAULT_SIGMA**2
        n_last = 0.0
        for key in _keys(tenant, family, gpu_type, gpus):
            stats = self.levels.get(key)
            if stats is None or stats.n == 0:
                break
            if mu is None:
                mu = stats.mean
            else:
                w = stats.n / (stats.n + PRIOR_N)
                mu = w * stats.mean + (1.0 - w) * mu
            if stats.var is not None:
                var = (stats.var * stats.n + var * PRIOR_N) / (stats.n + PRIOR_N)
            n_last = stats.n
        if mu is None:
            return None
        return mu, max(math.sqrt(var), MIN_SIGMA), n_last / (n_last + PRIOR_N)

    def predict(
        self,
        tenant: str,
        family: str,
        gpu_type: str,
        gpus: int,
        estimate_s: float | None,
        timeout_s: float | None,
    ) -> Runtime | None:
        key = (tenant, family, gpu_type, gpus, estimate_s, timeout_s)
        hit = self._memo.get(key, self)
        if hit is not self:
            return hit  # type: ignore[return-value]
        rt = self._predict(tenant, family, gpu_type, gpus, estimate_s, timeout_s)
        self._memo[key] = rt
        return rt

    def _predict(
        self,
        tenant: str,
        family: str,
        gpu_type: str,
        gpus: int,
        estimate_s: float | None,
        timeout_s: float | None,
    ) -> Runtime | None:
        hist = self._history(tenant, family, gpu_type, gpus)
        est: tuple[float, float] | None = None
        if estimate_s is not None and estimate_s > 0:
            bias, sd = self._calibration(tenant)
            est = (math.log(max(estimate_s, 1.0)) + bias, sd)
        if hist is None and est is None:
            return fallback_runtime(None, timeout_s)
        if hist is None:
            assert est is not None
            return Runtime(est[0], est[1], Source.ESTIMATE, 0.0, timeout_s)
        mu_h, sd_h, conf = hist
        if est is None:
            return Runtime(mu_h, sd_h, Source.HISTORY, conf, timeout_s)
        ph, pe = 1.0 / sd_h**2, 1.0 / est[1] ** 2
        mu = (mu_h * ph + est[0] * pe) / (ph + pe)
        return Runtime(mu, math.sqrt(1.0 / (ph + pe)), Source.BLEND, conf, timeout_s)

    # ------------------------------------------------------------------ state
    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": [["\x1f".join(k), v.to_list()] for k, v in sorted(self.levels.items())],
            "calibration": {t: v.to_list() for t, v in sorted(self.calibration.items())},
            "observed": self.observed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimePredictor:
        return cls(
            levels={tuple(str(k).split("\x1f")): LogStats.from_list(v) for k, v in data.get("levels", [])},
            calibration={str(t): LogStats.from_list(v) for t, v in dict(data.get("calibration", {})).items()},
            observed=int(data.get("observed", 0)),
        )


def _keys(tenant: str, family: str, gpu_type: str, gpus: int) -> tuple[tuple[str, ...], ...]:
    """Levels from the broadest (the tenant) to the most specific."""
    return ((tenant,), (tenant, family), (tenant, family, gpu_type, str(gpus)))


def fallback_runtime(estimate_s: float | None, timeout_s: float | None) -> Runtime | None:
    """Without a predictor: the user's estimate as given, else the timeout, else nothing known."""
    if estimate_s is not None and estimate_s > 0:
        return Runtime(math.log(max(estimate_s, 1.0)), 0.0, Source.ESTIMATE, 0.0, timeout_s)
    if timeout_s is not None and timeout_s > 0:
        return Runtime(math.log(max(timeout_s, 1.0)), 0.0, Source.TIMEOUT, 0.0, timeout_s)
    return None
