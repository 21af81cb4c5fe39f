"""Domain errors. Each carries a stable machine-readable code; the API maps them to HTTP statuses."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code = "Error"

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidRequest(DomainError):
    """Malformed input (bad JSON, bad query parameter, bad token)."""

    code = "BadRequest"


class PayloadTooLarge(InvalidRequest):
    code = "PayloadTooLarge"


class UnsupportedMediaType(InvalidRequest):
    """A request body in a content type the API does not take (it takes JSON only)."""

    code = "UnsupportedMediaType"


class ValidationFailed(DomainError):
    """Well-formed input that breaks the schema or a rule."""

    code = "ValidationError"


class Unauthenticated(DomainError):
    code = "Unauthenticated"


class Forbidden(DomainError):
    code = "Forbidden"


class NotFound(DomainError):
    code = "NotFound"


class Conflict(DomainError):
    """A conditional write lost a race, or the request clashes with the current state."""

    code = "Conflict"


class IllegalTransition(Conflict):
    code = "IllegalTransition"


class IdempotencyMismatch(Conflict):
    code = "IdempotencyKeyReused"


class AlreadySubmitted(Conflict):
    """The store already holds a job created under this idempotency claim (raised by the repository,
    resolved by the job service into the existing job or an IdempotencyMismatch)."""

    code = "AlreadySubmitted"

    def __init__(self, job_id: str, fingerprint: str) -> None:
        super().__init__(f"job {job_id} was already submitted with this Idempotency-Key")
        self.job_id = job_id
        self.fingerprint = fingerprint


class QuotaExceeded(DomainError):
    code = "QuotaExceeded"


class RateLimited(DomainError):
    """The caller's tenant sent more requests than its rate limit allows; retry after a while."""

    code = "TooManyRequests"

    def __init__(self, message: str, *, retry_after_s: int, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


class RequestInProgress(DomainError):
    """The same idempotent request is being processed right now; retry shortly."""

    code = "RequestInProgress"


class Infeasible(DomainError):
    """No site could ever run the job under the organisation's policy."""

    code = "Infeasible"


class StoreUnavailable(DomainError):
    """The state store failed in a way worth retrying (throttling, timeouts)."""

    code = "ServiceUnavailable"
