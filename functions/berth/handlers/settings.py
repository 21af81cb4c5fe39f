"""Runtime configuration of the control-plane Lambdas, read from the environment once."""

from __future__ import annotations

from functools import cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BERTH_", extra="ignore")

    jobs_table: str
    job_events_table: str
    tenants_table: str
    idempotency_table: str
    #: The on-prem fleet: hosts, their GPUs and the GPUs each running attempt holds.
    hosts_table: str
    #: Code bundles (bundles/<tenant>/sha256/<digest>.tar.gz) and tenant data (<tenant>/...).
    artifacts_bucket: str
    data_bucket: str
    #: Largest accepted request body; a job spec is small, anything bigger is refused before parsing.
    max_body_bytes: int = 64 * 1024
    idempotency_ttl_s: int = 24 * 3600
    #: Per-tenant request rate limit: at most this many requests per window, over all instances.
    rate_limit_requests: int = 50
    rate_limit_window_s: int = 1
    #: How long a pagination token stays valid.
    page_token_ttl_s: int = 3600
    #: How long the submit-time feasibility check reuses the fleet, policy and offers it read (static
    #: facts; explain and capacity always read afresh).
    feasibility_cache_s: float = 5.0


@cache
def settings() -> Settings:
    return Settings()  # values come from the environment
