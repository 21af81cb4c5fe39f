"""The idempotency claim a keyed submit writes in the same transaction as its job. Pure.

Powertools' idempotency record is written before the job and completed after it; a Lambda killed in
between (timeout, crash) leaves a record that expires and lets a retry run again. The claim, written
atomically with the job, is what makes that retry find the job instead of creating a second one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from berth.domain.job_spec import JobSpec


@dataclass(frozen=True, slots=True)
class SubmitClaim:
    key: str  # tenant-scoped digest of the Idempotency-Key
    fingerprint: str  # digest of the job spec: the same key with another spec is a conflict
    expires_at: datetime


def submit_claim(tenant: str, idempotency_key: str, spec: JobSpec, expires_at: datetime) -> SubmitClaim:
    key = hashlib.sha256(f"{tenant}\0{idempotency_key}".encode()).hexdigest()
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return SubmitClaim(key, hashlib.sha256(canonical.encode()).hexdigest(), expires_at)
