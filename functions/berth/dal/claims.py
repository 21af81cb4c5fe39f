"""Idempotency claims of keyed submits (a job's or an array's): the claim model and reading one back."""

from __future__ import annotations

from typing import Any

from berth.dal.errors import translated
from berth.domain.errors import StoreUnavailable


def configured_claims(Claim: Any) -> Any:
    """The claim model, or StoreUnavailable when no idempotency table is configured."""
    if Claim is None:
        raise StoreUnavailable("no idempotency table configured for keyed submits")
    return Claim


def read_claim(Claim: Any, key: str) -> tuple[str, str] | None:
    """The (job id, fingerprint) a claim holds, or None when there is none."""
    model = configured_claims(Claim)
    with translated("read idempotency claim"):
        try:
            row = model.get(key, consistent_read=True)
        except model.DoesNotExist:
            return None
    return str(row.job_id), str(row.fingerprint)
